// RMSNorm in one kernel (plain definition and oracle: ops::rms_norm_reference
// in src/ops/rms_norm.cpp). The plain one is eight kernels (cast, square,
// mean, add, rsqrt, multiply, cast, multiply), each a pass over the row;
// this is one pass to read x, one to write y. One block per row: the
// decoding step's rows are one token each (C = 896 to 8192).
#include "ops/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace orchard::ops::cuda {
namespace {

__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__half v) {
  return __half2float(v);
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
// Round to nearest even, as PyTorch's casts do.
template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

constexpr int kWarp = 32;

template <typename T>
__global__ void rms_norm_kernel(
    const T* __restrict__ x,
    const T* __restrict__ w,
    T* __restrict__ y,
    int64_t C,
    float eps) {
  const T* xr = x + int64_t(blockIdx.x) * C;
  T* yr = y + int64_t(blockIdx.x) * C;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float v = to_float(xr[i]);
    ss += v * v;
  }
  // The block's sum: within each warp, then across the warps.
  for (int o = kWarp / 2; o > 0; o >>= 1)
    ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float part[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0)
    part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + kWarp - 1) / kWarp;
    ss = lane < warps ? part[lane] : 0.f;
    for (int o = kWarp / 2; o > 0; o >>= 1)
      ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0)
      part[0] = ss;
  }
  __syncthreads();
  const float r = rsqrtf(part[0] / float(C) + eps);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    // The normalised value is rounded to T before the weight multiplies
    // it, as LlamaRMSNorm's `weight * x.to(input_dtype)` does.
    const float n = to_float(from_float<T>(to_float(xr[i]) * r));
    yr[i] = from_float<T>(to_float(w[i]) * n);
  }
}

template <typename T>
int launch(
    const void* x,
    const void* w,
    void* y,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream) {
  // Up to 1024 threads a row, whole warps.
  int threads = int(C < 1024 ? C : 1024);
  threads = (threads + kWarp - 1) / kWarp * kWarp;
  rms_norm_kernel<T><<<unsigned(rows), threads, 0, cudaStream_t(stream)>>>(
      static_cast<const T*>(x),
      static_cast<const T*>(w),
      static_cast<T*>(y),
      C,
      eps);
  return int(cudaGetLastError());
}

} // namespace

int rms_norm(
    Dtype dtype,
    const void* x,
    const void* w,
    void* y,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream) {
  if (rows == 0)
    return 0;
  switch (dtype) {
    case Dtype::float32:
      return launch<float>(x, w, y, rows, C, eps, stream);
    case Dtype::float16:
      return launch<__half>(x, w, y, rows, C, eps, stream);
    case Dtype::bfloat16:
      return launch<__nv_bfloat16>(x, w, y, rows, C, eps, stream);
  }
  return int(cudaErrorInvalidValue);
}

} // namespace orchard::ops::cuda
