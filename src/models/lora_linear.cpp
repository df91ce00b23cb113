#include "models/lora_linear.h"

#include "core/error.h"
#include "ops/linear.h"

#include <algorithm>

namespace orchard::models {
namespace {
namespace F = torch::nn::functional;
} // namespace

ProjImpl::ProjImpl(torch::Tensor w, torch::Tensor b)
    : out_features(w.size(0)), in_features(w.size(1)) {
  weight = register_parameter("weight", std::move(w));
  if (b.defined())
    bias = register_parameter("bias", std::move(b));
}

void ProjImpl::quantize_4bit() {
  q4 = ops::quantize_nf4(weight.detach());
  // The full-precision weight goes; the parameter stays (empty) so the
  // module's names do not change.
  weight.set_data(torch::empty({0}, weight.options()));
  register_buffer("weight_nf4_codes", q4.codes);
  register_buffer("weight_nf4_absmax", q4.absmax);
}

torch::Tensor ProjImpl::full_weight() const {
  return q4.defined() ? ops::dequantize_nf4(q4) : weight.detach();
}

torch::Tensor ProjImpl::base(const torch::Tensor& x2) const {
  if (q4.defined()) {
    auto y = ops::nf4_linear(x2, q4);
    return bias.defined() ? y + bias : y;
  }
  return ops::linear(x2, weight, bias);
}

torch::Tensor ProjImpl::forward(const torch::Tensor& x) {
  torch::Tensor y;
  if (q4.defined()) {
    auto lead = x.sizes().vec();
    lead.back() = out_features;
    y = base(x.reshape({-1, in_features})).view(lead);
  } else if (!bias.defined() && ops::autocast_linear_is_fused(x, weight)) {
    y = ops::autocast_linear(x, weight); // the weight's gradient in float32
  } else {
    y = x.dim() == 2 ? ops::linear(x, weight, bias) : F::linear(x, weight, bias);
  }
  if (!has_lora())
    return y;
  const auto& A = lora_A->weight;
  const auto& B = lora_B->weight;
  auto h = x;
  if (dropout > 0 && is_training())
    h = F::dropout(h, F::DropoutFuncOptions().p(dropout).training(true));
  const auto dt = y.scalar_type();
  // PEFT's order of operations: the input cast to the adapters' dtype, the
  // sum taken there and cast back. (Float32 adapters on a half-precision
  // base take LayerProjections' path in llama.cpp instead.)
  auto delta = F::linear(F::linear(h.to(A.scalar_type()), A), B) * scaling;
  if (delta.scalar_type() == dt)
    return y + delta;
  return (y.to(delta.scalar_type()) + delta).to(dt);
}

void ProjImpl::add_lora(
    int64_t r,
    double s,
    double p,
    torch::ScalarType dtype) {
  const int64_t out = out_features, in = in_features;
  auto opt = torch::TensorOptions().dtype(dtype).device(
      q4.defined() ? q4.codes.device() : weight.device());
  const double bound = 1.0 / std::sqrt(double(in));
  lora_A = register_module(
      "lora_A", Weight(torch::empty({r, in}, opt).uniform_(-bound, bound)));
  lora_B = register_module("lora_B", Weight(torch::zeros({out, r}, opt)));
  scaling = s;
  dropout = p;
}

torch::Tensor ProjImpl::merged_weight(
    std::optional<torch::ScalarType> dtype) const {
  torch::NoGradGuard no_grad;
  auto w = full_weight();
  if (!has_lora())
    return dtype ? w.to(*dtype) : w;
  // float32 at least (float64 for a float64 weight).
  const auto acc = w.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                      : torch::kFloat32;
  auto delta =
      torch::matmul(lora_B->weight.to(acc), lora_A->weight.to(acc)) * scaling;
  return (w.to(acc) + delta.to(w.device())).to(dtype.value_or(w.scalar_type()));
}

bool ProjImpl::merge_lora() {
  if (!has_lora() || q4.defined())
    return false;
  torch::NoGradGuard no_grad;
  weight.set_data(merged_weight());
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_A = nullptr;
  lora_B = nullptr;
  return true;
}

int64_t AdaptableModel::prepare_inference() {
  int64_t merged = 0;
  for (auto& [name, proj] : projections())
    merged += proj->merge_lora();
  return merged;
}

int64_t AdaptableModel::add_lora(
    const LoraSpec& spec,
    torch::ScalarType dtype) {
  if (spec.r <= 0)
    throw UserError("lora.r must be at least 1.");
  for (auto& p : parameters())
    p.set_requires_grad(false);
  int64_t added = 0;
  for (auto& [name, proj] : projections()) {
    const std::string leaf = name.substr(name.rfind('.') + 1);
    const auto& t = spec.target_modules;
    if (std::find(t.begin(), t.end(), leaf) == t.end())
      continue;
    proj->add_lora(spec.r, spec.scaling(), spec.dropout, dtype);
    ++added;
  }
  if (added == 0) {
    std::string names;
    for (const auto& n : spec.target_modules)
      names += (names.empty() ? "" : ", ") + n;
    throw UserError(
        "lora.target_modules (" + names +
        ") names none of this model's projections; check their names.");
  }
  return added;
}

} // namespace orchard::models
