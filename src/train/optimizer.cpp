#include "train/optimizer.h"

#include "core/error.h"
#include "core/torch_compat.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace orchard::train {
namespace {

// The quintic's coefficients from the Muon write-up.
constexpr double kNsA = 3.4445, kNsB = -4.7750, kNsC = 2.0315;
constexpr double kNsEps = 1e-7; // keeps the first normalisation finite
// The most values Muon stacks for one batched Newton-Schulz (64 MB of
// float32 a temporary; a d12 GPT's 48 attention matrices go in 2 stacks).
constexpr int64_t kMuonStackElements = int64_t(16) << 20;

std::string fmt_lr(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", lr);
  return buf;
}

} // namespace

torch::Tensor newton_schulz_orthogonalize(
    const torch::Tensor& g,
    int64_t steps,
    torch::ScalarType dtype) {
  TORCH_CHECK(
      g.dim() == 2 || g.dim() == 3,
      "[newton_schulz] expected a matrix or a stack of matrices, got ",
      g.dim(),
      " dims");
  const bool stack = g.dim() == 3;
  auto x = g.to(dtype);
  // Iterate on the wide orientation: X X^T is then the smaller Gram matrix.
  const bool tall = x.size(-2) > x.size(-1);
  if (tall)
    x = x.transpose(-2, -1);
  // spectral norm <= Frobenius norm <= 1, matrix by matrix
  const auto norm = stack
      ? x.flatten(1).norm(2, {1}, /*keepdim=*/true).unsqueeze(-1)
      : x.norm();
  x = x / (norm + kNsEps);
  for (int64_t i = 0; i < steps; ++i) {
    const auto xt = x.transpose(-2, -1);
    // a = X X^T; b = B a + C a a; X = A X + b X: three products a step.
    // A stack (GPUs) folds the sums into the products (baddbmm); one
    // matrix (the CPU) keeps the plain ops: addmm there made a d6 step
    // 3-4 % slower (2 cores, 2026-11-25).
    if (stack) {
      const auto a = torch::bmm(x, xt);
      const auto b = torch::baddbmm(a, a, a, /*beta=*/kNsB, /*alpha=*/kNsC);
      x = torch::baddbmm(x, b, x, /*beta=*/kNsA, /*alpha=*/1.0);
    } else {
      const auto a = torch::matmul(x, xt);
      const auto b = kNsB * a + kNsC * torch::matmul(a, a);
      x = kNsA * x + torch::matmul(b, x);
    }
  }
  if (tall)
    x = x.transpose(-2, -1);
  return x;
}

Optimizers::Optimizers(std::vector<ParamGroup> groups, OptimizerOptions options)
    : groups_(std::move(groups)), options_(options) {
  adam_.resize(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    if (g.muon) {
      for (const auto& [name, p] : g.params)
        TORCH_CHECK(p.dim() == 2, "[muon] ", name, " is not a matrix");
      continue;
    }
    adam_[gi].resize(g.params.size());
  }
}

Optimizers::~Optimizers() = default;

