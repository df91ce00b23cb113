// A nanochat-style GPT.
//
// Differences from the textbook GPT-2: rotary position embeddings instead of
// learned ones; RMSNorm without learnable parameters; RMS-normalised queries
// and keys (QK-norm); ReLU² MLP; no biases; an untied lm_head; logits
// soft-capped at 15 (cap * tanh(logits / cap)); optional grouped-query
// attention (n_kv_head < n_head). One dial, `depth`, sets the size:
// n_layer = depth, n_embd = 64 * depth, head dim 128.
//
// Dimension letters: B batch, T sequence, C = n_embd, H heads, Hkv key/value
// heads, D head dim, V vocabulary, L layers.
//
// The model knows nothing about tokenizers or devices; state such as the KV
// cache is passed in.
#pragma once

#include "models/language_model.h"
#include "models/lora_linear.h"

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orchard::models {

struct GptConfig {
  int64_t vocab_size = 0;
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0;
  int64_t max_seq_len = 0;  // rotary tables are built for this many positions
  double rope_base = 10000; // RoFormer's base
  double softcap = 15;      // nanochat's logit cap
  // Recompute each block's forward during backward instead of keeping its
  // activations (models/checkpointing.h); training only.
  bool gradient_checkpointing = false;
  int64_t head_dim() const {
    return n_embd / n_head;
  }
  std::string tag() const; // "d6" when n_layer == 6
};

// Explicit sizes (the arch.* settings); each `auto` field is derived from
// `depth`.
struct ArchConfig {
  std::optional<int64_t> n_layer;    // auto: depth
  std::optional<int64_t> n_embd;     // auto: 64 * depth
  std::optional<int64_t> n_head;     // auto: n_embd / 128, at least 1
  std::optional<int64_t> n_kv_head;  // auto: n_head (no grouped-query)
  std::optional<int64_t> vocab_size; // auto: the tokenizer's
};

// Sizes from `depth` and the explicit arch.* settings; UserError when they
// are inconsistent (width not divisible by heads, heads not by kv heads,
// odd head dim for rotary).
GptConfig resolve_gpt_config(
    int64_t depth,
    const ArchConfig& arch,
    int64_t max_seq_len,
    int64_t vocab_size);

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& c);
  // x: (B, T, C); cos/sin: (T, D/2) for the positions of x.
  torch::Tensor forward(
      const torch::Tensor& x,
      const torch::Tensor& cos,
      const torch::Tensor& sin,
      torch::Tensor* cache_k,
      torch::Tensor* cache_v);
  // One new token per row at its own position (batched decoding): x
  // (B, 1, C), cos/sin (B, D/2); the row's keys and values are written
  // into cache_k/cache_v (B, Hkv, Tmax, D) at `pos` (B), and attention
  // reads positions 0..pos of each row, within the first key_len
  // (ops::decode_attention).
  torch::Tensor decode(
      const torch::Tensor& x,
      const torch::Tensor& cos,
      const torch::Tensor& sin,
      torch::Tensor& cache_k,
      torch::Tensor& cache_v,
      const torch::Tensor& pos,
      int64_t key_len);
  // q, k and v of x (B, T, C) as (B, T, heads, D): one product when
  // prepare_inference() stacked their weights, or in training, where the
  // three weights are concatenated for the step (one product forward, one
  // for the input's gradient and one for the weights', instead of three
  // each, and under autocast one cast of the input, not three); three
  // products otherwise (adapters, quantized weights, decoding without
  // gradients, or merge_qkv_in_training off).
  std::array<torch::Tensor, 3> qkv(const torch::Tensor& x);
  // The stacked (c_q; c_k; c_v) weight where qkv() takes one product; an
  // undefined tensor where it takes three.
  torch::Tensor stacked_weight() const;
  // No adapters or 4-bit weights on c_q, c_k, c_v: they can be stacked.
  bool plain_qkv() const;
  int64_t n_head, n_kv_head, head_dim;
  bool merge_qkv_in_training = true;
  Proj c_q{nullptr}, c_k{nullptr}, c_v{nullptr}, c_proj{nullptr};
  torch::Tensor qkv_weight; // after prepare_inference(); c_q/k/v views of it
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const GptConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  Proj c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GptConfig& c);
  torch::Tensor forward(
      torch::Tensor x,
      const torch::Tensor& cos,
      const torch::Tensor& sin,
      torch::Tensor* cache_k,
      torch::Tensor* cache_v);
  // The same block on the stream x and h = rms_norm(x): returns the new
  // stream and its norm in `next` (ops::residual_add_rms_norm: one kernel
  // for each add and the norm after it). The same numbers as forward()
  // followed by rms_norm.
  std::pair<torch::Tensor, torch::Tensor> forward_normed(
      const torch::Tensor& x,
      const torch::Tensor& h,
      const torch::Tensor& cos,
      const torch::Tensor& sin,
      torch::Tensor* cache_k,
      torch::Tensor* cache_v,
      torch::ScalarType next);
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : AdaptableModel {
  explicit GptImpl(const GptConfig& c);

  // Logits (B, T, V) in float32, soft-capped. With a cache, `idx` holds the
  // positions after the cached ones and the cache is extended.
  torch::Tensor forward(const torch::Tensor& idx, KvCache* cache = nullptr)
      override;
  // Batched decoding: logits (B, V) of the token `idx` (B) at position
  // `pos` (B) of each row, whose earlier keys and values are in `cache`
  // (extended in place). Equals forward() with a KvCache row by row.
  torch::Tensor decode_batch(
      const torch::Tensor& idx,
      const torch::Tensor& pos,
      BatchKvCache& cache,
      int64_t key_len = 0) override;
  // Mean cross-entropy of the soft-capped logits over targets != -1
  // (ignored positions), over chunks of rows (ops/linear_cross_entropy.h):
  // the (B, T, V) logits are never held whole. Equals cross_entropy of
  // forward()'s logits.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets)
      override;
  int64_t max_seq_len() const override {
    return config.max_seq_len;
  }
  int64_t vocab_size() const override {
    return config.vocab_size;
  }
  // The blocks' projections (attn.c_q, c_k, c_v, c_proj; mlp.c_fc,
  // c_proj), which LoRA can wrap (models/lora_linear.h).
  std::vector<std::pair<std::string, Proj>> projections() const override;
  // Adapters merged, then each block's c_q, c_k, c_v stacked into one
  // matrix (views of it: no extra memory) for one product a token.
  int64_t prepare_inference() override;
  int64_t add_lora(const LoraSpec& spec, torch::ScalarType dtype) override;

  // nanochat's initialisation: embeddings N(0, 1); matrices N(0, s) with
  // s = min(1, sqrt(fan_out / fan_in)) / sqrt(fan_in); the output
  // projections (attn.c_proj, mlp.c_proj) and lm_head start at zero.
  // Draws from the current torch seed.
  void init_weights();
  int64_t num_parameters() const;

  GptConfig config;
  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Linear lm_head{nullptr};
  torch::Tensor rope_cos, rope_sin; // (max_seq_len, D/2), buffers

 private:
  // The final normed hidden states (B, T, C), the head's input.
  torch::Tensor hidden(const torch::Tensor& idx, KvCache* cache);
  // Block i on positions 0..T-1 as a function of its input, for
  // checkpointing (which needs a function that outlives the forward).
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> block_fns_;
};
TORCH_MODULE(Gpt);

// x / rms(x) over the last dimension, eps as PyTorch's rms_norm default
// (the dtype's machine epsilon); in float32 at least, the result in x's
// dtype (ops::rms_norm_unscaled: libtorch's fused kernel on CUDA).
torch::Tensor rms_norm(const torch::Tensor& x);

} // namespace orchard::models
