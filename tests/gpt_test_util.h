// A small GPT whose every weight is random (so logits depend on the
// context), for the generation and serving tests.
#pragma once

#include "models/gpt.h"

#include <torch/torch.h>

#include <cstdint>

namespace orchard::test {

inline models::Gpt random_gpt(
    int64_t vocab,
    int64_t max_seq,
    int64_t kv_heads,
    uint64_t seed,
    double stddev) {
  models::GptConfig c;
  c.vocab_size = vocab;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 2;
  c.n_kv_head = kv_heads;
  c.max_seq_len = max_seq;
  torch::manual_seed(seed);
  models::Gpt m(c);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters())
    p.normal_(0.0, stddev);
  m->eval();
  return m;
}

} // namespace orchard::test
