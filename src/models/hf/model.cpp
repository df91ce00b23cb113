#include "models/hf/model.h"

#include "core/error.h"
#include "core/safetensors.h"
#include "core/torch_compat.h"
#include "models/checkpointing.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/linear_cross_entropy.h"
#include "ops/linear_logprobs.h"
#include "ops/nf4.h"
#include "ops/rms_norm.h"
#include "ops/rotary_cache.h"
#include "ops/silu_mul.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>

namespace orchard::models {
namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

} // namespace

HfRmsNormImpl::HfRmsNormImpl(torch::Tensor w, double e) : eps(e) {
  weight = register_parameter("weight", std::move(w));
}

torch::Tensor HfRmsNormImpl::forward(const torch::Tensor& x) {
  return ops::rms_norm(x, weight, eps);
}

torch::Tensor rope_inv_freq(const HfModelConfig& c) {
  const int64_t D = c.head_dim;
  auto inv = 1.0 /
      torch::pow(c.rope_theta,
                 torch::arange(0, D, 2, torch::kInt64).to(torch::kFloat32) /
                     double(D));
  if (c.rope_type != "llama3")
    return inv;
  const double old_len = double(c.original_max_position_embeddings);
  const double low_wavelen = old_len / c.low_freq_factor;
  const double high_wavelen = old_len / c.high_freq_factor;
  auto wavelen = 2 * M_PI / inv;
  auto scaled = torch::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
  auto smooth = (old_len / wavelen - c.low_freq_factor) /
      (c.high_freq_factor - c.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return torch::where(medium, smoothed, scaled);
}

LlamaImpl::LlamaImpl(
    const HfModelConfig& c,
    const WeightSource& get,
    int64_t context)
    : config(c) {
  context_ = context > 0 ? std::min(context, c.max_position_embeddings)
                         : c.max_position_embeddings;
  const int64_t C = c.hidden_size, D = c.head_dim;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  auto w = [&](const std::string& name, std::vector<int64_t> shape) {
    return get(name, shape, false);
  };
  auto proj = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    auto p = Proj(
        w(name + ".weight", {out, in}),
        bias ? w(name + ".bias", {out}) : torch::Tensor());
    if (c.load_in_4bit) // one full-precision matrix at a time
      p->quantize_4bit();
    return p;
  };
  model = register_module("model", LlamaBody());
  model->embed_tokens = model->register_module(
      "embed_tokens",
      Weight(w("model.embed_tokens.weight", {c.vocab_size, C})));
  model->layers = model->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto layer = LlamaLayer();
    layer->self_attn = layer->register_module("self_attn", LlamaAttention());
    auto& a = *layer->self_attn;
    a.n_head = H;
    a.n_kv_head = Hkv;
    a.head_dim = D;
    a.q_proj = a.register_module(
        "q_proj", proj(p + ".self_attn.q_proj", C, H * D, c.qkv_bias));
    a.k_proj = a.register_module(
        "k_proj", proj(p + ".self_attn.k_proj", C, Hkv * D, c.qkv_bias));
    a.v_proj = a.register_module(
        "v_proj", proj(p + ".self_attn.v_proj", C, Hkv * D, c.qkv_bias));
    a.o_proj = a.register_module(
        "o_proj", proj(p + ".self_attn.o_proj", H * D, C, c.o_bias));
    layer->mlp = layer->register_module("mlp", LlamaMlp());
    auto& m = *layer->mlp;
    const int64_t I = c.intermediate_size;
    m.gate_proj = m.register_module(
        "gate_proj", proj(p + ".mlp.gate_proj", C, I, c.mlp_bias));
    m.up_proj = m.register_module(
        "up_proj", proj(p + ".mlp.up_proj", C, I, c.mlp_bias));
    m.down_proj = m.register_module(
        "down_proj", proj(p + ".mlp.down_proj", I, C, c.mlp_bias));
    layer->input_layernorm = layer->register_module(
        "input_layernorm",
        HfRmsNorm(w(p + ".input_layernorm.weight", {C}), c.rms_norm_eps));
    layer->post_attention_layernorm = layer->register_module(
        "post_attention_layernorm",
        HfRmsNorm(
            w(p + ".post_attention_layernorm.weight", {C}), c.rms_norm_eps));
    model->layers->push_back(layer);
  }
  model->norm = model->register_module(
      "norm", HfRmsNorm(w("model.norm.weight", {C}), c.rms_norm_eps));
  auto head = get("lm_head.weight", {c.vocab_size, C}, c.tie_word_embeddings);
  if (head.defined() && c.tie_word_embeddings) {
    // A tied model saved with both keys: they hold the same values.
    head = torch::Tensor();
  }
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", Proj(head, torch::Tensor()));
  // Rotary tables, float32 as transformers computes them.
  auto inv = rope_inv_freq(c);
  auto t = torch::arange(context_, torch::kInt64).to(torch::kFloat32);
  auto angles = torch::outer(t, inv); // (context, D/2)
  auto dev = model->embed_tokens->weight.device();
  rope_cos_ = register_buffer("rope_cos", angles.cos().to(dev));
  rope_sin_ = register_buffer("rope_sin", angles.sin().to(dev));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layer_fns_.push_back([this, i](const torch::Tensor& x) {
      const auto [cos, sin] = rope_tables(x.scalar_type());
      const int64_t T = x.size(1);
      return layer_forward(
          i, x, cos.narrow(0, 0, T), sin.narrow(0, 0, T), nullptr, nullptr);
    });
}

