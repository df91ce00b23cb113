// Generation: prefill the prompt, then decode one token at a time with the
// KV cache, sampling with temperature, top-k and top-p from a seeded
// generator. Sampling runs on the CPU in float32, so the same seed gives
// the same text on every device. The engine knows nothing about tokenizers.
#pragma once

#include "models/language_model.h"
#include "runs/load.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace orchard::infer {

struct SamplingOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.8; // 0: greedy
  int64_t top_k = 50;       // 0: off
  double top_p = 1.0;       // 1: off
  uint64_t seed = 42;
  std::vector<int64_t> stop_tokens; // generation ends after one of these
};

// The ranges every caller accepts (generate, chat, serve): temperature in
// [0, kMaxTemperature] (OpenAI's), top_p in (0, 1], top_k >= 0 (0: off), at
// least one new token.
constexpr double kMaxTemperature = 2.0;
constexpr int64_t kMaxTopK = int64_t(1) << 20;

// "" when `opt` is within those ranges, else what is wrong, in the
// command line's flag names (the server reports its own field names).
std::string sampling_problem(const SamplingOptions& opt);

struct GenerationStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? double(new_tokens) / decode_seconds : 0;
  }
};

// Index of the next token from float logits (V,), per the options.
int64_t sample_token(
    const torch::Tensor& logits,
    const SamplingOptions& opt,
    torch::Generator& gen);

class Engine {
 public:
  Engine(std::shared_ptr<models::LanguageModel> model, torch::Device device);

  // New token ids after `prompt`; `on_token` sees each as it is made (and
  // may return false to stop). Stops at max_new_tokens, a stop token, or
  // the model's max_seq_len. `use_cache=false` recomputes the whole
  // sequence each step (the reference the cache is tested against).
  std::vector<int64_t> generate(
      const std::vector<int64_t>& prompt,
      const SamplingOptions& opt,
      const std::function<bool(int64_t)>& on_token = {},
      bool use_cache = true,
      GenerationStats* stats = nullptr);

  const std::shared_ptr<models::LanguageModel>& model() const {
    return model_;
  }

 private:
  std::shared_ptr<models::LanguageModel> model_;
  torch::Device device_;
};

// Continuations of the first `prompt_tokens` tokens of the first `count`
// documents in validation shards: text the model has not trained on.
// Returns (prompt, continuation) pairs.
std::vector<std::pair<std::string, std::string>> sample_validation_documents(
    const runs::LoadedModel& model,
    const std::vector<std::string>& val_shards,
    int count,
    int64_t prompt_tokens,
    const SamplingOptions& opt);

} // namespace orchard::infer