void Optimizers::adamw_slices(
    const torch::Tensor& p,
    AdamState& s,
    double lr,
    double weight_decay,
    c10::optional<at::Generator> gen) {
  const double b1 = options_.adam_beta1, b2 = options_.adam_beta2;
  const int64_t step = ++s.step;
  const double bc1 = 1 - std::pow(b1, double(step));
  const double bc2 = 1 - std::pow(b2, double(step));
  const bool q8 = options_.adam_8bit;
  const bool narrow =
      p.scalar_type() != torch::kFloat32 && p.scalar_type() != torch::kFloat64;
  const int64_t n = p.numel();
  if (q8 && !s.avg8.codes.defined()) {
    s.avg8 = zero_quantized(n, true, p.options());
    s.sq8 = zero_quantized(n, false, p.options());
  } else if (!q8 && !s.exp_avg.defined()) {
    const auto o =
        p.options().dtype(narrow ? torch::kFloat32 : p.scalar_type());
    s.exp_avg = torch::zeros(p.sizes(), o);
    s.exp_avg_sq = torch::zeros(p.sizes(), o);
  }
  auto flat = p.view({-1}), grad = p.grad().reshape({-1});
  // Slices in whole 8-bit blocks: a few float32 copies of one slice are the
  // step's whole transient.
  const int64_t slice =
      std::max<int64_t>(kBlock, options_.adam_slice_elements / kBlock * kBlock);
  for (int64_t from = 0; from < n; from += slice) {
    const int64_t len = std::min(slice, n - from);
    const int64_t padded = q8 ? whole_blocks(len) : len;
    auto g32 = grad.narrow(0, from, len).to(torch::kFloat32);
    if (padded != len)
      g32 = torch::constant_pad_nd(g32, {0, padded - len});
    auto m = q8 ? dequantize8(s.avg8, true, from, len)
                : s.exp_avg.view({-1}).narrow(0, from, len);
    auto v = q8 ? dequantize8(s.sq8, false, from, len)
                : s.exp_avg_sq.view({-1}).narrow(0, from, len);
    m.mul_(b1).add_(g32, 1 - b1);
    v.mul_(b2).addcmul_(g32, g32, 1 - b2);
    auto w = flat.narrow(0, from, len);
    auto w32 = narrow ? w.to(torch::kFloat32) : w;
    w32.mul_(1 - lr * weight_decay);
    auto denom =
        v.narrow(0, 0, len).sqrt().div_(std::sqrt(bc2)).add_(options_.adam_eps);
    w32.addcdiv_(
        m.narrow(0, 0, len).to(w32.scalar_type()),
        denom.to(w32.scalar_type()),
        -lr / bc1);
    if (p.scalar_type() == torch::kBFloat16)
      stochastic_round_into(w, w32, gen);
    else if (narrow)
      w.copy_(w32);
    if (q8) {
      quantize8(s.avg8, true, from, m);
      quantize8(s.sq8, false, from, v);
    }
  }
}

void Optimizers::adamw_step(size_t gi, double lr, int64_t opt_step) {
  const auto& g = groups_[gi];
  auto& states = adam_[gi];
  const double b1 = options_.adam_beta1, b2 = options_.adam_beta2;
  // 8-bit moments and bfloat16 weights: a tensor at a time, in slices;
  // the rest below, together.
  auto sliced = [&](const torch::Tensor& p) {
    return options_.adam_8bit || p.scalar_type() == torch::kBFloat16;
  };
  c10::optional<at::Generator> gen;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const auto& p = g.params[i].second;
    if (!p.grad().defined() || !sliced(p))
      continue;
    if (p.scalar_type() == torch::kBFloat16 && !gen) {
      // A stream of its own per step and group: the same on resume.
      gen = at::globalContext().defaultGenerator(p.device()).clone();
      gen->set_current_seed(
          options_.seed * 0x9E3779B97F4A7C15ull +
          uint64_t(opt_step) * 1000003ull + gi);
    }
    adamw_slices(p, states[i], lr, g.weight_decay, gen);
  }
  // Tensors with a gradient, bucketed by their step count (one bucket
  // unless some tensor missed a step), device and dtype: each bucket is one
  // set of multi-tensor launches.
  std::map<std::tuple<int64_t, std::string, int>, std::vector<size_t>> buckets;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const auto& p = g.params[i].second;
    if (!p.grad().defined())
      continue; // no gradient, no update, no step (as torch's AdamW)
    if (sliced(p))
      continue; // above
    auto& s = states[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = torch::zeros_like(p, at::MemoryFormat::Preserve);
      s.exp_avg_sq = torch::zeros_like(p, at::MemoryFormat::Preserve);
    }
    buckets[{s.step, p.device().str(), int(p.scalar_type())}].push_back(i);
  }
  // Each bucket is updated in slices of at most adam_slice_elements (a
  // larger tensor alone): the square-root denominators exist for one slice
  // at a time, so the transient stays near 16 MB a temporary rather than
  // the size of every parameter.
  const int64_t kSliceElements = options_.adam_slice_elements;
  for (const auto& [key, idx] : buckets) {
    const int64_t step = std::get<0>(key) + 1;
    const double bc1 = 1 - std::pow(b1, double(step));
    const double bc2 = 1 - std::pow(b2, double(step));
    // The fused kernel makes no temporaries: the whole bucket in one call
    // (sliced, d12's 162M weights took 29 launches with part-empty tails,
    // 1.79 ms a step on an H200, against 8 launches and 1.34 ms).
    if (options_.fused_adamw) {
      std::vector<torch::Tensor> params, grads, avg, sq;
      for (const size_t i : idx) {
        params.push_back(g.params[i].second);
        grads.push_back(g.params[i].second.grad());
        avg.push_back(states[i].exp_avg);
        sq.push_back(states[i].exp_avg_sq);
      }
      if (compat::fused_adamw(
              params,
              grads,
              avg,
              sq,
              step,
              lr,
              b1,
              b2,
              g.weight_decay,
              options_.adam_eps)) {
        for (const size_t i : idx)
          ++states[i].step;
        continue;
      }
    }
    for (size_t start = 0; start < idx.size();) {
      std::vector<torch::Tensor> params, grads, avg, sq;
      int64_t elements = 0;
      size_t end = start;
      for (; end < idx.size(); ++end) {
        const size_t i = idx[end];
        const auto& p = g.params[i].second;
        if (end > start && elements + p.numel() > kSliceElements)
          break;
        elements += p.numel();
        params.push_back(p);
        grads.push_back(p.grad());
        avg.push_back(states[i].exp_avg);
        sq.push_back(states[i].exp_avg_sq);
        ++states[i].step;
      }
      start = end;
      at::_foreach_mul_(params, 1 - lr * g.weight_decay);
      at::_foreach_mul_(avg, b1);
      at::_foreach_add_(avg, grads, 1 - b1);
      at::_foreach_mul_(sq, b2);
      at::_foreach_addcmul_(sq, grads, grads, 1 - b2);
      auto denom = at::_foreach_sqrt(sq);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, options_.adam_eps);
      at::_foreach_addcdiv_(params, avg, denom, -lr / bc1);
    }
  }
}