torch::Tensor LlamaImpl::lm_weight() const {
  return lm_head.is_empty() ? model->embed_tokens->weight : lm_head->weight;
}

std::pair<torch::Tensor, torch::Tensor> LlamaImpl::rope_tables(
    torch::ScalarType dtype) {
  if (!rope_full_cos_.defined() || rope_full_cos_.scalar_type() != dtype ||
      rope_full_cos_.device() != rope_cos_.device()) {
    torch::NoGradGuard no_grad;
    rope_full_cos_ = torch::cat({rope_cos_, rope_cos_}, -1).to(dtype);
    rope_full_sin_ = torch::cat({-rope_sin_, rope_sin_}, -1).to(dtype);
  }
  return {rope_full_cos_, rope_full_sin_};
}

namespace {

// A layer's adapters cast to a half-precision base's dtype with one cast:
// the float32 leaves are concatenated, cast, and split into views, so the
// backward is one concatenation and one cast too, instead of one cast per
// tensor each way. Where q, k and v (or gate and up) all carry adapters
// without dropout, their A matrices are adjacent rows: one (3r, in) matrix,
// one product with the shared input.
struct LayerAdapters {
  torch::Tensor A[7], B[7];
  torch::Tensor A_qkv, A_gate_up; // fused where possible
};

LayerAdapters cast_adapters(
    const std::array<ProjImpl*, 7>& ps,
    torch::ScalarType dtype) {
  LayerAdapters out;
  const bool fuse_qkv = ps[0]->has_lora() && ps[1]->has_lora() &&
      ps[2]->has_lora() && ps[0]->dropout == 0 && ps[1]->dropout == 0 &&
      ps[2]->dropout == 0;
  const bool fuse_gu = ps[4]->has_lora() && ps[5]->has_lora() &&
      ps[4]->dropout == 0 && ps[5]->dropout == 0;
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> sizes;
  // Pieces: (proj index, is_A, fused group size)
  struct Piece {
    int proj;
    bool a;
    int group;
  };
  std::vector<Piece> pieces;
  for (int i = 0; i < 7; ++i) {
    if (!ps[size_t(i)]->has_lora())
      continue;
    const auto& A = ps[size_t(i)]->lora_A->weight;
    flat.push_back(A.reshape({-1}));
    const bool first_of_qkv = fuse_qkv && i == 0;
    const bool first_of_gu = fuse_gu && i == 4;
    if ((fuse_qkv && (i == 1 || i == 2)) || (fuse_gu && i == 5)) {
      sizes.back() += A.numel();
      continue;
    }
    sizes.push_back(A.numel());
    pieces.push_back({i, true, first_of_qkv ? 3 : first_of_gu ? 2 : 1});
  }
  for (int i = 0; i < 7; ++i) {
    if (!ps[size_t(i)]->has_lora())
      continue;
    const auto& B = ps[size_t(i)]->lora_B->weight;
    flat.push_back(B.reshape({-1}));
    sizes.push_back(B.numel());
    pieces.push_back({i, false, 1});
  }
  if (flat.empty())
    return out;
  auto parts = torch::cat(flat).to(dtype).split_with_sizes(sizes);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& pc = pieces[k];
    const auto& w = pc.a ? ps[size_t(pc.proj)]->lora_A->weight
                         : ps[size_t(pc.proj)]->lora_B->weight;
    if (!pc.a) {
      out.B[pc.proj] = parts[k].view(w.sizes());
    } else if (pc.group == 1) {
      out.A[pc.proj] = parts[k].view(w.sizes());
    } else {
      auto fused = parts[k].view({-1, w.size(1)});
      (pc.proj == 0 ? out.A_qkv : out.A_gate_up) = fused;
    }
  }
  return out;
}

