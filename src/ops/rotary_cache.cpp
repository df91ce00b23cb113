#include "ops/rotary_cache.h"

#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace orchard::ops {

torch::Tensor rotate(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin) {
  return x * cos + torch::roll(x, x.size(-1) / 2, -1) * sin;
}

torch::Tensor rotary_cache_write_reference(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    const torch::Tensor& pos,
    torch::Tensor& cache_k,
    torch::Tensor& cache_v) {
  using torch::indexing::Slice;
  const int64_t B = q.size(0), D = cache_k.size(3), Hkv = cache_k.size(1);
  const int64_t H = q.size(1) / D;
  auto c = cos.index_select(0, pos).view({B, 1, 1, D});
  auto s = sin.index_select(0, pos).view({B, 1, 1, D});
  auto rows = torch::arange(B, pos.options());
  auto rk = rotate(k.reshape({B, 1, Hkv, D}), c, s);
  cache_k.index_put_(
      {rows, Slice(), pos}, rk.reshape({B, Hkv, D}).to(cache_k.scalar_type()));
  cache_v.index_put_(
      {rows, Slice(), pos},
      v.reshape({B, Hkv, D}).to(cache_v.scalar_type()));
  return rotate(q.reshape({B, 1, H, D}), c, s).transpose(1, 2);
}

bool rotary_cache_write_is_fused(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    const torch::Tensor& pos,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v) {
  if (!kernel::usable({q, k, v, cos, sin, cache_k, cache_v}))
    return false;
  auto rows_ok = [](const torch::Tensor& t) {
    return t.dim() == 2 && t.stride(1) == 1;
  };
  const int64_t D = cache_k.dim() == 4 ? cache_k.size(3) : 0;
  return rows_ok(q) && rows_ok(k) && rows_ok(v) && D > 0 && D % 2 == 0 &&
      cache_k.is_contiguous() && cache_v.is_contiguous() &&
      cache_v.sizes() == cache_k.sizes() && cos.is_contiguous() &&
      sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == D &&
      sin.sizes() == cos.sizes() && pos.scalar_type() == torch::kInt64 &&
      pos.dim() == 1 && pos.is_contiguous() && pos.device() == q.device() &&
      pos.size(0) == q.size(0) && k.size(0) == q.size(0) &&
      v.size(0) == q.size(0) && q.size(0) <= cache_k.size(0) &&
      q.size(1) % D == 0 && k.size(1) == cache_k.size(1) * D &&
      v.size(1) == k.size(1);
}

torch::Tensor rotary_cache_write(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    const torch::Tensor& pos,
    torch::Tensor& cache_k,
    torch::Tensor& cache_v) {
  if (!rotary_cache_write_is_fused(q, k, v, cos, sin, pos, cache_k, cache_v))
    return rotary_cache_write_reference(
        q, k, v, cos, sin, pos, cache_k, cache_v);
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(q.device());
  const int64_t B = q.size(0), D = cache_k.size(3), Hkv = cache_k.size(1);
  const int64_t H = q.size(1) / D;
  auto q_out = torch::empty({B, H, 1, D}, q.options());
  kernel::check(
      cuda::rotary_cache_write(
          kernel::dtype_of(q),
          q.data_ptr(),
          k.data_ptr(),
          v.data_ptr(),
          q.stride(0),
          k.stride(0),
          v.stride(0),
          cos.data_ptr(),
          sin.data_ptr(),
          pos.data_ptr<int64_t>(),
          q_out.data_ptr(),
          cache_k.data_ptr(),
          cache_v.data_ptr(),
          B,
          H,
          Hkv,
          D,
          cache_k.size(2),
          kernel::stream_of(q)),
      "rotary_cache_write");
  return q_out;
#else
  return rotary_cache_write_reference(q, k, v, cos, sin, pos, cache_k, cache_v);
#endif
}

} // namespace orchard::ops
