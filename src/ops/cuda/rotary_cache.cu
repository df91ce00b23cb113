// Rotary embedding of a decoding step's new q and k and the write of k and
// v into the KV cache, in one kernel (plain definition and oracle:
// ops::rotary_cache_write_reference in src/ops/rotary_cache.cpp, which is
// about sixteen kernels: the roll, products and sums of q and k, the casts
// and two indexed writes).
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

// One block per (row b, head), q heads then k heads then v heads; one
// thread per dimension.
template <typename T>
__global__ void rotary_cache_kernel(
    const T* __restrict__ q,
    const T* __restrict__ k,
    const T* __restrict__ v,
    int64_t q_stride,
    int64_t k_stride,
    int64_t v_stride,
    const T* __restrict__ cos,
    const T* __restrict__ sin,
    const int64_t* __restrict__ pos,
    T* __restrict__ q_out,
    T* __restrict__ cache_k,
    T* __restrict__ cache_v,
    int64_t heads_q,
    int64_t heads_kv,
    int64_t D,
    int64_t capacity) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t b = blockIdx.y;
  const int64_t head = blockIdx.x;
  const int64_t p = pos[b];
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const T* src;
    T* dst;
    bool rotate = true;
    if (head < heads_q) {
      src = q + b * q_stride + head * D;
      dst = q_out + (b * heads_q + head) * D;
    } else {
      const int64_t h = head < heads_q + heads_kv ? head - heads_q
                                                  : head - heads_q - heads_kv;
      const int64_t at = ((b * heads_kv + h) * capacity + p) * D;
      if (head < heads_q + heads_kv) {
        src = k + b * k_stride + h * D;
        dst = cache_k + at;
      } else {
        src = v + b * v_stride + h * D;
        dst = cache_v + at;
        rotate = false;
      }
    }
    if (!rotate) {
      dst[d] = src[d];
      continue;
    }
    // x * [c, c] + roll(x, D/2) * [-s, s], each product and the sum
    // rounded to T as the plain ops round them (__fmul_rn: no fused
    // multiply-add, which would skip float32's rounding of the product).
    const float a =
        round_to<T>(__fmul_rn(to_float(src[d]), to_float(cos[p * D + d])));
    const float c = round_to<T>(
        __fmul_rn(to_float(src[(d + D / 2) % D]), to_float(sin[p * D + d])));
    dst[d] = from_float<T>(a + c);
  }
}

} // namespace

int rotary_cache_write(
    Dtype dtype,
    const void* q,
    const void* k,
    const void* v,
    int64_t q_stride,
    int64_t k_stride,
    int64_t v_stride,
    const void* cos,
    const void* sin,
    const int64_t* pos,
    void* q_out,
    void* cache_k,
    void* cache_v,
    int64_t B,
    int64_t heads_q,
    int64_t heads_kv,
    int64_t D,
    int64_t capacity,
    void* stream) {
  if (B == 0)
    return 0;
  const dim3 grid(unsigned(heads_q + 2 * heads_kv), unsigned(B));
  const int threads = int(D < 256 ? (D + kWarp - 1) / kWarp * kWarp : 256);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    return launch_dependent(
        rotary_cache_kernel<T>,
        grid,
        dim3(threads),
        cudaStream_t(stream),
        static_cast<const T*>(q),
        static_cast<const T*>(k),
        static_cast<const T*>(v),
        q_stride,
        k_stride,
        v_stride,
        static_cast<const T*>(cos),
        static_cast<const T*>(sin),
        pos,
        static_cast<T*>(q_out),
        static_cast<T*>(cache_k),
        static_cast<T*>(cache_v),
        heads_q,
        heads_kv,
        D,
        capacity);
  });
}

} // namespace orchard::ops::cuda
