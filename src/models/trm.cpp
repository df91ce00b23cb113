#include "models/trm.h"

#include "core/error.h"
#include "core/torch_compat.h"
#include "ops/fused_train.h"
#include "ops/rms_norm.h"

#include <cmath>

namespace orchard::models {
namespace {

namespace F = torch::nn::functional;

// Upstream scales learned positions by 1/sqrt(2) so that token + position
// keeps the variance of one of them.
constexpr double kInvSqrt2 = 0.707106781;
// The Q-head starts at "do not halt" (sigmoid(-5) ~ 0.007).
constexpr double kQHeadBias = -5.0;
// The GPU's matrix kernels want rows of a multiple of 8 values.
constexpr int64_t kPositionMultiple = 8;
// The truncated normal is cut at two of its standard deviations.
constexpr double kTruncation = 2.0;

torch::nn::Linear linear(int64_t in, int64_t out, bool bias = false) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  trunc_normal_(l->weight, 1.0 / std::sqrt(double(in)));
  if (bias)
    l->bias.zero_();
  return l;
}

// Where a step needs float32 (norms, rotary, softmax, the Q-head), lower
// precisions are raised to it and float64 stays (the reference tests).
torch::ScalarType at_least_float32(torch::ScalarType t) {
  return c10::promoteTypes(t, torch::kFloat32);
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

} // namespace

int64_t TrmConfig::prefix_len() const {
  if (puzzle_emb_ndim <= 0)
    return 0;
  if (puzzle_emb_len > 0)
    return puzzle_emb_len;
  return (puzzle_emb_ndim + hidden_size - 1) / hidden_size;
}

void TrmConfig::validate() const {
  auto need = [](bool ok, const std::string& why) {
    if (!ok)
      throw UserError(why);
  };
  need(seq_len > 0 && vocab_size > 1, "the puzzles give no cells to learn");
  need(hidden_size > 0, "arch.hidden_size must be positive, such as 512");
  need(
      H_cycles >= 1 && L_cycles >= 1 && L_layers >= 1,
      "arch.H_cycles, arch.L_cycles and arch.L_layers must be at least 1 "
      "(the paper: 3, 6, 2)");
  need(halt_max_steps >= 1, "arch.halt_max_steps must be at least 1 (16)");
  need(
      pos_encodings == "rope" || pos_encodings == "learned" ||
          pos_encodings == "none",
      "arch.pos_encodings is rope, learned or none");
  need(
      puzzle_emb_ndim <= prefix_len() * hidden_size,
      "arch.puzzle_emb_ndim=" + std::to_string(puzzle_emb_ndim) +
          " does not fit arch.puzzle_emb_len=" +
          std::to_string(puzzle_emb_len) + " positions of " +
          std::to_string(hidden_size) +
          "; raise puzzle_emb_len or set it to 0 (as many as needed)");
  if (!mlp_t) {
    need(
        num_heads > 0 && hidden_size % num_heads == 0,
        "arch.hidden_size=" + std::to_string(hidden_size) +
            " is not a multiple of arch.num_heads=" +
            std::to_string(num_heads));
    need(
        pos_encodings != "rope" || (hidden_size / num_heads) % 2 == 0,
        "rotary positions need an even head width (hidden_size / "
        "num_heads)");
  }
  need(
      !(mlp_t && causal),
      "arch.mlp_t=true mixes every position into every other, so it cannot "
      "train next-token prediction (causal); use attention (arch.mlp_t="
      "false) for the chat variant");
}

nlohmann::json to_json(const TrmConfig& c) {
  return {
      {"seq_len", c.seq_len},
      {"vocab_size", c.vocab_size},
      {"num_puzzle_identifiers", c.num_puzzle_identifiers},
      {"puzzle_emb_ndim", c.puzzle_emb_ndim},
      {"puzzle_emb_len", c.puzzle_emb_len},
      {"H_cycles", c.H_cycles},
      {"L_cycles", c.L_cycles},
      {"L_layers", c.L_layers},
      {"hidden_size", c.hidden_size},
      {"num_heads", c.num_heads},
      {"expansion", c.expansion},
      {"pos_encodings", c.pos_encodings},
      {"mlp_t", c.mlp_t},
      {"causal", c.causal},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"halt_max_steps", c.halt_max_steps},
      {"halt_exploration_prob", c.halt_exploration_prob},
      {"no_ACT_continue", c.no_ACT_continue}};
}

