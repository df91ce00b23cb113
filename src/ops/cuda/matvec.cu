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

// The warp's dot product of x with the row wr (pieces of 16 bytes), every
// lane getting it: lane l reads pieces l, l + 32, ..., kUnroll at a time.
// The first pieces of the row are loaded before the previous kernel has
// finished (launch_dependent): they are the weights, not its results.
template <typename T>
__device__ float row_dot(const T* x, const uint4* wr, int64_t pieces) {
  constexpr int kVec = 16 / sizeof(T); // values a piece holds
  const int lane = threadIdx.x % kWarp;
  uint4 wv[kUnroll];
  auto load = [&](int64_t p0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + int64_t(u) * kWarp;
      wv[u] = p < pieces ? __ldg(wr + p) : make_uint4(0, 0, 0, 0);
    }
  };
  load(lane);
  wait_for_previous_kernels();
  let_next_kernel_start();
  float acc = 0.f;
  for (int64_t p0 = lane; p0 < pieces; p0 += kWarp * kUnroll) {
    if (p0 != lane)
      load(p0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + int64_t(u) * kWarp;
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

// One warp per output o.
template <typename T>
__global__ void matvec_kernel(
    const T* __restrict__ x,
    const T* __restrict__ W,
    const T* __restrict__ bias,
    T* __restrict__ y,
    int64_t out,
    int64_t in) {
  const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (o >= out)
    return;
  float s = row_dot(x, reinterpret_cast<const uint4*>(W + o * in), in / (16 / sizeof(T)));
  if (threadIdx.x % kWarp == 0)
    y[o] = from_float<T>(bias ? s + to_float(bias[o]) : s);
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
  const unsigned blocks = unsigned((out + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (in % (16 / sizeof(T)) != 0)
      return int(cudaErrorInvalidValue);
    return launch_dependent(
        matvec_kernel<T>,
        dim3(blocks),
        dim3(kWarpsPerBlock * kWarp),
        cudaStream_t(stream),
        static_cast<const T*>(x),
        static_cast<const T*>(W),
        static_cast<const T*>(bias),
        static_cast<T*>(y),
        out,
        in);
  });
}

} // namespace orchard::ops::cuda