// h2 W^T (+ b) as a fresh (N, out) tensor, with the adapter's
// scaling * a2 B^T added in place (no copy of the output).
torch::Tensor project(
    const ProjImpl& p,
    const torch::Tensor& h2,
    const torch::Tensor& a2,
    const torch::Tensor& B) {
  auto y = p.base(h2);
  if (a2.defined())
    y.addmm_(a2, B.t(), /*beta=*/1, /*alpha=*/p.scaling);
  return y;
}

// The (N, r) adapter input of projection i: a column block of the fused
// product, or its own (dropout applied per projection, as PEFT does).
torch::Tensor adapter_input(
    const ProjImpl& p,
    const torch::Tensor& h2,
    const torch::Tensor& A,
    bool training) {
  auto h = h2;
  if (p.dropout > 0 && training)
    h = F::dropout(h, F::DropoutFuncOptions().p(p.dropout).training(true));
  return at::mm(h, A.t());
}

// A layer's seven projections (q, k, v, o, gate, up, down) of inputs
// (..., in) -> (N, out). With float32 adapters on a half-precision base,
// the path above (one cast per layer, shared A products, in-place sums);
// otherwise each projection's own forward (PEFT's order of operations).
class LayerProjections {
 public:
  LayerProjections(
      LlamaLayerImpl& layer,
      torch::ScalarType dtype,
      bool training)
      : training_(training) {
    auto& a = *layer.self_attn;
    auto& m = *layer.mlp;
    ps_ = {
        a.q_proj.get(),
        a.k_proj.get(),
        a.v_proj.get(),
        a.o_proj.get(),
        m.gate_proj.get(),
        m.up_proj.get(),
        m.down_proj.get()};
    const bool half = dtype == torch::kBFloat16 || dtype == torch::kFloat16;
    for (auto* p : ps_)
      fused_ = fused_ ||
          (half && p->has_lora() && p->lora_A->weight.scalar_type() != dtype);
    if (fused_)
      ad_ = cast_adapters(ps_, dtype);
    stacked_[0] = {a.qkv_weight, a.qkv_bias};
    stacked_[4] = {m.gate_up_weight, m.gate_up_bias};
  }

  // {0, 1, 2}: q, k, v of one input; {3}: o; {4, 5}: gate, up; {6}: down.
  std::vector<torch::Tensor> operator()(
      const torch::Tensor& h,
      std::initializer_list<int> idx) const {
    std::vector<torch::Tensor> ys;
    auto h2 = h.reshape({-1, h.size(-1)});
    const int first = *idx.begin();
    if (idx.size() > 1 && stacked_[size_t(first)].first.defined()) {
      // prepare_inference()'s stacked weights: one product, split.
      const auto& [w, b] = stacked_[size_t(first)];
      auto y = ops::linear(h2, w, b);
      std::vector<int64_t> sizes;
      for (int k : idx)
        sizes.push_back(ps_[size_t(k)]->out_features);
      auto parts = y.split_with_sizes(sizes, 1);
      return std::vector<torch::Tensor>(parts.begin(), parts.end());
    }
    if (!fused_) {
      for (int k : idx)
        ys.push_back(ps_[size_t(k)]->forward(h2));
      return ys;
    }
    const auto& fusedA = first == 0 ? ad_.A_qkv
        : first == 4                ? ad_.A_gate_up
                                    : torch::Tensor();
    std::vector<torch::Tensor> as;
    if (fusedA.defined())
      as = at::mm(h2, fusedA.t())
               .split(ps_[size_t(first)]->lora_A->weight.size(0), 1);
    size_t j = 0;
    for (int k : idx) {
      const auto& p = *ps_[size_t(k)];
      torch::Tensor a2;
      if (fusedA.defined())
        a2 = as[j];
      else if (p.has_lora())
        a2 = adapter_input(p, h2, ad_.A[k], training_);
      ys.push_back(project(p, h2, a2, ad_.B[k]));
      ++j;
    }
    return ys;
  }

