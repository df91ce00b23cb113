#include "ops/attention.h"

#include "core/torch_compat.h"
#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>

namespace orchard::ops {

torch::Tensor hidden_keys(
    int64_t Tq,
    int64_t Tk,
    int64_t window,
    torch::Device device) {
  auto ones = [&] {
    return torch::ones(
        {Tq, Tk}, torch::TensorOptions().dtype(torch::kBool).device(device));
  };
  auto hidden = ones().triu(Tk - Tq + 1);
  if (window > 0 && Tk > window)
    hidden = hidden.logical_or(ones().tril(Tk - Tq - window));
  return hidden;
}

torch::Tensor explicit_attention(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    int64_t window) {
  const int64_t Tq = q.size(2), Tk = k.size(2);
  auto scores =
      torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
  auto compute = scores.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                         : torch::kFloat32;
  scores = scores.to(compute).masked_fill(
      hidden_keys(Tq, Tk, window, q.device()),
      -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1).to(v.scalar_type()), v);
}

torch::Tensor causal_attention(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    int64_t window) {
  if (!compat::has_fused_attention())
    return explicit_attention(q, k, v, window);
  if (window > 0 && k.size(2) > window)
    return compat::fused_attention(
        q,
        k,
        v,
        hidden_keys(q.size(2), k.size(2), window, q.device()).logical_not(),
        /*is_causal=*/false);
  if (q.size(2) == k.size(2))
    return compat::fused_attention(q, k, v, {}, /*is_causal=*/true);
  if (q.size(2) == 1) // one new token attends to every cached position
    return compat::fused_attention(q, k, v, {}, /*is_causal=*/false);
  return explicit_attention(q, k, v, window);
}

torch::Tensor decode_attention_reference(
    const torch::Tensor& q,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v,
    const torch::Tensor& pos,
    int64_t key_len,
    int64_t window) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t Hkv = cache_k.size(1), G = H / Hkv;
  const int64_t L = key_len > 0 ? std::min(key_len, cache_k.size(2))
                                : cache_k.size(2);
  const auto acc =
      q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto k = cache_k.narrow(2, 0, L), v = cache_v.narrow(2, 0, L);
  // (B, Hkv, G, D) x (B, Hkv, D, L): query head h reads kv head h / G.
  auto scores = torch::matmul(
      q.reshape({B, Hkv, G, D}).to(acc), k.transpose(-2, -1).to(acc));
  scores.mul_(1.0 / std::sqrt(double(D)));
  auto key_pos = torch::arange(L, pos.options()).view({1, L});
  auto hidden = key_pos > pos.view({B, 1});
  if (window > 0)
    hidden = hidden.logical_or(key_pos <= pos.view({B, 1}) - window);
  scores.masked_fill_(
      hidden.view({B, 1, 1, L}), -std::numeric_limits<double>::infinity());
  auto y = torch::matmul(
      torch::softmax(scores, -1).to(q.scalar_type()),
      v.to(q.scalar_type())); // (B, Hkv, G, D)
  return y.reshape({B, H * D});
}

bool decode_attention_is_fused(
    const torch::Tensor& q,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v,
    const torch::Tensor& pos) {
#ifdef ORCHARD_CUDA_KERNELS
  return kernel::usable({q, cache_k, cache_v}) && q.dim() == 4 &&
      q.size(2) == 1 && q.is_contiguous() && cache_k.dim() == 4 &&
      cache_k.is_contiguous() && cache_v.is_contiguous() &&
      cache_v.sizes() == cache_k.sizes() && q.size(3) == cache_k.size(3) &&
      q.size(0) <= cache_k.size(0) && pos.scalar_type() == torch::kInt64 &&
      pos.dim() == 1 && pos.size(0) == q.size(0) && pos.is_contiguous() &&
      pos.device() == q.device() &&
      cuda::decode_attention_supports(
             q.size(1), cache_k.size(1), cache_k.size(3));
#else
  (void)q, (void)cache_k, (void)cache_v, (void)pos;
  return false;
#endif
}

torch::Tensor decode_attention(
    const torch::Tensor& q,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v,
    const torch::Tensor& pos,
    int64_t key_len,
    int64_t window) {
  if (!decode_attention_is_fused(q, cache_k, cache_v, pos))
    return decode_attention_reference(
        q, cache_k, cache_v, pos, key_len, window);
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(q.device());
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t L = key_len > 0 ? std::min(key_len, cache_k.size(2))
                                : cache_k.size(2);
  auto y = torch::empty({B, H * D}, q.options());
  const int64_t words = cuda::decode_attention_workspace(B, H, L, D);
  auto work = torch::empty(
      {std::max<int64_t>(words, 1)}, q.options().dtype(torch::kFloat32));
  kernel::check(
      cuda::decode_attention(
          kernel::dtype_of(q),
          q.data_ptr(),
          cache_k.data_ptr(),
          cache_v.data_ptr(),
          pos.data_ptr<int64_t>(),
          y.data_ptr(),
          work.data_ptr<float>(),
          B,
          H,
          cache_k.size(1),
          D,
          cache_k.size(2),
          L,
          window,
          float(1.0 / std::sqrt(double(D))),
          kernel::stream_of(q)),
      "decode_attention");
  return y;
#else
  return decode_attention_reference(q, cache_k, cache_v, pos, key_len, window);
#endif
}

} // namespace orchard::ops