void Optimizers::adam_atan2_step(size_t gi, double lr) {
  const auto& g = groups_[gi];
  const double b1 = options_.adam_beta1, b2 = options_.adam_beta2;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const auto& p = g.params[i].second;
    if (!p.grad().defined())
      continue;
    auto& s = adam_[gi][i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = torch::zeros_like(p);
      s.exp_avg_sq = torch::zeros_like(p);
    }
    const auto grad = p.grad();
    s.exp_avg.mul_(b1).add_(grad, 1 - b1);
    s.exp_avg_sq.mul_(b2).addcmul_(grad, grad, 1 - b2);
    const int64_t step = ++s.step;
    const double bc1 = 1 - std::pow(b1, double(step));
    const double bc2 = 1 - std::pow(b2, double(step));
    p.mul_(1 - lr * g.weight_decay);
    p.add_(torch::atan2(s.exp_avg / bc1, (s.exp_avg_sq / bc2).sqrt()), -lr);
  }
}

void Optimizers::sign_sgd_step(size_t gi, double lr) {
  const auto& g = groups_[gi];
  for (const auto& [name, p] : g.params) {
    if (!p.grad().defined())
      continue;
    TORCH_CHECK(p.dim() == 2, "[sign_sgd] ", name, " is not a matrix");
    const auto grad = p.grad();
    const auto used = grad.ne(0).any(1, /*keepdim=*/true).to(p.scalar_type());
    p.sub_(used * (lr * g.weight_decay * p + lr * grad.sign()));
  }
}

void Optimizers::zero_grad() {
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params)
      if (p.grad().defined())
        p.mutable_grad() = torch::Tensor(); // set to none, as PyTorch does
}

bool Optimizers::can_step_on_device() const {
  if (!compat::has_fused_adamw() || !options_.fused_adamw ||
      options_.adam_8bit)
    return false;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    if (g.muon || !g.rule.empty())
      return false;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& p = g.params[i].second;
      if (!p.is_cuda() || p.scalar_type() != torch::kFloat32 ||
          !p.grad().defined() ||
          adam_[gi][i].step != adam_[gi].front().step)
        return false;
    }
  }
  return true;
}

void Optimizers::step_on_device(
    double lr_multiplier,
    const torch::Tensor& grad_scale,
    const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    auto& states = adam_[gi];
    if (g.params.empty())
      continue;
    std::vector<torch::Tensor> params, grads, avg, sq;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& p = g.params[i].second;
      auto& s = states[i];
      if (!s.exp_avg.defined()) {
        s.exp_avg = torch::zeros_like(p, at::MemoryFormat::Preserve);
        s.exp_avg_sq = torch::zeros_like(p, at::MemoryFormat::Preserve);
      }
      params.push_back(p);
      grads.push_back(p.grad());
      avg.push_back(s.exp_avg);
      sq.push_back(s.exp_avg_sq);
    }
    const bool done = compat::fused_adamw(
        params,
        grads,
        avg,
        sq,
        states.front().step + 1,
        g.lr * lr_multiplier,
        options_.adam_beta1,
        options_.adam_beta2,
        g.weight_decay,
        options_.adam_eps,
        grad_scale,
        found_inf);
    if (!done)
      throw std::logic_error("[step_on_device] without can_step_on_device");
    for (auto& s : states)
      ++s.step;
  }
}