  // silu(gate) * up of one input: on the stacked weight one product
  // whose kernel, when decoding, also applies the activation
  // (ops::linear_silu_mul).
  torch::Tensor swiglu(const torch::Tensor& h) const {
    const auto& [w, b] = stacked_[4];
    if (w.defined())
      return ops::linear_silu_mul(h.reshape({-1, h.size(-1)}), w, b);
    auto gu = (*this)(h, {4, 5});
    return ops::silu_mul(gu[0], gu[1]);
  }

 private:
  std::array<ProjImpl*, 7> ps_{};
  std::array<std::pair<torch::Tensor, torch::Tensor>, 7> stacked_{};
  LayerAdapters ad_;
  bool fused_ = false, training_ = false;
};

} // namespace

torch::Tensor LlamaImpl::layer_forward(
    int64_t i,
    torch::Tensor x,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    torch::Tensor* cache_k,
    torch::Tensor* cache_v) {
  auto* layer = model->layers[i]->as<LlamaLayerImpl>();
  auto& a = *layer->self_attn;
  const int64_t B = x.size(0), T = x.size(1);
  LayerProjections run(*layer, x.scalar_type(), is_training());
  auto h = layer->input_layernorm(x);
  auto qkv = run(h, {0, 1, 2});
  auto c = cos.view({1, T, 1, -1}), s = sin.view({1, T, 1, -1});
  auto q =
      ops::rotate(qkv[0].view({B, T, a.n_head, a.head_dim}), c, s).transpose(1, 2);
  auto k = ops::rotate(qkv[1].view({B, T, a.n_kv_head, a.head_dim}), c, s)
               .transpose(1, 2);
  auto v = qkv[2].view({B, T, a.n_kv_head, a.head_dim}).transpose(1, 2);
  if (cache_k) {
    if (cache_k->defined()) {
      k = torch::cat({*cache_k, k}, 2);
      v = torch::cat({*cache_v, v}, 2);
    }
    *cache_k = k;
    *cache_v = v;
  }
  if (a.n_kv_head != a.n_head) {
    k = k.repeat_interleave(a.n_head / a.n_kv_head, 1);
    v = v.repeat_interleave(a.n_head / a.n_kv_head, 1);
  }
  auto y = ops::causal_attention(
      q, k, v, config.sliding_window.value_or(0)); // (B, H, T, D)
  y = y.transpose(1, 2).reshape({B, T, a.n_head * a.head_dim});
  x = x + run(y, {3})[0].view({B, T, -1});
  h = layer->post_attention_layernorm(x);
  auto gu = run(h, {4, 5});
  auto act = (torch::silu(gu[0]) * gu[1]).view({B, T, -1});
  return x + run(act, {6})[0].view({B, T, -1});
}

torch::Tensor LlamaImpl::hidden(const torch::Tensor& idx, KvCache* cache) {
  const int64_t T = idx.size(1);
  const int64_t start = cache ? cache->length() : 0;
  if (start + T > context_)
    throw UserError(
        "the sequence (" + std::to_string(start + T) +
        " tokens) is longer than this model's context of " +
        std::to_string(context_) + " tokens.");
  if (cache && cache->k.empty()) {
    cache->k.resize(config.num_hidden_layers);
    cache->v.resize(config.num_hidden_layers);
  }
  auto x = F::embedding(idx, model->embed_tokens->weight);
  const auto [cos_all, sin_all] = rope_tables(x.scalar_type());
  auto cos = cos_all.narrow(0, start, T), sin = sin_all.narrow(0, start, T);
  const bool recompute = gradient_checkpointing && is_training() && !cache &&
      torch::GradMode::is_enabled();
  if (recompute && !x.requires_grad())
    // A frozen embedding (LoRA): the recomputed layers still need a graph
    // to hand gradients to their adapters.
    x = x.detach().requires_grad_(true);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    x = recompute ? checkpointed(layer_fns_[size_t(i)], x)
                  : layer_forward(
                        i,
                        x,
                        cos,
                        sin,
                        cache ? &cache->k[size_t(i)] : nullptr,
                        cache ? &cache->v[size_t(i)] : nullptr);
  return model->norm(x);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, KvCache* cache) {
  auto h = hidden(idx, cache);
  auto logits = lm_head.is_empty() ? F::linear(h, lm_weight()) : lm_head(h);
  return logits.scalar_type() == torch::kFloat64 ? logits
                                                 : logits.to(torch::kFloat32);
}

