// One row times a dense matrix (plain definition and oracle: at::mm /
// at::addmm, in ops::linear of src/ops/linear.cpp). Decoding's products
// have one row per sequence: they only stream the matrix once, and the
// whole question is how close to the memory bus that stream runs and how
// few kernels stand between two of them.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4; // 16-byte loads of W a lane keeps in flight
// (8 or 16, and 4 or 8 loaded one round ahead, were slower on an H100:
// fewer warps fit an SM; bench/RESULTS.md, 2026-11-27 (night)).

// Part `part` of `parts` of the warp's dot product of x with the row wr
// (pieces of 16 bytes): lane l of part j reads pieces 32 j + l, then every
// 32 * parts further, kUnroll at a time. The first pieces are loaded
// before the previous kernel has finished (launch_dependent): they are the
// weights, not its results.
template <typename T>
__device__ float row_dot(
    const T* x,
    const uint4* wr,
    int64_t pieces,
    int part,
    int parts) {
  constexpr int kVec = 16 / sizeof(T); // values a piece holds
  const int64_t stride = int64_t(kWarp) * parts;
  const int64_t first = int64_t(kWarp) * part + threadIdx.x % kWarp;
  uint4 wv[kUnroll];
  auto load = [&](int64_t p0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * stride;
      wv[u] = p < pieces ? __ldg(wr + p) : make_uint4(0, 0, 0, 0);
    }
  };
  load(first);
  wait_for_previous_kernels();
  let_next_kernel_start();
  float acc = 0.f;
  for (int64_t p0 = first; p0 < pieces; p0 += stride * kUnroll) {
    if (p0 != first)
      load(p0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * stride;
      if (p >= pieces)
        break;
      float w[kVec], xv[kVec];
      unpack16<T>(wv[u], w);
      unpack16<T>(__ldg(reinterpret_cast<const uint4*>(x) + p), xv);
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        acc += xv[e] * w[e];
    }
  }
  return warp_sum(acc);
}

// `parts` warps per output o (1, 2, 4 or 8), each summing its share of the
// row; the block adds the shares in a fixed order.
template <typename T>
__global__ void matvec_kernel(
    const T* __restrict__ x,
    const T* __restrict__ W,
    const T* __restrict__ bias,
    T* __restrict__ y,
    int64_t out,
    int64_t in,
    int parts) {
  __shared__ float shares[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarp, part = warp % parts;
  const int64_t o =
      int64_t(blockIdx.x) * (kWarpsPerBlock / parts) + warp / parts;
  float s = 0.f;
  if (o < out) {
    const uint4* row = reinterpret_cast<const uint4*>(W + o * in);
    s = row_dot(x, row, in / (16 / sizeof(T)), part, parts);
  }
  if (parts > 1) {
    if (threadIdx.x % kWarp == 0)
      shares[warp] = s;
    __syncthreads();
  }
  if (o >= out || part != 0 || threadIdx.x % kWarp != 0)
    return;
  float sum = s;
  for (int j = 1; j < parts; ++j)
    sum += shares[warp + j];
  y[o] = from_float<T>(bias ? sum + to_float(bias[o]) : sum);
}

// Warps per output: products with few outputs (down and qkv of a 3B
// model) leave an H100's SMs short of warps with one warp a row, each warp
// then streaming a long row one round trip at a time. Split until about
// 8192 warps run (16384 measured the same), while each part keeps 128
// pieces (2 KB) or more. On the H100, the 3B shape's down went from 2.0 to
// 2.5 TB/s, the 0.5B shape's step from 1.363 to 1.308 ms
// (bench/RESULTS.md, 2026-11-27 (night)).
int parts_for(int64_t out, int64_t pieces) {
  constexpr int64_t kTargetWarps = 8192;
  int parts = 1;
  while (parts < kWarpsPerBlock && out * parts < kTargetWarps &&
         pieces / (2 * parts) >= 128)
    parts *= 2;
  return parts;
}

} // namespace

int matvec(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream) {
  if (N == 0 || out == 0)
    return 0;
  if (N > kMatvecMaxRows)
    return int(cudaErrorInvalidValue);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kVec = 16 / sizeof(T);
    if (in % kVec != 0)
      return int(cudaErrorInvalidValue);
    const int parts = parts_for(out, in / kVec);
    const int rows = kWarpsPerBlock / parts; // outputs a block computes
    return launch_dependent(
        matvec_kernel<T>,
        dim3(unsigned((out + rows - 1) / rows)),
        dim3(kWarpsPerBlock * kWarp),
        cudaStream_t(stream),
        static_cast<const T*>(x),
        static_cast<const T*>(W),
        static_cast<const T*>(bias),
        static_cast<T*>(y),
        out,
        in,
        parts);
  });
}

} // namespace orchard::ops::cuda
