#include "models/gpt.h"

#include "core/error.h"
#include "core/torch_compat.h"
#include "models/checkpointing.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/fused_train.h"
#include "ops/linear.h"
#include "ops/linear_cross_entropy.h"
#include "ops/rms_norm.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <utility>

namespace orchard::models {

constexpr int64_t kHeadDim = 128;      // nanochat's: width / 128 heads
constexpr int64_t kWidthPerLayer = 64; // nanochat's aspect ratio

std::string GptConfig::tag() const {
  // Appended rather than "d" + to_string(): GCC 12 at -O3 warns falsely on
  // the latter (GCC bug 105651).
  std::string tag = "d";
  tag += std::to_string(n_layer);
  return tag;
}

GptConfig resolve_gpt_config(
    int64_t depth,
    const ArchConfig& arch,
    int64_t max_seq_len,
    int64_t vocab_size) {
  GptConfig c;
  c.vocab_size = arch.vocab_size.value_or(vocab_size);
  c.n_layer = arch.n_layer.value_or(depth);
  c.n_embd = arch.n_embd.value_or(kWidthPerLayer * depth);
  c.n_head = arch.n_head.value_or(
      std::max<int64_t>(1, (c.n_embd + kHeadDim - 1) / kHeadDim));
  c.n_kv_head = arch.n_kv_head.value_or(c.n_head);
  c.max_seq_len = max_seq_len;
  if (c.vocab_size < vocab_size)
    throw UserError(
        "arch.vocab_size=" + std::to_string(c.vocab_size) +
        " is smaller than the tokenizer's " + std::to_string(vocab_size) +
        " tokens; leave it at auto or raise it.");
  if (c.n_embd % c.n_head != 0)
    throw UserError(
        "arch.n_embd=" + std::to_string(c.n_embd) +
        " is not divisible by arch.n_head=" + std::to_string(c.n_head) +
        "; pick a head count that divides the width.");
  if (c.head_dim() % 2 != 0)
    throw UserError(
        "the head dimension n_embd / n_head = " + std::to_string(c.head_dim()) +
        " is odd; rotary embeddings need an even one.");
  if (c.n_head % c.n_kv_head != 0)
    throw UserError(
        "arch.n_head=" + std::to_string(c.n_head) +
        " is not divisible by arch.n_kv_head=" + std::to_string(c.n_kv_head) +
        " (grouped-query attention shares each key/value head "
        "among n_head / n_kv_head query heads).");
  return c;
}

namespace {

// PyTorch's rms_norm default: the dtype's machine epsilon.
double norm_eps(const torch::Tensor& x) {
  return x.scalar_type() == torch::kFloat64
      ? std::numeric_limits<double>::epsilon()
      : std::numeric_limits<float>::epsilon();
}

} // namespace

torch::Tensor rms_norm(const torch::Tensor& x) {
  return ops::rms_norm_unscaled(x, norm_eps(x));
}

namespace {

// A bias-free projection (in -> out) that LoRA can wrap, first drawn as
// torch::nn::Linear draws its weight (Kaiming-uniform, a = sqrt(5)), so the
// random stream init_weights() then draws from is what it always was.
Proj lin(int64_t in, int64_t out) {
  torch::NoGradGuard no_grad;
  auto w = torch::empty({out, in});
  torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
  return Proj(w, torch::Tensor());
}

} // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c)
    : n_head(c.n_head), n_kv_head(c.n_kv_head), head_dim(c.head_dim()) {
  c_q = register_module("c_q", lin(c.n_embd, n_head * head_dim));
  c_k = register_module("c_k", lin(c.n_embd, n_kv_head * head_dim));
  c_v = register_module("c_v", lin(c.n_embd, n_kv_head * head_dim));
  c_proj = register_module("c_proj", lin(c.n_embd, c.n_embd));
}

bool CausalSelfAttentionImpl::plain_qkv() const {
  for (const auto* p : {&c_q, &c_k, &c_v})
    if ((*p)->has_lora() || (*p)->q4.defined())
      return false;
  return true;
}

torch::Tensor CausalSelfAttentionImpl::stacked_weight() const {
  if (qkv_weight.defined())
    return qkv_weight;
  if (merge_qkv_in_training && torch::GradMode::is_enabled() &&
      c_q->weight.requires_grad() && plain_qkv())
    return torch::cat({c_q->weight, c_k->weight, c_v->weight}, 0);
  return {};
}

std::array<torch::Tensor, 3> CausalSelfAttentionImpl::qkv(
    const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  const torch::Tensor stacked = stacked_weight();
  if (stacked.defined()) {
    auto y = ops::autocast_linear(x, stacked)
                 .split_with_sizes(
                     {n_head * head_dim,
                      n_kv_head * head_dim,
                      n_kv_head * head_dim},
                     -1);
    return {
        y[0].view({B, T, n_head, head_dim}),
        y[1].view({B, T, n_kv_head, head_dim}),
        y[2].view({B, T, n_kv_head, head_dim})};
  }
  return {
      c_q(x).view({B, T, n_head, head_dim}),
      c_k(x).view({B, T, n_kv_head, head_dim}),
      c_v(x).view({B, T, n_kv_head, head_dim})};
}

torch::Tensor CausalSelfAttentionImpl::forward(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    torch::Tensor* cache_k,
    torch::Tensor* cache_v) {
  const int64_t B = x.size(0), T = x.size(1);
  torch::Tensor q, k, v; // (B, T, H or Hkv, D), then (B, H or Hkv, T, D)
  if (const auto stacked = stacked_weight(); stacked.defined()) {
    // One product, then rotary, QK-norm and the split in one kernel on CUDA.
    auto out = ops::rotary_norm_qkv(
        ops::autocast_linear(x, stacked),
        n_head,
        n_kv_head,
        cos,
        sin,
        norm_eps(x));
    q = out[0], k = out[1], v = out[2];
  } else {
    auto out = qkv(x);
    q = rms_norm(ops::apply_rotary(out[0], cos, sin));
    k = rms_norm(ops::apply_rotary(out[1], cos, sin));
    v = out[2];
  }
  q = q.transpose(1, 2); // (B, H, T, D)
  k = k.transpose(1, 2); // (B, Hkv, T, D)
  v = v.transpose(1, 2);
  if (cache_k) {
    if (cache_k->defined()) {
      k = torch::cat({*cache_k, k}, 2);
      v = torch::cat({*cache_v, v}, 2);
    }
    *cache_k = k;
    *cache_v = v;
  }
  if (n_kv_head != n_head) { // each kv head serves n_head / n_kv_head queries
    k = k.repeat_interleave(n_head / n_kv_head, 1);
    v = v.repeat_interleave(n_head / n_kv_head, 1);
  }
  auto y = ops::causal_attention(q, k, v); // (B, H, T, D)
  y = y.transpose(1, 2).contiguous().view({B, T, n_head * head_dim});
  return c_proj(y);
}

torch::Tensor CausalSelfAttentionImpl::decode(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    torch::Tensor& cache_k,
    torch::Tensor& cache_v,
    const torch::Tensor& pos,
    int64_t key_len) {
  const int64_t B = x.size(0);
  auto [q, k, v] = qkv(x); // (B, 1, H or Hkv, D)
  // Rotary tables per row: (B, D/2) -> (B, 1, 1, D/2).
  auto rotate = [&](const torch::Tensor& t) {
    const int64_t d = t.size(-1) / 2;
    auto c = cos.view({B, 1, 1, d}).to(t.scalar_type());
    auto s = sin.view({B, 1, 1, d}).to(t.scalar_type());
    auto t1 = t.narrow(-1, 0, d), t2 = t.narrow(-1, d, d);
    return torch::cat({t1 * c + t2 * s, t2 * c - t1 * s}, -1);
  };
  q = rms_norm(rotate(q)).transpose(1, 2); // (B, H, 1, D)
  k = rms_norm(rotate(k));                 // (B, 1, Hkv, D)
  using torch::indexing::Slice;
  auto rows = torch::arange(B, pos.options());
  cache_k.index_put_(
      {rows, Slice(), pos},
      k.view({B, n_kv_head, head_dim}).to(cache_k.dtype()));
  cache_v.index_put_(
      {rows, Slice(), pos},
      v.view({B, n_kv_head, head_dim}).to(cache_v.dtype()));
  auto y = ops::decode_attention(q, cache_k, cache_v, pos, key_len);
  return c_proj(y.view({B, 1, n_head * head_dim}));
}

MlpImpl::MlpImpl(const GptConfig& c) {
  c_fc = register_module("c_fc", lin(c.n_embd, 4 * c.n_embd));
  c_proj = register_module("c_proj", lin(4 * c.n_embd, c.n_embd));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return c_proj(ops::relu_square(c_fc(x))); // one kernel each way on CUDA
}

BlockImpl::BlockImpl(const GptConfig& c) {
  attn = register_module("attn", CausalSelfAttention(c));
  mlp = register_module("mlp", Mlp(c));
}

torch::Tensor BlockImpl::forward(
    torch::Tensor x,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    torch::Tensor* cache_k,
    torch::Tensor* cache_v) {
  x = x + attn(rms_norm(x), cos, sin, cache_k, cache_v);
  x = x + mlp(rms_norm(x));
  return x;
}

std::pair<torch::Tensor, torch::Tensor> BlockImpl::forward_normed(
    const torch::Tensor& x,
    const torch::Tensor& h,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    torch::Tensor* cache_k,
    torch::Tensor* cache_v,
    torch::ScalarType next) {
  const double eps = norm_eps(x);
  const auto product = x.scalar_type() == torch::kFloat32
      ? compat::autocast_dtype(x.device().type())
      : x.scalar_type();
  auto [mid, normed] = ops::residual_add_rms_norm(
      x, attn(h, cos, sin, cache_k, cache_v), eps, product);
  return ops::residual_add_rms_norm(mid, mlp(normed), eps, next);
}

GptImpl::GptImpl(const GptConfig& c) : config(c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i)
    blocks->push_back(Block(c));
  lm_head = register_module(
      "lm_head",
      torch::nn::Linear(
          torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false)));
  // Rotary tables: angle(t, i) = t / base^(2i / D).
  const int64_t half = c.head_dim() / 2;
  auto inv_freq = torch::pow(
      c.rope_base,
      -torch::arange(0, half, torch::kFloat64) * 2.0 / double(c.head_dim()));
  auto t = torch::arange(c.max_seq_len, torch::kFloat64);
  auto angles = torch::outer(t, inv_freq); // (T, D/2)
  rope_cos = register_buffer("rope_cos", angles.cos().to(torch::kFloat32));
  rope_sin = register_buffer("rope_sin", angles.sin().to(torch::kFloat32));
  // Tests only: a trained matrix the forward never uses (what several
  // processes must leave as one process leaves it; distributed_test).
  if (std::getenv("ORCHARD_TEST_UNUSED_PARAMETER") && c.n_layer > 0)
    blocks[0]->as<BlockImpl>()->register_parameter(
        "test_unused", torch::ones({4, 4}));
  for (int64_t i = 0; i < c.n_layer; ++i)
    block_fns_.push_back([this, i](const torch::Tensor& x) {
      const int64_t T = x.size(1);
      return blocks[i]->as<BlockImpl>()->forward(
          x,
          rope_cos.narrow(0, 0, T),
          rope_sin.narrow(0, 0, T),
          nullptr,
          nullptr);
    });
  init_weights();
}

