// RMSNorm in one kernel (plain definition and oracle: ops::rms_norm_reference
// in src/ops/rms_norm.cpp). The plain one is eight kernels (cast, square,
// mean, add, rsqrt, multiply, cast, multiply), each a pass over the row;
// this is one pass to read x, one to write y. One block per row: the
// decoding step's rows are one token each (C = 896 to 8192). With a
// residual, the add before the norm is the same pass.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

// The block's sum of every thread's v (all threads get it).
__device__ inline float block_sum(float v) {
  __shared__ float part[kWarp];
  v = warp_sum(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0)
    part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + kWarp - 1) / kWarp;
    v = warp_sum(lane < warps ? part[lane] : 0.f);
    if (lane == 0)
      part[0] = v;
  }
  __syncthreads();
  return part[0];
}

// r == nullptr: plain RMSNorm of x. Else s = T(x + r) is normalised and
// written to `sum` (which may be x itself).
template <typename T>
__global__ void rms_norm_kernel(
    const T* x,
    const T* __restrict__ r,
    const T* __restrict__ w,
    T* sum,
    T* __restrict__ y,
    int64_t C,
    float eps) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t row = int64_t(blockIdx.x) * C;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    float v = to_float(x[row + i]);
    if (r) {
      const T s = from_float<T>(v + to_float(r[row + i]));
      sum[row + i] = s;
      v = to_float(s);
    }
    ss += v * v;
  }
  const float scale = rsqrtf(block_sum(ss) / float(C) + eps);
  // Each thread reads back only what it wrote itself: no barrier needed.
  const T* src = r ? sum : x;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    // The normalised value is rounded to T before the weight multiplies
    // it, as LlamaRMSNorm's `weight * x.to(input_dtype)` does.
    const float n = round_to<T>(to_float(src[row + i]) * scale);
    y[row + i] = from_float<T>(to_float(w[i]) * n);
  }
}

int launch(
    Dtype dtype,
    const void* x,
    const void* r,
    const void* w,
    void* sum,
    void* y,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream) {
  if (rows == 0)
    return 0;
  // Up to 1024 threads a row, whole warps.
  int threads = int(C < 1024 ? C : 1024);
  threads = (threads + kWarp - 1) / kWarp * kWarp;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    return launch_dependent(
        rms_norm_kernel<T>,
        dim3(unsigned(rows)),
        dim3(threads),
        cudaStream_t(stream),
        static_cast<const T*>(x),
        static_cast<const T*>(r),
        static_cast<const T*>(w),
        static_cast<T*>(sum),
        static_cast<T*>(y),
        C,
        eps);
  });
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
  return launch(dtype, x, nullptr, w, nullptr, y, rows, C, eps, stream);
}

int add_rms_norm(
    Dtype dtype,
    const void* x,
    const void* r,
    const void* w,
    void* sum,
    void* y,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream) {
  return launch(dtype, x, r, w, sum, y, rows, C, eps, stream);
}

} // namespace orchard::ops::cuda
