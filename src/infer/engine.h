// Generation: prefill the prompt, then decode one token at a time with the
// KV cache (infer/decode_step.h), sampling with temperature, top-k and
// top-p from a seeded generator (infer/sampling.h). The engine knows
// nothing about tokenizers.
#pragma once

#include "infer/sampling.h"
#include "models/language_model.h"
#include "runs/load.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace orchard::infer {

struct GenerationStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? double(new_tokens) / decode_seconds : 0;
  }
  double prefill_tokens_per_s() const {
    return prefill_seconds > 0 ? double(prompt_tokens) / prefill_seconds : 0;
  }
};

// B sequences generated together (Engine::generate_batch): row r holds
// prompt r / samples, sample r % samples.
struct BatchGeneration {
  std::vector<std::vector<int64_t>> tokens; // the new tokens of each row
  // log p(token | everything before it) under the model, per new token
  // (log_softmax of the logits before temperature and truncation).
  std::vector<std::vector<float>> logprobs;
  std::vector<std::string> finish; // "stop" (a stop token) or "length"
};

// Generation for one caller at a time: the prompt is prefilled in one
// forward pass, then each new token is one DecodeStep (a replayed CUDA
// graph on CUDA) over a KV cache kept between calls, sampled where
// SamplingOptions::sampling_device says; the host reads the new tokens in
// chunks (every few tokens when they are streamed to `on_token`).
class Engine {
 public:
  // `graphs`: replay CUDA graphs where the build and device allow.
  Engine(
      std::shared_ptr<models::LanguageModel> model,
      torch::Device device,
      bool graphs = true);
  ~Engine();

  // New token ids after `prompt`; `on_token` sees each as it is made (and
  // may return false to stop). Stops at max_new_tokens, a stop token, or
  // the model's max_seq_len. `use_cache=false` recomputes the whole
  // sequence each step with the CPU sampler (the reference the cached
  // path is tested against).
  std::vector<int64_t> generate(
      const std::vector<int64_t>& prompt,
      const SamplingOptions& opt,
      const std::function<bool(int64_t)>& on_token = {},
      bool use_cache = true,
      GenerationStats* stats = nullptr);

  // `samples` continuations of each prompt, all decoded together (prompts
  // of different lengths at their own positions); row r is sampled with
  // seed opt.seed + r, so it equals generate(prompt, opt with that seed)
  // up to the rounding of batched products. For GRPO's rollouts.
  BatchGeneration generate_batch(
      const std::vector<std::vector<int64_t>>& prompts,
      int64_t samples,
      const SamplingOptions& opt,
      GenerationStats* stats = nullptr);

  const std::shared_ptr<models::LanguageModel>& model() const {
    return model_;
  }
  // Whether decoding replays CUDA graphs: some were captured and no
  // capture failed.
  bool uses_graphs() const;

 private:
  struct Decoding;
  std::shared_ptr<models::LanguageModel> model_;
  torch::Device device_;
  std::unique_ptr<Decoding> single_, batch_; // caches and captured steps
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