void GptImpl::init_weights() {
  torch::NoGradGuard no_grad;
  wte->weight.normal_(0.0, 1.0);
  for (const auto& m : blocks->children()) {
    auto block = m->as<BlockImpl>();
    for (auto* lin :
         {&block->attn->c_q,
          &block->attn->c_k,
          &block->attn->c_v,
          &block->mlp->c_fc}) {
      auto& w = (*lin)->weight; // (out, in)
      double fan_out = double(w.size(0)), fan_in = double(w.size(1));
      w.normal_(
          0.0, std::min(1.0, std::sqrt(fan_out / fan_in)) / std::sqrt(fan_in));
    }
    block->attn->c_proj->weight.zero_();
    block->mlp->c_proj->weight.zero_();
  }
  lm_head->weight.zero_();
}

int64_t GptImpl::prepare_inference() {
  const int64_t merged = AdaptableModel::prepare_inference();
  torch::NoGradGuard no_grad;
  for (const auto& b : *blocks) {
    auto& a = *b->as<BlockImpl>()->attn;
    if (!a.plain_qkv())
      continue;
    std::array<ProjImpl*, 3> ps = {a.c_q.get(), a.c_k.get(), a.c_v.get()};
    a.qkv_weight = torch::cat(
        {ps[0]->weight.detach(),
         ps[1]->weight.detach(),
         ps[2]->weight.detach()},
        0);
    int64_t row = 0;
    for (auto* p : ps) {
      p->weight.set_data(a.qkv_weight.narrow(0, row, p->out_features));
      row += p->out_features;
    }
  }
  return merged;
}

