// A few rows times an NF4 matrix without expanding it (plain definition
// and oracle: ops::nf4_linear, which expands the whole matrix to the
// compute dtype, then multiplies: three times the matrix's bytes moved
// for each product, where this reads each 4-bit code once).
#include "ops/cuda/numeric.cuh"
#include "ops/nf4_levels.h"

namespace orchard::ops::cuda {
namespace {

// The NF4 levels (ops::nf4_levels, the QLoRA paper's table).
__constant__ float kLevels[16] = {ORCHARD_NF4_LEVELS};

constexpr int kWarpsPerBlock = 8;
constexpr int kPerLane = 32; // weights a lane expands per step (16 bytes)

// One warp per output o; lane l takes weights [s + 32 l, s + 32 l + 32) of
// each 1024-wide step s: 16 bytes of codes, within one 64-value absmax
// block. The 16 levels (rounded to T) sit in shared memory: a table in
// constant memory would serialise the lanes' differing indices.
template <typename T>
__global__ void nf4_matvec_kernel(
    const T* __restrict__ x,
    const uint8_t* __restrict__ codes,
    const T* __restrict__ absmax,
    T* __restrict__ y,
    int N,
    int64_t out,
    int64_t in) {
  __shared__ float level[16];
  if (threadIdx.x < 16)
    level[threadIdx.x] = round_to<T>(kLevels[threadIdx.x]);
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (o >= out)
    return;
  float acc[kNf4MaxRows];
#pragma unroll
  for (int n = 0; n < kNf4MaxRows; ++n)
    acc[n] = 0.f;
  const int64_t row = o * in, step = int64_t(kWarp) * kPerLane;
  // A lane's next 16 bytes of codes and their absmax, loaded one step
  // ahead; the first before the previous kernel has finished
  // (launch_dependent): they are the weights, not its results.
  uint4 packed = make_uint4(0, 0, 0, 0);
  float scale = 0.f;
  auto load = [&](int64_t i0) {
    if (i0 < in) {
      packed = __ldg(reinterpret_cast<const uint4*>(codes + (row + i0) / 2));
      scale = to_float(absmax[(row + i0) / 64]);
    }
  };
  load(int64_t(lane) * kPerLane);
  wait_for_previous_kernels();
  let_next_kernel_start();
  for (int64_t i0 = int64_t(lane) * kPerLane; i0 < in; i0 += step) {
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    float w[kPerLane];
#pragma unroll
    for (int byte = 0; byte < 16; ++byte) {
      const uint32_t c = (words[byte / 4] >> (8 * (byte % 4))) & 0xffu;
      // The level times absmax, rounded: what dequantize_nf4 computes in T.
      w[2 * byte] = round_to<T>(level[c >> 4] * scale);
      w[2 * byte + 1] = round_to<T>(level[c & 15u] * scale);
    }
    load(i0 + step);
#pragma unroll
    for (int n = 0; n < kNf4MaxRows; ++n) {
      if (n >= N)
        break;
      const T* xr = x + int64_t(n) * in + i0;
      constexpr int kVec = 16 / sizeof(T); // x values a 16-byte load holds
#pragma unroll
      for (int piece = 0; piece < kPerLane / kVec; ++piece) {
        float xv[kVec];
        unpack16<T>(__ldg(reinterpret_cast<const uint4*>(xr) + piece), xv);
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          acc[n] += xv[e] * w[piece * kVec + e];
      }
    }
  }
  write_warp_sums<T>(acc, N, static_cast<const T*>(nullptr), y, out, o);
}

} // namespace

int nf4_matvec(
    Dtype dtype,
    const void* x,
    const uint8_t* codes,
    const void* absmax,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream) {
  if (N == 0 || out == 0)
    return 0;
  if (N > kNf4MaxRows || in % 64 != 0)
    return int(cudaErrorInvalidValue);
  const unsigned blocks = unsigned((out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    return launch_dependent(
        nf4_matvec_kernel<T>,
        dim3(blocks),
        dim3(kWarpsPerBlock * kWarp),
        cudaStream_t(stream),
        static_cast<const T*>(x),
        codes,
        static_cast<const T*>(absmax),
        static_cast<T*>(y),
        int(N),
        out,
        in);
  });
}

} // namespace orchard::ops::cuda
