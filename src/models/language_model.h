// What generation, chat and serving need from a model, whichever its
// architecture: Orchard's GPT (models/gpt.h) or a Hugging Face Llama-family
// model (models/llama.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace orchard::models {

// The keys and values of earlier positions, per layer, for generation.
struct KvCache {
  std::vector<torch::Tensor> k, v; // (B, Hkv, T_cached, D) per layer
  int64_t length() const {
    return k.empty() || !k[0].defined() ? 0 : k[0].size(2);
  }
};

// The keys and values of a batch of sequences at different lengths, one
// row each, in fixed-size tensors (B, Hkv, max_seq_len, D) per layer.
struct BatchKvCache {
  std::vector<torch::Tensor> k, v;
  int64_t rows() const {
    return k.empty() ? 0 : k[0].size(0);
  }
};

class LanguageModel : public torch::nn::Module {
 public:
  // Logits (B, T, V) in float32 (float64 for a float64 model). With a
  // cache, `idx` holds the positions after the cached ones and the cache is
  // extended.
  virtual torch::Tensor forward(
      const torch::Tensor& idx,
      KvCache* cache = nullptr) = 0;
  // Logits (B, V) of the token `idx` (B) at position `pos` (B) of each row,
  // whose earlier keys and values are in `cache` (extended in place).
  // Equals forward() with a KvCache row by row. Attention reads the first
  // `key_len` positions of the cache (0: all; the caller keeps it above
  // every pos). Fixed shapes and no host synchronisation, so a CUDA graph
  // can capture it (infer/decode_step.h).
  virtual torch::Tensor decode_batch(
      const torch::Tensor& idx,
      const torch::Tensor& pos,
      BatchKvCache& cache,
      int64_t key_len = 0) = 0;
  // The logits (B, T - from, V) of positions from .. T-1 of `idx` (B, T),
  // float32 at least: forward()'s, without the head's product for the
  // positions before `from` where a model can skip it.
  virtual torch::Tensor logits_from(const torch::Tensor& idx, int64_t from) {
    auto logits = forward(idx);
    return logits.narrow(1, from, logits.size(1) - from);
  }
  // Log-probabilities (B, W), float32 at least, of `targets` (B, W), each
  // predicted at position `cols` (B, W) of `idx` (B, T), the logits divided
  // by `temperature`; every col >= `from`. What GRPO's policy and reference
  // passes need. This default takes logits_from(idx, from); a model may
  // compute them without holding (B, W, V) logits (models/hf/model.h).
  virtual torch::Tensor token_logprobs(
      const torch::Tensor& idx,
      int64_t from,
      const torch::Tensor& cols,
      const torch::Tensor& targets,
      double temperature);
  // Mean cross-entropy over targets != -1 (ignored positions).
  virtual torch::Tensor loss(
      const torch::Tensor& idx,
      const torch::Tensor& targets) = 0;
  // Readies a loaded model for generation only (adapters merged into the
  // weights, projections fused): numbers stay those of forward(), within
  // rounding; training it afterwards is not supported. Returns how many
  // adapters were merged.
  virtual int64_t prepare_inference() {
    return 0;
  }
  // False for a model that decodes by running the whole sequence again
  // for every token (a tiny recursive model): forward() and loss() only,
  // never a cache or decode_batch().
  virtual bool supports_kv_cache() const {
    return true;
  }
  // The longest sequence generation may build (prompt + new tokens).
  virtual int64_t max_seq_len() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Where the weights are.
  torch::Device device() const {
    auto p = parameters();
    return p.empty() ? torch::Device(torch::kCPU) : p[0].device();
  }
};

} // namespace orchard::models