int64_t GptImpl::add_lora(const LoraSpec& spec, torch::ScalarType dtype) {
  // The stacked product (prepare_inference) would skip the adapters.
  for (const auto& b : *blocks)
    b->as<BlockImpl>()->attn->qkv_weight = torch::Tensor();
  return AdaptableModel::add_lora(spec, dtype);
}

std::vector<std::pair<std::string, Proj>> GptImpl::projections() const {
  std::vector<std::pair<std::string, Proj>> out;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto b = blocks->ptr(i)->as<BlockImpl>();
    const std::string at = "blocks." + std::to_string(i) + ".";
    out.push_back({at + "attn.c_q", b->attn->c_q});
    out.push_back({at + "attn.c_k", b->attn->c_k});
    out.push_back({at + "attn.c_v", b->attn->c_v});
    out.push_back({at + "attn.c_proj", b->attn->c_proj});
    out.push_back({at + "mlp.c_fc", b->mlp->c_fc});
    out.push_back({at + "mlp.c_proj", b->mlp->c_proj});
  }
  return out;
}

int64_t GptImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters())
    n += p.numel();
  return n;
}

torch::Tensor GptImpl::hidden(const torch::Tensor& idx, KvCache* cache) {
  const int64_t T = idx.size(1);
  const int64_t start = cache ? cache->length() : 0;
  if (start + T > config.max_seq_len)
    throw UserError(
        "the sequence (" + std::to_string(start + T) +
        " tokens) is longer than the model's "
        "max_seq_len " +
        std::to_string(config.max_seq_len) + ".");
  auto cos = rope_cos.narrow(0, start, T), sin = rope_sin.narrow(0, start, T);
  // The tables in the dtype q and k will have, once for all the layers
  // (apply_rotary's cast is then a no-op): autocast's where it is on for a
  // float32 model, the weights' otherwise.
  const torch::Tensor& w = blocks[0]->as<BlockImpl>()->attn->c_q->weight;
  if (w.defined() && w.numel() > 0 && w.is_floating_point()) {
    const auto rotary = w.scalar_type() == torch::kFloat32
        ? compat::autocast_dtype(idx.device().type())
        : w.scalar_type();
    cos = cos.to(rotary);
    sin = sin.to(rotary);
  }
  if (cache && cache->k.empty()) {
    cache->k.resize(config.n_layer);
    cache->v.resize(config.n_layer);
  }
  // Several processes may make wte's gradient from every process's rows
  // (ops/embedding.h); else it is torch::nn::Embedding's.
  auto x = rms_norm(ops::embedding(wte->weight, idx)); // (B, T, C)
  const bool recompute = config.gradient_checkpointing && is_training() &&
      !cache && torch::GradMode::is_enabled();
  if (recompute) {
    for (int64_t i = 0; i < config.n_layer; ++i)
      x = checkpointed(block_fns_[i], x);
    return rms_norm(x);
  }
  // Each residual add with the norm after it (one kernel each way on
  // CUDA); the norms the blocks' products read come out in the products'
  // dtype (autocast's), the last, the head's input, in the stream's.
  const auto stream = x.scalar_type();
  const auto product = stream == torch::kFloat32
      ? compat::autocast_dtype(idx.device().type())
      : stream;
  auto h = rms_norm(x);
  for (int64_t i = 0; i < config.n_layer; ++i)
    std::tie(x, h) = blocks[i]->as<BlockImpl>()->forward_normed(
        x,
        h,
        cos,
        sin,
        cache ? &cache->k[i] : nullptr,
        cache ? &cache->v[i] : nullptr,
        i + 1 < config.n_layer ? product : stream);
  return h;
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx, KvCache* cache) {
  auto logits = lm_head(hidden(idx, cache)); // (B, T, V)
  auto compute = logits.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                         : torch::kFloat32;
  logits = logits.to(compute);
  return config.softcap * torch::tanh(logits / config.softcap);
}

