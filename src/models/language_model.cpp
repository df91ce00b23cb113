#include "models/language_model.h"

namespace orchard::models {

torch::Tensor LanguageModel::token_logprobs(
    const torch::Tensor& idx,
    int64_t from,
    const torch::Tensor& cols,
    const torch::Tensor& targets,
    double temperature) {
  auto logits = logits_from(idx, from); // (B, T - from, V)
  auto at = cols - from;
  torch::Tensor picked;
  if (at.size(1) <= logits.size(1) &&
      at.eq(torch::arange(at.size(1), at.options()).unsqueeze(0)).all().item<bool>()) {
    // Every row from the first column on (a group's rows): the logits as
    // they are, no (B, W, V) copy.
    picked = logits.narrow(1, 0, at.size(1));
  } else {
    auto rows = torch::arange(idx.size(0), cols.options()).unsqueeze(1).expand_as(cols);
    picked = logits.index({rows, at});
  }
  if (temperature != 1.0)
    picked = picked / temperature;
  auto chosen = picked.gather(2, targets.unsqueeze(2)).squeeze(2);
  return chosen - torch::logsumexp(picked, 2);
}

} // namespace orchard::models