TrmConfig trm_config_from_json(const nlohmann::json& j) {
  TrmConfig c;
  c.seq_len = j.at("seq_len");
  c.vocab_size = j.at("vocab_size");
  c.num_puzzle_identifiers = j.at("num_puzzle_identifiers");
  c.puzzle_emb_ndim = j.at("puzzle_emb_ndim");
  c.puzzle_emb_len = j.at("puzzle_emb_len");
  c.H_cycles = j.at("H_cycles");
  c.L_cycles = j.at("L_cycles");
  c.L_layers = j.at("L_layers");
  c.hidden_size = j.at("hidden_size");
  c.num_heads = j.at("num_heads");
  c.expansion = j.at("expansion");
  c.pos_encodings = j.at("pos_encodings");
  c.mlp_t = j.at("mlp_t");
  c.causal = j.value("causal", false);
  c.rms_norm_eps = j.at("rms_norm_eps");
  c.rope_theta = j.at("rope_theta");
  c.halt_max_steps = j.at("halt_max_steps");
  c.halt_exploration_prob = j.at("halt_exploration_prob");
  c.no_ACT_continue = j.at("no_ACT_continue");
  return c;
}

int64_t swiglu_width(int64_t h, double expansion) {
  const int64_t w = int64_t(std::llround(expansion * double(h) * 2.0 / 3.0));
  constexpr int64_t kMultiple = 256;
  return (w + kMultiple - 1) / kMultiple * kMultiple;
}

void trunc_normal_(torch::Tensor& t, double std) {
  torch::NoGradGuard no_grad;
  if (std == 0) {
    t.zero_();
    return;
  }
  // The variance of a standard normal cut at +-2 is 1 - 2*2*phi(2) /
  // (Phi(2) - Phi(-2)); dividing by its root makes the cut values' std
  // `std`. Drawn by inverting erf over the cut's range.
  const double sqrt2 = std::sqrt(2.0);
  const double a = std::erf(-kTruncation / sqrt2);
  const double b = std::erf(kTruncation / sqrt2);
  const double z = (b - a) / 2;
  const double pdf =
      std::exp(-0.5 * kTruncation * kTruncation) / std::sqrt(2 * M_PI);
  const double comp_std = std / std::sqrt(1 - (2 * kTruncation * pdf) / z);
  t.uniform_(a, b);
  t.erfinv_();
  t.mul_(sqrt2 * comp_std);
  t.clamp_(-kTruncation * comp_std, kTruncation * comp_std);
}

TrmSwiGluImpl::TrmSwiGluImpl(int64_t in, double expansion) {
  const int64_t inner = swiglu_width(in, expansion);
  gate_up_proj = register_module("gate_up_proj", linear(in, 2 * inner));
  down_proj = register_module("down_proj", linear(inner, in));
}

// silu(gate) * up for gate and up the two halves of `gate_up` (2I, in).
// With the fused kernel, one product and the halves read in place. Without
// it, two products: each comes out contiguous, where halves of one product
// are strided and take the slow elementwise kernels (measured on an H100,
// a fifth of the step), and the backward needs no concatenation.
namespace {
torch::Tensor swiglu_hidden(
    const torch::Tensor& x,
    const torch::Tensor& gate_up) {
  if (ops::silu_mul_halves_is_fused(x))
    return ops::silu_mul_halves(F::linear(x, gate_up), -1);
  const int64_t inner = gate_up.size(0) / 2;
  return torch::silu(F::linear(x, gate_up.narrow(0, 0, inner))) *
      F::linear(x, gate_up.narrow(0, inner, inner));
}

// w (rows, cols) times each puzzle's matrix x[b] (cols, D): (B, rows, D),
// one batched product over w broadcast, in x's dtype; no transposes of x.
torch::Tensor times_each(const torch::Tensor& w, const torch::Tensor& x) {
  return torch::bmm(
      w.to(x.scalar_type()).unsqueeze(0).expand({x.size(0), -1, -1}), x);
}
} // namespace