torch::Tensor LlamaImpl::logits_from(const torch::Tensor& idx, int64_t from) {
  auto h = hidden(idx);
  h = h.narrow(1, from, h.size(1) - from);
  auto logits = lm_head.is_empty() ? F::linear(h, lm_weight()) : lm_head(h);
  return logits.scalar_type() == torch::kFloat64 ? logits
                                                 : logits.to(torch::kFloat32);
}

torch::Tensor LlamaImpl::token_logprobs(
    const torch::Tensor& idx,
    int64_t from,
    const torch::Tensor& cols,
    const torch::Tensor& targets,
    double temperature) {
  if (!lm_head.is_empty() && (lm_head->has_lora() || !lm_head->weight.defined() ||
                              lm_head->weight.numel() == 0))
    return LanguageModel::token_logprobs(idx, from, cols, targets, temperature);
  auto h = hidden(idx); // (B, T, C)
  const int64_t B = cols.size(0), W = cols.size(1), C = h.size(-1);
  auto rows = torch::arange(B, cols.options()).unsqueeze(1).expand_as(cols);
  auto picked = h.index({rows, cols}).reshape({B * W, C});
  const int64_t chunk = logprob_chunk_rows > 0
      ? logprob_chunk_rows
      : std::max<int64_t>(1, (int64_t(1) << 22) / config.vocab_size);
  return ops::linear_logprobs(
             picked, lm_weight(), targets.reshape({-1}), temperature, chunk)
      .view({B, W});
}

torch::Tensor LlamaImpl::loss(
    const torch::Tensor& idx,
    const torch::Tensor& targets) {
  auto h = hidden(idx); // (B, T, C)
  const int64_t C = h.size(-1);
  auto flat = h.reshape({-1, C});
  auto tgt = targets.reshape({-1});
  auto counted = tgt.ne(-1).sum();
  // Chunks of about 16M logits: at a vocabulary of 128K, 128 rows each.
  const int64_t rows = flat.size(0);
  const int64_t chunk = loss_chunk_rows > 0
      ? loss_chunk_rows
      : std::max<int64_t>(
            1, std::min<int64_t>(rows, (int64_t(1) << 24) / config.vocab_size));
  const bool training = is_training() && torch::GradMode::is_enabled();
  if (training && !lm_weight().requires_grad()) { // a frozen head (LoRA)
    auto total = ops::linear_cross_entropy(flat, lm_weight(), tgt, chunk);
    return total / counted.clamp_min(1).to(total.scalar_type());
  }
  loss_fns_.clear();
  // checkpointed() keeps a pointer to its function: no reallocation.
  loss_fns_.reserve(size_t((rows + chunk - 1) / chunk));
  torch::Tensor total;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    auto t = tgt.narrow(0, r0, n);
    auto fn = [this, t](const torch::Tensor& x) {
      auto logits = lm_head.is_empty() ? F::linear(x, lm_weight()) : lm_head(x);
      // float32 at least: half-precision logits lose the loss's digits.
      if (logits.scalar_type() != torch::kFloat64)
        logits = logits.to(torch::kFloat32);
      return F::cross_entropy(
          logits,
          t,
          F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
    };
    auto part = flat.narrow(0, r0, n);
    torch::Tensor l;
    if (training && rows > chunk) {
      loss_fns_.push_back(fn);
      l = checkpointed(loss_fns_.back(), part);
    } else {
      l = fn(part);
    }
    total = total.defined() ? total + l : l;
  }
  return total / counted.clamp_min(1).to(total.scalar_type());
}

