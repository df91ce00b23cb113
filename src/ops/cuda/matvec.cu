// A few rows times a dense matrix (plain definition and oracle: at::mm /
// at::addmm, in ops::linear of src/ops/linear.cpp). Decoding's products
// have one row per sequence: they only stream the matrix once, and the
// whole question is how close to the memory bus that stream runs.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4; // 16-byte loads of W a lane keeps in flight

// One warp per output o: lane l reads the 16-byte pieces l, l + 32, ... of
// W's row o, kUnroll at a time, and the matching pieces of each x row.
template <typename T>
__global__ void matvec_kernel(
    const T* __restrict__ x,
    const T* __restrict__ W,
    const T* __restrict__ bias,
    T* __restrict__ y,
    int N,
    int64_t out,
    int64_t in) {
  constexpr int kVec = 16 / sizeof(T); // values a piece holds
  const int lane = threadIdx.x % kWarp;
  const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (o >= out)
    return;
  const int64_t pieces = in / kVec;
  const uint4* wr = reinterpret_cast<const uint4*>(W + o * in);
  float acc[kMatvecMaxRows > 0 ? kMatvecMaxRows : 1];
#pragma unroll
  for (int n = 0; n < kMatvecMaxRows; ++n)
    acc[n] = 0.f;
  for (int64_t p0 = lane; p0 < pieces; p0 += kWarp * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + int64_t(u) * kWarp;
      wv[u] = p < pieces ? __ldg(wr + p) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + int64_t(u) * kWarp;
      if (p >= pieces)
        break;
      float w[kVec];
      unpack16<T>(wv[u], w);
#pragma unroll
      for (int n = 0; n < kMatvecMaxRows; ++n) {
        if (n >= N)
          break;
        float xv[kVec];
        unpack16<T>(__ldg(reinterpret_cast<const uint4*>(x + n * in) + p), xv);
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          acc[n] += xv[e] * w[e];
      }
    }
  }
  write_warp_sums<T>(acc, N, bias, y, out, o);
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
    matvec_kernel<T><<<blocks, kWarpsPerBlock * kWarp, 0, cudaStream_t(stream)>>>(
        static_cast<const T*>(x),
        static_cast<const T*>(W),
        static_cast<const T*>(bias),
        static_cast<T*>(y),
        int(N),
        out,
        in);
    return int(cudaGetLastError());
  });
}

} // namespace orchard::ops::cuda