torch::Tensor TrmSwiGluImpl::forward(const torch::Tensor& x) {
  return down_proj(swiglu_hidden(x, gate_up_proj->weight));
}

TrmAttentionImpl::TrmAttentionImpl(int64_t hidden, int64_t heads_, bool causal_)
    : heads(heads_), causal(causal_) {
  qkv_proj = register_module("qkv_proj", linear(hidden, 3 * hidden));
  o_proj = register_module("o_proj", linear(hidden, hidden));
}

torch::Tensor TrmAttentionImpl::forward(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  const int64_t hd = D / heads;
  auto qkv = qkv_proj(x).view({B, T, 3 * heads, hd});
  auto q = qkv.narrow(2, 0, heads);
  auto k = qkv.narrow(2, heads, heads);
  auto v = qkv.narrow(2, 2 * heads, heads);
  if (cos.defined()) {
    // (T, hd) over (B, T, H, hd), in float32 at least.
    const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
    const auto dt = q.scalar_type(), work = at_least_float32(dt);
    auto qf = q.to(work), kf = k.to(work);
    q = (qf * c + rotate_half(qf) * s).to(dt);
    k = (kf * c + rotate_half(kf) * s).to(dt);
  }
  q = q.transpose(1, 2); // (B, H, T, hd)
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  torch::Tensor y;
  if (compat::has_fused_attention()) {
    y = compat::fused_attention(q, k, v, c10::nullopt, causal);
  } else {
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
    if (causal)
      scores = scores.masked_fill(
          torch::ones({T, T}, torch::dtype(torch::kBool).device(x.device()))
              .triu(1),
          -std::numeric_limits<double>::infinity());
    y = torch::matmul(
        torch::softmax(scores.to(at_least_float32(scores.scalar_type())), -1)
            .to(v.dtype()),
        v);
  }
  return o_proj(y.transpose(1, 2).reshape({B, T, D}));
}

TrmBlockImpl::TrmBlockImpl(const TrmConfig& c)
    : eps(c.rms_norm_eps), positions(c.positions()) {
  if (c.mlp_t)
    mlp_t = register_module("mlp_t", TrmSwiGlu(c.positions(), c.expansion));
  else
    self_attn = register_module(
        "self_attn", TrmAttention(c.hidden_size, c.num_heads, c.causal));
  mlp = register_module("mlp", TrmSwiGlu(c.hidden_size, c.expansion));
}

torch::Tensor TrmBlockImpl::forward(
    torch::Tensor h,
    const torch::Tensor& cos,
    const torch::Tensor& sin) {
  if (mlp_t) {
    // Across positions, in h's layout (B, T', D): the SwiGLU's weights
    // multiply each puzzle's matrix from the left, (2I, T') x (T', D), with
    // zero weights for the T' - T padded positions; the norm then runs
    // over the T real positions (the padding stays zero).
    const int64_t pad = h.size(1) - positions;
    const auto gu = times_each(
        F::pad(mlp_t->gate_up_proj->weight, F::PadFuncOptions({0, pad})),
        h); // (B, 2I, D)
    const auto y = times_each(
        F::pad(mlp_t->down_proj->weight, F::PadFuncOptions({0, 0, 0, pad})),
        ops::silu_mul_halves(gu, 1)); // (B, T', D)
    h = ops::add_rms_norm_unscaled(h, y, 1, eps, positions);
  } else {
    h = ops::add_rms_norm_unscaled(h, self_attn(h, cos, sin), -1, eps);
  }
  return ops::add_rms_norm_unscaled(h, mlp(h), -1, eps);
}

