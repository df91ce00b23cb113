#include "ops/attention.h"

#include "core/torch_compat.h"

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

} // namespace orchard::ops
