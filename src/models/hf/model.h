// Hugging Face Llama-family causal language models read from the folder
// transformers saves: LlamaForCausalLM (Llama 2, 3, 3.1, 3.2, including
// rope_scaling of type llama3), Qwen2ForCausalLM (biases on q, k and v) and
// MistralForCausalLM. Module names equal the checkpoint keys
// (model.layers.N.self_attn.q_proj.weight, ...), so a state dict goes in and
// out unchanged, and a LoRA adapter's keys are PEFT's minus its
// "base_model.model." prefix (models/lora.h).
//
// The computation follows transformers' modeling_llama.py step for step, in
// the weights' dtype, so logits agree in float32 and in bfloat16:
//   h = embed_tokens[ids]
//   per layer: h += o_proj(attn(rope(q_proj(n1(h))), rope(k_proj(n1(h))),
//                               v_proj(n1(h))))
//              h += down_proj(silu(gate_proj(n2(h))) * up_proj(n2(h)))
//   logits = lm_head(norm(h))  (lm_head = embed_tokens when tied)
// RMSNorm(x) = w * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype);
// rope(x) = x * cos + rotate_half(x) * sin with angles t / theta^(2i/D),
// the llama3 scaling rescaling the low frequencies (Meta's Llama 3.1
// release: factor, low/high_freq_factor, original_max_position_embeddings).
//
// Weights are read from the mapped safetensors and copied once, to the
// device and dtype asked for; no float32 copy of a bfloat16 model is made.
#pragma once

#include "models/hf/config.h"
#include "models/language_model.h"
#include "models/lora_linear.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orchard::models {

struct HfRmsNormImpl : torch::nn::Module {
  HfRmsNormImpl(torch::Tensor w, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(HfRmsNorm);

struct LlamaAttentionImpl : torch::nn::Module {
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  Proj q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // After prepare_inference(): q, k and v stacked (one product for the
  // three), their weights views into it.
  torch::Tensor qkv_weight, qkv_bias;
};
TORCH_MODULE(LlamaAttention);

struct LlamaMlpImpl : torch::nn::Module {
  Proj gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  torch::Tensor gate_up_weight, gate_up_bias; // as qkv_weight
};
TORCH_MODULE(LlamaMlp);

struct LlamaLayerImpl : torch::nn::Module {
  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  HfRmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaLayer);

struct LlamaBodyImpl : torch::nn::Module {
  Weight embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  HfRmsNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

// Supplies each weight by checkpoint key with its expected shape; returns
// an undefined tensor for an optional one (lm_head when tied) it lacks.
using WeightSource = std::function<torch::Tensor(
    const std::string& name,
    const std::vector<int64_t>& shape,
    bool optional)>;

struct LlamaImpl : AdaptableModel {
  // `context`: the longest sequence this instance handles (rotary tables,
  // generation caches); 0 = max_position_embeddings.
  LlamaImpl(
      const HfModelConfig& config,
      const WeightSource& weights,
      int64_t context);

  torch::Tensor forward(const torch::Tensor& idx, KvCache* cache = nullptr)
      override;
  torch::Tensor decode_batch(
      const torch::Tensor& idx,
      const torch::Tensor& pos,
      BatchKvCache& cache,
      int64_t key_len = 0) override;
  // Cross-entropy computed over chunks of rows whose logits are recomputed
  // in the backward, so the (B*T, V) float32 logits never exist at once.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets)
      override;
  torch::Tensor logits_from(const torch::Tensor& idx, int64_t from) override;
  // Over chunks of completion positions through ops::linear_logprobs: the
  // (B, W, V) logits never exist, in the forward or the backward. The
  // default's path where lm_head carries an adapter or 4-bit codes.
  torch::Tensor token_logprobs(
      const torch::Tensor& idx,
      int64_t from,
      const torch::Tensor& cols,
      const torch::Tensor& targets,
      double temperature) override;
  int64_t max_seq_len() const override {
    return context_;
  }
  int64_t vocab_size() const override {
    return config.vocab_size;
  }

  // The last hidden states (B, T, C), after the final norm.
  torch::Tensor hidden(const torch::Tensor& idx, KvCache* cache = nullptr);
  torch::Tensor lm_weight() const; // lm_head's, or embed_tokens' when tied

  // AdaptableModel's, with the target names normalized first (q -> q_proj,
  // all-linear; UserError for a name that is not a Llama projection).
  int64_t add_lora(const LoraSpec& spec, torch::ScalarType dtype) override;
  // Adapters merged, then each layer's q/k/v and gate/up weights stacked
  // into one matrix (the originals become views of it: no extra memory),
  // so a token costs two products fewer kernels per layer. 4-bit layers
  // and layers keeping an adapter are left as they are.
  int64_t prepare_inference() override;
  // Every projection, by its module path ("model.layers.0.self_attn.q_proj").
  std::vector<std::pair<std::string, Proj>> projections() const override;
  // The weights with adapters folded in, under the checkpoint keys, in the
  // model's dtype (lm_head omitted when tied).
  std::vector<std::pair<std::string, torch::Tensor>> merged_state() const;

  HfModelConfig config;
  bool gradient_checkpointing = false;
  int64_t loss_chunk_rows = 0; // 0: about 16M logits a chunk (tests set it)
  int64_t logprob_chunk_rows = 0; // 0: about 4M logits a chunk (tests set it)
  LlamaBody model{nullptr};
  Proj lm_head{nullptr}; // null when tied to model.embed_tokens

 private:
  torch::Tensor layer_forward(
      int64_t i,
      torch::Tensor x,
      const torch::Tensor& cos,
      const torch::Tensor& sin,
      torch::Tensor* cache_k,
      torch::Tensor* cache_v);
  // (context, D) tables in `dtype`: [cos, cos] and [-sin, sin], made once
  // per dtype (layer_forward's rotation).
  std::pair<torch::Tensor, torch::Tensor> rope_tables(torch::ScalarType dtype);
  int64_t context_ = 0;
  torch::Tensor rope_cos_, rope_sin_; // (context, D/2) float32
  torch::Tensor rope_full_cos_, rope_full_sin_;
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> layer_fns_;
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> loss_fns_;
};
TORCH_MODULE(Llama);

// The rotary inverse frequencies (D/2) in float32, with llama3 scaling when
// the config asks for it (transformers' _compute_llama3_parameters).
torch::Tensor rope_inv_freq(const HfModelConfig& c);

struct LoadOptions {
  torch::Device device{torch::kCPU};
  // The dtype the weights are held in; nullopt = as stored.
  std::optional<torch::ScalarType> dtype;
  int64_t context = 4096; // 0: the model's max_position_embeddings
  // The layers' projections in 4 bits (NF4) for a frozen LoRA base.
  bool load_in_4bit = false;
  // Every weight a view into one allocation (a frozen LoRA base, never
  // prepared for inference or quantised): CUDA's caching allocator leaves
  // up to 1 MiB unsplit at the end of each large block, 113 MB over a 3B
  // model's 108 MLP matrices, which one block does not.
  bool one_allocation = false;
  // The weights stay views of the mapped safetensors files (CPU, dtype as
  // stored): nothing is copied, and the pages read are the page cache's,
  // which the kernel may drop. For one pass over the weights (export); a
  // dtype or device that needs a conversion still copies.
  bool map_weights = false;
};

// Reads config.json and the safetensors (one file or shards) of a model
// folder. UserError naming the folder for anything missing or mismatched.
Llama load_hf_model(const std::string& model_dir, const LoadOptions& opt);

} // namespace orchard::models