TrmImpl::TrmImpl(TrmConfig c) : config(std::move(c)) {
  config.validate();
  const int64_t D = config.hidden_size, T = config.positions();
  const double embed_std = 1.0 / std::sqrt(double(D));
  embed_tokens = register_module(
      "embed_tokens", torch::nn::Embedding(config.vocab_size, D));
  trunc_normal_(embed_tokens->weight, embed_std);
  if (config.pos_encodings == "learned") {
    embed_pos = register_module("embed_pos", torch::nn::Embedding(T, D));
    trunc_normal_(embed_pos->weight, embed_std);
  }
  if (config.puzzle_emb_ndim > 0)
    puzzle_emb = register_parameter(
        "puzzle_emb",
        torch::zeros({config.num_puzzle_identifiers, config.puzzle_emb_ndim}));
  lm_head = register_module("lm_head", linear(D, config.vocab_size));
  q_head = register_module("q_head", linear(D, 2, /*bias=*/true));
  {
    torch::NoGradGuard no_grad;
    q_head->weight.zero_();
    q_head->bias.fill_(kQHeadBias);
  }
  L_level = register_module("L_level", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.L_layers; ++i)
    L_level->push_back(TrmBlock(config));
  H_init = torch::empty({D});
  L_init = torch::empty({D});
  trunc_normal_(H_init, 1.0);
  trunc_normal_(L_init, 1.0);
  H_init = register_buffer("H_init", H_init);
  L_init = register_buffer("L_init", L_init);
  if (config.pos_encodings == "rope" && !config.mlp_t) {
    const int64_t hd = D / config.num_heads;
    auto inv_freq = 1.0 /
        torch::pow(config.rope_theta,
                   torch::arange(0, hd, 2, torch::kFloat64) / double(hd));
    auto freqs = torch::outer(torch::arange(T, torch::kFloat64), inv_freq);
    auto emb = torch::cat({freqs, freqs}, -1);
    cos = register_buffer("cos", emb.cos().to(torch::kFloat32));
    sin = register_buffer("sin", emb.sin().to(torch::kFloat32));
  }
}

torch::Tensor TrmImpl::input_embeddings(
    const torch::Tensor& inputs,
    const torch::Tensor& puzzle_ids) {
  const int64_t D = config.hidden_size, P = config.prefix_len();
  auto emb = embed_tokens(inputs); // (B, S, D)
  if (P > 0) {
    auto pe = puzzle_emb.index_select(0, puzzle_ids); // (B, ndim)
    const int64_t pad = P * D - pe.size(1);
    if (pad > 0)
      pe = torch::cat({pe, pe.new_zeros({pe.size(0), pad})}, 1);
    emb = torch::cat({pe.view({-1, P, D}).to(emb.dtype()), emb}, 1);
  }
  if (embed_pos)
    emb = kInvSqrt2 * (emb + embed_pos->weight);
  return std::sqrt(double(D)) * emb;
}

torch::Tensor TrmImpl::net(torch::Tensor h, const torch::Tensor& injection) {
  h = h + injection;
  for (const auto& layer : *L_level)
    h = layer->as<TrmBlock>()->forward(h, cos, sin);
  return h;
}

std::pair<torch::Tensor, torch::Tensor> TrmImpl::initial_carry(int64_t B) {
  const int64_t T = config.positions(), D = config.hidden_size;
  return {
      H_init.view({1, 1, D}).expand({B, T, D}).clone(),
      L_init.view({1, 1, D}).expand({B, T, D}).clone()};
}