torch::Tensor LlamaImpl::decode_batch(
    const torch::Tensor& idx,
    const torch::Tensor& pos,
    BatchKvCache& cache,
    int64_t key_len) {
  const int64_t B = idx.size(0);
  if (cache.k.empty())
    throw std::invalid_argument("[decode_batch] empty cache");
  auto x = F::embedding(idx.view({B, 1}), model->embed_tokens->weight);
  const auto [cos_all, sin_all] = rope_tables(x.scalar_type());
  // Each sublayer's output is added to x by the norm after it (one kernel
  // for the add and the norm on CUDA: ops::add_rms_norm).
  torch::Tensor pending, h;
  auto add_then_norm = [&](const torch::Tensor& out, HfRmsNorm& norm) {
    std::tie(x, h) = ops::add_rms_norm(x, out, norm->weight, norm->eps);
  };
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto* layer = model->layers[i]->as<LlamaLayerImpl>();
    LayerProjections run(*layer, x.scalar_type(), is_training());
    if (pending.defined())
      add_then_norm(pending, layer->input_layernorm);
    else
      h = layer->input_layernorm(x);
    auto qkv = run(h, {0, 1, 2}); // each (B, heads * D)
    auto& ck = cache.k[size_t(i)];
    auto& cv = cache.v[size_t(i)];
    auto q = ops::rotary_cache_write(
        qkv[0], qkv[1], qkv[2], cos_all, sin_all, pos, ck, cv); // (B, H, 1, D)
    auto y = ops::decode_attention(
        q, ck, cv, pos, key_len, config.sliding_window.value_or(0));
    add_then_norm(
        run(y, {3})[0].view({B, 1, -1}), layer->post_attention_layernorm);
    pending = run(run.swiglu(h), {6})[0].view({B, 1, -1});
  }
  if (pending.defined())
    add_then_norm(pending, model->norm);
  else
    h = model->norm(x);
  auto h2 = h.view({B, -1});
  auto logits = lm_head.is_empty() ? ops::linear(h2, lm_weight()) : lm_head(h2);
  return logits.scalar_type() == torch::kFloat64 ? logits
                                                 : logits.to(torch::kFloat32);
}

int64_t LlamaImpl::prepare_inference() {
  const int64_t merged = AdaptableModel::prepare_inference();
  torch::NoGradGuard no_grad;
  // The stacked matrix, and each projection's weight (and bias) made a
  // view of its rows.
  auto stack = [](const std::vector<ProjImpl*>& ps,
                  torch::Tensor& weight,
                  torch::Tensor& bias) {
    for (auto* p : ps)
      if (p->has_lora() || p->q4.defined() ||
          p->bias.defined() != ps[0]->bias.defined())
        return;
    std::vector<torch::Tensor> ws, bs;
    for (auto* p : ps) {
      ws.push_back(p->weight.detach());
      if (p->bias.defined())
        bs.push_back(p->bias.detach());
    }
    weight = torch::cat(ws, 0);
    if (!bs.empty())
      bias = torch::cat(bs, 0);
    int64_t row = 0;
    for (auto* p : ps) {
      const int64_t n = p->out_features;
      p->weight.set_data(weight.narrow(0, row, n));
      if (bias.defined())
        p->bias.set_data(bias.narrow(0, row, n));
      row += n;
    }
  };
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto* layer = model->layers[i]->as<LlamaLayerImpl>();
    auto& a = *layer->self_attn;
    auto& m = *layer->mlp;
    stack(
        {a.q_proj.get(), a.k_proj.get(), a.v_proj.get()},
        a.qkv_weight,
        a.qkv_bias);
    stack(
        {m.gate_proj.get(), m.up_proj.get()}, m.gate_up_weight, m.gate_up_bias);
  }
  return merged;
}

std::vector<std::pair<std::string, Proj>> LlamaImpl::projections() const {
  std::vector<std::pair<std::string, Proj>> out;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto* layer = model->layers->ptr(size_t(i))->as<LlamaLayerImpl>();
    auto& a = *layer->self_attn;
    auto& m = *layer->mlp;
    out.push_back({p + ".self_attn.q_proj", a.q_proj});
    out.push_back({p + ".self_attn.k_proj", a.k_proj});
    out.push_back({p + ".self_attn.v_proj", a.v_proj});
    out.push_back({p + ".self_attn.o_proj", a.o_proj});
    out.push_back({p + ".mlp.gate_proj", m.gate_proj});
    out.push_back({p + ".mlp.up_proj", m.up_proj});
    out.push_back({p + ".mlp.down_proj", m.down_proj});
  }
  return out;
}

