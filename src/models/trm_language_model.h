// A causal tiny recursive model (stage=trm on chat data) as a language
// model for `orchard generate` and `orchard chat`.
//
// There is no cache: every call embeds the whole sequence (right-padded to
// the seq_len the model was trained on), starts from a fresh carry and
// runs all halt_max_steps supervision steps, as evaluation does; the
// logits are the last step's. So every generated token gets the full
// recursion, never a state left from the token before (the defect of the
// fork seed 000 used: N tokens sampled from one stale carry). Causal
// attention and position-wise recursion keep position t blind to t + 1,
// so padding on the right changes nothing before it.
#pragma once

#include "models/language_model.h"
#include "models/trm.h"

namespace orchard::models {

class TrmLanguageModel : public LanguageModel {
 public:
  // UserError unless `model` is causal (trained on chat data).
  explicit TrmLanguageModel(Trm model);

  // Log-probabilities under stable-max (B, T, V), float32 (float64 for a
  // float64 model), T <= seq_len: softmax of them is the model's
  // distribution, so every sampler draws from it.
  // `cache` must be null (supports_kv_cache() is false).
  torch::Tensor forward(const torch::Tensor& idx, KvCache* cache = nullptr)
      override;
  torch::Tensor decode_batch(
      const torch::Tensor& idx,
      const torch::Tensor& pos,
      BatchKvCache& cache,
      int64_t key_len = 0) override;
  // Mean cross-entropy of forward()'s log-probabilities over targets !=
  // -1 (stable-max cross-entropy).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets)
      override;
  bool supports_kv_cache() const override {
    return false;
  }
  int64_t max_seq_len() const override;
  int64_t vocab_size() const override;

  Trm trm;
};

} // namespace orchard::models