TrmStepOutput TrmImpl::step(
    const torch::Tensor& z_H0,
    const torch::Tensor& z_L0,
    const torch::Tensor& inputs,
    const torch::Tensor& puzzle_ids) {
  auto x = input_embeddings(inputs, puzzle_ids);
  torch::Tensor z_H = z_H0, z_L = z_L0;
  // T = 97 (Sudoku's 16 + 81) makes the position-mixing products' rows 97
  // values long, which the GPU's fast matrix kernels cannot take (they
  // read 8 aligned values at a time): measured on an H100, a third of the
  // step. So on the GPU the states run with zero rows after the T
  // positions, up to a multiple of 8: zero they stay (no weight reads
  // them, the norms map zero to zero), and the real rows get the same
  // sums. Cut off again below.
  const int64_t T = x.size(1);
  const int64_t pad =
      config.mlp_t && (x.is_cuda() || align_positions_everywhere)
      ? (kPositionMultiple - T % kPositionMultiple) % kPositionMultiple
      : 0;
  if (pad > 0) {
    const auto rows = F::PadFuncOptions({0, 0, 0, pad});
    x = F::pad(x, rows);
    z_H = F::pad(z_H, rows);
    z_L = F::pad(z_L, rows);
  }
  // Under autocast the states and the injection stay in its dtype (as
  // upstream runs in bfloat16), not in float32 with products cast down.
  const auto dt = compat::autocast_dtype(x.device().type());
  if (dt != torch::kFloat32) {
    x = x.to(dt);
    z_H = z_H.to(dt);
    z_L = z_L.to(dt);
  }
  {
    torch::NoGradGuard no_grad; // every cycle but the last
    for (int64_t h = 0; h + 1 < config.H_cycles; ++h) {
      const auto injection = z_H + x; // the same for the L cycles
      for (int64_t l = 0; l < config.L_cycles; ++l)
        z_L = net(z_L, injection);
      z_H = net(z_H, z_L);
    }
  }
  // Under autocast the weights' casts made above carry no gradient; were
  // they reused from autocast's cache below, the loss would not reach the
  // weights (PyTorch issue 112583, fixed only in recent releases).
  compat::clear_autocast_cache();
  const auto injection = z_H + x;
  for (int64_t l = 0; l < config.L_cycles; ++l)
    z_L = net(z_L, injection);
  z_H = net(z_H, z_L);
  TrmStepOutput out;
  out.logits = lm_head(z_H).narrow(1, config.prefix_len(), config.seq_len);
  auto q = q_head(z_H.select(1, 0));
  q = q.to(at_least_float32(q.scalar_type()));
  out.q_halt = q.select(1, 0);
  out.q_continue = q.select(1, 1);
  out.z_H = (pad > 0 ? z_H.narrow(1, 0, T).contiguous() : z_H).detach();
  out.z_L = (pad > 0 ? z_L.narrow(1, 0, T).contiguous() : z_L).detach();
  return out;
}

int64_t TrmImpl::network_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters())
    if (p.key() != "puzzle_emb")
      n += p.value().numel();
  return n;
}

torch::Tensor halt_decision(
    const TrmConfig& c,
    const torch::Tensor& steps,
    const torch::Tensor& q_halt,
    const torch::Tensor& q_continue,
    bool training,
    const torch::Tensor& minimum) {
  auto halted = steps >= c.halt_max_steps;
  if (!training || c.halt_max_steps <= 1)
    return halted;
  halted = halted | (c.no_ACT_continue ? q_halt > 0 : q_halt > q_continue);
  // Exploration: some slots must reach a random minimum of steps first.
  return minimum.defined() ? halted & (steps >= minimum) : halted;
}

torch::Tensor exploration_minimum(const TrmConfig& c, int64_t slots) {
  const auto explore = torch::rand({slots}) < c.halt_exploration_prob;
  return explore.to(torch::kLong) *
      torch::randint(
          2, std::max<int64_t>(3, c.halt_max_steps + 1), {slots}, torch::kLong);
}

} // namespace orchard::models
