#include "models/trm_language_model.h"

#include "core/error.h"
#include "ops/stablemax.h"

#include <stdexcept>

namespace orchard::models {

TrmLanguageModel::TrmLanguageModel(Trm model) : trm(std::move(model)) {
  if (!trm->config.causal)
    throw UserError(
        "this tiny recursive model was trained on puzzles, not "
        "conversations; `orchard solve` and `orchard eval` use it.");
  register_module("trm", trm);
}

torch::Tensor TrmLanguageModel::forward(
    const torch::Tensor& idx,
    KvCache* cache) {
  if (cache)
    throw std::logic_error("TrmLanguageModel has no cache");
  const int64_t B = idx.size(0), T = idx.size(1), S = trm->config.seq_len;
  if (T > S)
    throw UserError(
        "the text is " + std::to_string(T) +
        " tokens; this tiny recursive model reads at most " +
        std::to_string(S) + ".");
  // Right padding (id 0): causal attention keeps it from every real position.
  const auto inputs = torch::constant_pad_nd(idx, {0, S - T}, 0);
  const auto ids = torch::zeros({B}, idx.options());
  auto [z_H, z_L] = trm->initial_carry(B);
  TrmStepOutput out;
  for (int64_t k = 0; k < trm->config.halt_max_steps; ++k) {
    out = trm->step(z_H, z_L, inputs, ids);
    z_H = out.z_H;
    z_L = out.z_L;
  }
  // The model's probabilities are stable-max's, not softmax's: returned
  // as their logarithms, which softmax (the samplers) maps back to them.
  auto logp = ops::log_stablemax(out.logits.narrow(1, 0, T));
  return out.logits.scalar_type() == torch::kFloat64 ? logp
                                                     : logp.to(torch::kFloat32);
}

torch::Tensor TrmLanguageModel::decode_batch(
    const torch::Tensor&,
    const torch::Tensor&,
    BatchKvCache&,
    int64_t) {
  throw UserError(
      "a tiny recursive model decodes without a cache, one sequence at a "
      "time; batched decoding (orchard serve, GRPO) is not available for "
      "it.");
}

torch::Tensor TrmLanguageModel::loss(
    const torch::Tensor& idx,
    const torch::Tensor& targets) {
  const auto logits = forward(idx);
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}),
      targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
}

int64_t TrmLanguageModel::max_seq_len() const {
  return trm->config.seq_len;
}

int64_t TrmLanguageModel::vocab_size() const {
  return trm->config.vocab_size;
}

} // namespace orchard::models
