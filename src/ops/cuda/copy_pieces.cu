// ops::prepare_copies' kernel (ops/copy_pieces.h): a block a chunk of the
// table, each thread copying every blockDim-th value of it with the cast
// from the source's storage type to the destination's (through float32,
// rounding to nearest even as PyTorch's casts do). The pieces start at any
// value, so the loads are plain ones, coalesced within a warp.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

template <typename From, typename To>
__global__ void copy_pieces_kernel(const int64_t* __restrict__ table) {
  const int64_t* row = table + 3 * int64_t(blockIdx.x);
  const From* __restrict__ from = reinterpret_cast<const From*>(row[0]);
  To* __restrict__ to = reinterpret_cast<To*>(row[1]);
  const int64_t n = row[2];
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    to[i] = from_float<To>(to_float(from[i]));
}

} // namespace

int copy_pieces(
    const int64_t* table,
    int64_t chunks,
    Dtype from,
    Dtype to,
    void* stream) {
  if (chunks <= 0 || chunks > int64_t(0x7fffffff))
    return chunks == 0 ? 0 : int(cudaErrorInvalidValue);
  return dispatch(from, [&](auto f) {
    return dispatch(to, [&](auto t) {
      using From = decltype(f);
      using To = decltype(t);
      copy_pieces_kernel<From, To>
          <<<unsigned(chunks),
             kThreads,
             0,
             static_cast<cudaStream_t>(stream)>>>(table);
      return int(cudaGetLastError());
    });
  });
}

} // namespace orchard::ops::cuda