void Optimizers::uncount_step() {
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    if (!groups_[gi].muon && groups_[gi].rule.empty())
      for (auto& s : adam_[gi])
        s.step = std::max<int64_t>(0, s.step - 1);
}

void Optimizers::step(double lr_multiplier, int64_t step) {
  torch::NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const double lr = groups_[gi].lr * lr_multiplier;
    if (groups_[gi].rule == "adam_atan2")
      adam_atan2_step(gi, lr);
    else if (groups_[gi].rule == "sign_sgd")
      sign_sgd_step(gi, lr);
    else if (!groups_[gi].muon)
      adamw_step(gi, lr, step);
  }
  const double frac = options_.muon_momentum_warmup > 0
      ? std::min(1.0, double(step) / double(options_.muon_momentum_warmup))
      : 1.0;
  const double momentum =
      (1 - frac) * options_.muon_momentum_start + frac * options_.muon_momentum;
  for (const auto& g : groups_) {
    if (!g.muon)
      continue;
    const double lr = g.lr * lr_multiplier;
    // Same-shaped matrices (a GPT's 4 or 6 per layer) are orthogonalised
    // as one stack; the momentum and the update stay per matrix.
    std::vector<std::vector<std::pair<std::string, torch::Tensor>>> stacks;
    std::map<std::vector<int64_t>, size_t>
        open_stack; // by shape, dtype, device
    for (const auto& [name, p] : g.params) {
      if (!p.grad().defined())
        continue;
      auto key = p.sizes().vec();
      key.push_back(int64_t(p.scalar_type()));
      key.push_back(int64_t(p.device().type()));
      key.push_back(int64_t(p.device().index()));
      auto it = open_stack.find(key);
      // A new stack where stacking does not pay (the CPU) or the open one
      // is full (the stack's temporaries stay under kMuonStackElements).
      if (it == open_stack.end() ||
          (p.device().is_cpu() && !options_.muon_stack_on_cpu) ||
          int64_t(stacks[it->second].size() + 1) * p.numel() >
              kMuonStackElements) {
        open_stack[key] = stacks.size();
        stacks.emplace_back();
        it = open_stack.find(key);
      }
      stacks[it->second].emplace_back(name, p);
    }
    for (const auto& members : stacks) {
      std::vector<torch::Tensor> updates;
      for (const auto& [name, p] : members) {
        const auto& grad = p.grad();
        auto& buf = muon_momentum_[name];
        if (!buf.defined())
          buf = torch::zeros_like(p);
        buf.lerp_(grad, 1 - momentum);               // buf = m buf + (1 - m) g
        updates.push_back(grad.lerp(buf, momentum)); // Nesterov
      }
      const auto ortho = updates.size() == 1
          ? newton_schulz_orthogonalize(
                updates[0],
                options_.newton_schulz_steps,
                options_.newton_schulz_dtype)
                .unsqueeze(0)
          : newton_schulz_orthogonalize(
                torch::stack(updates),
                options_.newton_schulz_steps,
                options_.newton_schulz_dtype);
      for (size_t k = 0; k < members.size(); ++k) {
        const auto& p = members[k].second;
        const double aspect =
            std::sqrt(std::max(1.0, double(p.size(0)) / double(p.size(1))));
        if (g.weight_decay > 0)
          p.mul_(1 - lr * g.weight_decay);
        p.add_(ortho[int64_t(k)].to(p.scalar_type()), -lr * aspect);
      }
    }
  }
}

std::vector<torch::Tensor> Optimizers::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params)
      out.push_back(p);
  return out;
}

std::string Optimizers::describe() const {
  // Groups by rule, in the order rules first appear.
  std::vector<std::pair<std::string, std::string>> rules;
  for (const auto& g : groups_) {
    const std::string rule = g.muon ? "Muon"
        : g.rule == "adam_atan2"    ? "AdamATan2"
        : g.rule == "sign_sgd"      ? "SignSGD"
        : options_.adam_8bit        ? "AdamW, 8-bit moments"
                                    : "AdamW";
    auto it = std::find_if(rules.begin(), rules.end(), [&](const auto& r) {
      return r.first == rule;
    });
    if (it == rules.end())
      it = rules.insert(rules.end(), {rule, ""});
    it->second +=
        (it->second.empty() ? "" : ", ") + g.name + " lr " + fmt_lr(g.lr);
  }
  std::string out;
  for (const auto& [rule, list] : rules)
    out += (out.empty() ? "" : " + ") + rule + " (" + list + ")";
  return out;
}