int64_t LlamaImpl::add_lora(const LoraSpec& spec, torch::ScalarType dtype) {
  // The stacked products (prepare_inference) would skip the adapters.
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto* layer = model->layers[i]->as<LlamaLayerImpl>();
    layer->self_attn->qkv_weight = layer->self_attn->qkv_bias = torch::Tensor();
    layer->mlp->gate_up_weight = layer->mlp->gate_up_bias = torch::Tensor();
  }
  LoraSpec named = spec;
  named.target_modules = normalize_target_modules(spec.target_modules);
  return AdaptableModel::add_lora(named, dtype);
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaImpl::merged_state()
    const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::map<std::string, Proj> projs;
  for (auto& [name, p] : projections())
    projs.emplace(name, p);
  for (const auto& named : named_parameters()) {
    const std::string& key = named.key();
    if (key.find(".lora_") != std::string::npos)
      continue;
    const std::string owner = key.substr(0, key.rfind('.'));
    auto it = projs.find(owner);
    if (it != projs.end() && key.ends_with(".weight"))
      out.push_back({key, it->second->merged_weight()});
    else
      out.push_back({key, named.value().detach()});
  }
  return out;
}

Llama load_hf_model(const std::string& dir, const LoadOptions& opt) {
  HfModelConfig c = read_hf_config(dir);
  // transformers' names: one model.safetensors, or shards listed in
  // model.safetensors.index.json. Other .safetensors files in the folder
  // (adapters, references) are not the model's.
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(index) && !fs::exists(single))
    throw UserError(
        "model folder '" + dir +
        "' holds no weights: it needs model.safetensors, or shards with "
        "model.safetensors.index.json (PyTorch .bin files are not read; "
        "convert them with save_pretrained(safe_serialization=True)).");
  safetensors::Reader reader = safetensors::Reader::open(
      fs::exists(index) ? index.string() : single.string());
  const torch::ScalarType dtype = opt.dtype.value_or(c.dtype);
  // One block for the weights (LoadOptions::one_allocation): the stored
  // weights' and biases' sizes, a tied model's stray lm_head left out, each
  // aligned to 256 bytes; anything past it gets its own allocation.
  torch::Tensor block;
  int64_t used = 0;
  constexpr int64_t kAlign = 256;
  auto aligned = [](int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  if (opt.one_allocation && !opt.load_in_4bit) {
    int64_t total = 0;
    for (const auto& name : reader.names()) {
      const bool weight = name.ends_with(".weight") || name.ends_with(".bias");
      if (!weight || (c.tie_word_embeddings && name == "lm_head.weight"))
        continue;
      int64_t n = 1;
      for (auto d : reader.info(name).shape)
        n *= d;
      total += aligned(n * int64_t(torch::elementSize(dtype)));
    }
    block = torch::empty({total}, torch::TensorOptions().dtype(torch::kUInt8).device(opt.device));
  }
  WeightSource get = [&](const std::string& name,
                         const std::vector<int64_t>& shape,
                         bool optional) -> torch::Tensor {
    if (!reader.contains(name)) {
      if (optional)
        return {};
      throw UserError(
          "model folder '" + dir + "' lacks the weight '" + name + "' a " +
          c.architecture +
          " needs; the files are incomplete or of another architecture.");
    }
    auto t = reader.get(name);
    if (t.sizes() != torch::IntArrayRef(shape))
      throw UserError(
          "weight '" + name + "' in '" + dir + "' has shape " +
          c10::str(t.sizes()) + " but config.json implies " +
          c10::str(torch::IntArrayRef(shape)) + ".");
    const int64_t bytes = t.numel() * int64_t(torch::elementSize(dtype));
    if (block.defined() && used + bytes <= block.numel()) {
      auto out = block.narrow(0, used, bytes).view(dtype).view(t.sizes());
      used += aligned(bytes);
      out.copy_(t);
      return out.detach(); // a leaf of its own, not a view autograd tracks
    }
    if (opt.map_weights && opt.device.is_cpu() && t.scalar_type() == dtype)
      return t;
    // One copy, from the mapped file to the device and dtype asked for.
    auto out = t.to(opt.device, dtype, /*non_blocking=*/false, /*copy=*/true);
    return out;
  };
  c.load_in_4bit = opt.load_in_4bit;
  Llama model(c, get, opt.context);
  model->config.dtype = dtype;
  return model;
}

} // namespace orchard::models
