// SwiGLU's silu(gate) * up in one kernel (plain definition and oracle:
// ops::silu_mul_reference in src/ops/silu_mul.cpp: two kernels and an
// intermediate tensor).
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

template <typename T>
__global__ void silu_mul_kernel(
    const T* __restrict__ g,
    const T* __restrict__ u,
    int64_t g_stride,
    int64_t u_stride,
    T* __restrict__ y,
    int64_t n) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t b = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  const float x = to_float(g[b * g_stride + i]);
  const float s = round_to<T>(x / (1.0f + expf(-x)));
  y[b * n + i] = from_float<T>(__fmul_rn(s, to_float(u[b * u_stride + i])));
}

} // namespace

int silu_mul(
    Dtype dtype,
    const void* g,
    const void* u,
    int64_t g_stride,
    int64_t u_stride,
    void* y,
    int64_t B,
    int64_t n,
    void* stream) {
  if (B == 0 || n == 0)
    return 0;
  constexpr int threads = 256;
  const dim3 grid(unsigned((n + threads - 1) / threads), unsigned(B));
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    return launch_dependent(
        silu_mul_kernel<T>,
        grid,
        dim3(threads),
        cudaStream_t(stream),
        static_cast<const T*>(g),
        static_cast<const T*>(u),
        g_stride,
        u_stride,
        static_cast<T*>(y),
        n);
  });
}

} // namespace orchard::ops::cuda