torch::Tensor GptImpl::loss(
    const torch::Tensor& idx,
    const torch::Tensor& targets) {
  auto h = hidden(idx, nullptr);
  auto flat = h.reshape({-1, h.size(-1)});
  auto tgt = targets.reshape({-1});
  auto total = ops::linear_cross_entropy(
      flat, lm_head->weight, tgt, /*chunk=*/0, config.softcap);
  return total / tgt.ne(-1).sum().clamp_min(1).to(total.scalar_type());
}

torch::Tensor GptImpl::decode_batch(
    const torch::Tensor& idx,
    const torch::Tensor& pos,
    BatchKvCache& cache,
    int64_t key_len) {
  const int64_t B = idx.size(0);
  if (cache.k.empty())
    throw std::invalid_argument("[decode_batch] empty cache");
  auto cos = rope_cos.index_select(0, pos), sin = rope_sin.index_select(0, pos);
  auto x = rms_norm(wte(idx.view({B, 1}))); // (B, 1, C)
  for (int64_t i = 0; i < config.n_layer; ++i) {
    auto* block = blocks[i]->as<BlockImpl>();
    x = x +
        block->attn->decode(
            rms_norm(x), cos, sin, cache.k[i], cache.v[i], pos, key_len);
    x = x + block->mlp(rms_norm(x));
  }
  auto logits = lm_head(rms_norm(x)).view({B, -1});
  auto compute = logits.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                         : torch::kFloat32;
  logits = logits.to(compute);
  return config.softcap * torch::tanh(logits / config.softcap);
}

} // namespace orchard::models
