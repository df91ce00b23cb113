// What the kernels share: conversions between the storage types and
// float32 (rounding to nearest even, as PyTorch's casts do), the Dtype to
// type dispatch, and a warp's sum.
#pragma once

#include "ops/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace orchard::ops::cuda {

constexpr int kWarp = 32;

__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__half v) {
  return __half2float(v);
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

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

// v rounded to T and back: what a PyTorch op on T tensors stores.
template <typename T>
__device__ inline float round_to(float v) {
  return to_float(from_float<T>(v));
}

__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The 16 / sizeof(T) values of T in a 16-byte load, as float32.
template <typename T>
__device__ inline void unpack16(const uint4& raw, float* out) {
  constexpr int n = 16 / sizeof(T);
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < n; ++e)
    out[e] = to_float(v[e]);
}

// A warp's partial sums of rows 0..N-1 of one output o, summed over the
// warp and written by lane 0 to y[n][o] (plus bias[o] where given), one
// rounding to T.
template <typename T, int MaxRows>
__device__ inline void write_warp_sums(
    const float (&acc)[MaxRows],
    int N,
    const T* bias,
    T* y,
    int64_t out,
    int64_t o) {
#pragma unroll
  for (int n = 0; n < MaxRows; ++n) {
    if (n >= N)
      break;
    float s = warp_sum(acc[n]);
    if (threadIdx.x % kWarp == 0) {
      if (bias)
        s += to_float(bias[o]);
      y[int64_t(n) * out + o] = from_float<T>(s);
    }
  }
}

// Calls f(T{}) with T the storage type of `dtype`; returns f's result, or
// cudaErrorInvalidValue for an unknown dtype.
template <typename F>
int dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::float32:
      return f(float{});
    case Dtype::float16:
      return f(__half{});
    case Dtype::bfloat16:
      return f(__nv_bfloat16{});
  }
  return int(cudaErrorInvalidValue);
}

} // namespace orchard::ops::cuda