NamedTensors Optimizers::state() const {
  NamedTensors out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& name = g.params[i].first;
      if (g.muon) {
        auto it = muon_momentum_.find(name);
        if (it != muon_momentum_.end())
          out.push_back({name + ".momentum_buffer", it->second});
        continue;
      }
      const auto& s = adam_[gi][i];
      if (s.step == 0)
        continue; // no step taken yet
      if (s.avg8.codes.defined()) {
        out.push_back({name + ".exp_avg.q8", s.avg8.codes});
        out.push_back({name + ".exp_avg.absmax", s.avg8.absmax});
        out.push_back({name + ".exp_avg_sq.q8", s.sq8.codes});
        out.push_back({name + ".exp_avg_sq.absmax", s.sq8.absmax});
      } else {
        out.push_back({name + ".exp_avg", s.exp_avg});
        out.push_back({name + ".exp_avg_sq", s.exp_avg_sq});
      }
      out.push_back({name + ".step", torch::tensor(s.step)});
    }
  }
  return out;
}

void Optimizers::load(const std::map<std::string, torch::Tensor>& saved) {
  auto mismatch = [](const std::string& name, const std::string& what) {
    return UserError(
        "the checkpoint's optimizer state for '" + name + "' " + what +
        " (was the architecture or `optimizer` changed?). Use the original "
        "settings, another run name, or resume=never.");
  };
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& [name, p] = g.params[i];
      if (g.muon) {
        if (saved.count(name + ".exp_avg"))
          throw mismatch(name, "was written by AdamW, not Muon");
        auto it = saved.find(name + ".momentum_buffer");
        if (it == saved.end())
          continue;
        if (it->second.sizes() != p.sizes())
          throw mismatch(name, "has another shape");
        muon_momentum_[name] =
            it->second.to(p.device(), p.scalar_type()).clone();
        continue;
      }
      if (saved.count(name + ".momentum_buffer"))
        throw mismatch(name, "was written by Muon, not AdamW");
      auto& s = adam_[gi][i];
      const bool saved8 = saved.count(name + ".exp_avg.q8") > 0;
      if (saved8 != options_.adam_8bit &&
          (saved8 || saved.count(name + ".exp_avg")))
        throw UserError(
            "the checkpoint's AdamW state for '" + name + "' is " +
            (saved8 ? "8-bit (optim=adamw_8bit)"
                    : "32-bit (optim=adamw_torch)") +
            " but this run asks for " +
            (options_.adam_8bit ? "optim=adamw_8bit" : "optim=adamw_torch") +
            "; resume with the optimizer it was made with, or start over "
            "with resume=never.");
      if (saved8) {
        auto get =
            [&](const std::string& key, torch::ScalarType dtype, int64_t n) {
              auto it = saved.find(name + key);
              if (it == saved.end() || it->second.scalar_type() != dtype ||
                  it->second.numel() != n)
                throw mismatch(name, "does not match the model");
              return it->second.to(p.device()).clone();
            };
        const int64_t padded = whole_blocks(p.numel());
        s.avg8 = {
            get(".exp_avg.q8", torch::kChar, padded),
            get(".exp_avg.absmax", torch::kFloat32, padded / kBlock)};
        s.sq8 = {
            get(".exp_avg_sq.q8", torch::kByte, padded),
            get(".exp_avg_sq.absmax", torch::kFloat32, padded / kBlock)};
        auto step = saved.find(name + ".step");
        if (step == saved.end())
          throw mismatch(name, "does not match the model");
        s.step = step->second.item<int64_t>();
        continue;
      }
      auto avg = saved.find(name + ".exp_avg");
      if (avg == saved.end())
        continue;
      auto sq = saved.find(name + ".exp_avg_sq");
      auto step = saved.find(name + ".step");
      if (sq == saved.end() || step == saved.end() ||
          avg->second.sizes() != p.sizes())
        throw mismatch(name, "does not match the model");
      // A bfloat16 weight's moments are float32 (adamw_slices).
      const auto dtype = p.scalar_type() == torch::kBFloat16 ? torch::kFloat32
                                                             : p.scalar_type();
      s.step = step->second.item<int64_t>();
      s.exp_avg = avg->second.to(p.device(), dtype).clone();
      s.exp_avg_sq = sq->second.to(p.device(), dtype).clone();
    }
  }
}

} // namespace orchard::train
