#include "infer/sampling.h"

#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#ifdef ORCHARD_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <limits>

namespace orchard::infer {

std::string sampling_problem(const SamplingOptions& o) {
  if (o.sampling_device != "auto" && o.sampling_device != "cpu" &&
      o.sampling_device != "device")
    return "--sampling-device is auto, cpu or device (not '" +
        o.sampling_device + "').";
  if (!(o.min_p >= 0 && o.min_p <= 1))
    return "--min-p must be in [0, 1] (0: off).";
  if (!(o.repetition_penalty > 0 && o.repetition_penalty <= kMaxPenalty))
    return "--repetition-penalty must be in (0, " +
        std::to_string(int(kMaxPenalty)) +
        "] (1: off; above 1 discourages repeats).";
  if (o.temperature >= 0 && o.temperature <= kMaxTemperature && o.top_p > 0 &&
      o.top_p <= 1 && o.top_k >= 0 && o.top_k <= kMaxTopK &&
      o.max_new_tokens >= 1)
    return "";
  return "--temperature must be in [0, " +
      std::to_string(int(kMaxTemperature)) +
      "], --top-p in (0, 1], --top-k in [0, " + std::to_string(kMaxTopK) +
      "] and --max-new-tokens >= 1.";
}

bool samples_on_device(const SamplingOptions& opt, const torch::Device& d) {
  if (opt.sampling_device == "cpu")
    return false;
  if (opt.sampling_device == "device")
    return true;
  return !d.is_cpu();
}

torch::Tensor penalize_repetition(
    const torch::Tensor& logits,
    const torch::Tensor& seen,
    const torch::Tensor& penalty) {
  auto penalized =
      torch::where(logits > 0, logits / penalty, logits * penalty);
  return torch::where(seen, penalized, logits);
}

int64_t sample_token(
    const torch::Tensor& logits_in,
    const SamplingOptions& opt,
    torch::Generator& gen,
    const std::vector<int64_t>& seen) {
  auto logits = logits_in.to(torch::kCPU, torch::kFloat32).view({-1});
  if (opt.repetition_penalty != 1.0 && !seen.empty()) {
    auto mask = torch::zeros({logits.size(0)}, torch::kBool);
    mask.index_fill_(0, torch::tensor(seen, torch::kInt64), true);
    logits = penalize_repetition(
        logits, mask, torch::full({1}, float(opt.repetition_penalty)));
  }
  if (is_greedy(opt))
    return logits.argmax().item<int64_t>();
  logits = logits / opt.temperature;
  if (opt.top_k > 0 && opt.top_k < logits.size(0)) {
    auto kth = std::get<0>(logits.topk(opt.top_k)).min();
    logits = logits.masked_fill(
        logits < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, -1);
  if (opt.top_p < 1.0) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    auto before =
        sorted.cumsum(-1) - sorted; // mass of strictly likelier tokens
    sorted = sorted.masked_fill(before >= opt.top_p, 0.0); // keeps at least one
    probs = torch::zeros_like(probs).scatter(0, order, sorted);
  }
  if (opt.min_p > 0) // keeps the likeliest token
    probs = probs.masked_fill(probs < opt.min_p * probs.max(), 0.0);
  return torch::multinomial(probs, 1, /*replacement=*/false, gen)
      .item<int64_t>();
}

torch::Generator make_generator(const torch::Device& d, uint64_t seed) {
#ifdef ORCHARD_WITH_CUDA
  if (d.is_cuda()) {
    auto g =
        at::cuda::detail::createCUDAGenerator(d.has_index() ? d.index() : 0);
    g.set_current_seed(seed);
    return g;
  }
#endif
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

namespace {

// Rows (n, V) marking the tokens of each context.
torch::Tensor seen_rows(
    const std::vector<const std::vector<int64_t>*>& contexts,
    int64_t V,
    const torch::Device& device) {
  auto m = torch::zeros({int64_t(contexts.size()), V}, torch::kBool);
  for (size_t r = 0; r < contexts.size(); ++r)
    if (!contexts[r]->empty())
      m[int64_t(r)].index_fill_(
          0, torch::tensor(*contexts[r], torch::kInt64).clamp(0, V - 1), true);
  return m.to(device);
}

} // namespace

void Sampler::add_row(
    const SamplingOptions& opt,
    const std::vector<int64_t>& context) {
  if (rows_.empty())
    on_device_ = samples_on_device(opt, device_);
  // The device sampler draws on CUDA and the CPU with the device's own
  // generator; elsewhere (MPS) from a CPU generator, copied over.
  const bool own = on_device_ && (device_.is_cuda() || device_.is_cpu());
  const bool penalty = opt.repetition_penalty != 1.0;
  rows_.push_back(
      {opt,
       make_generator(own ? device_ : torch::Device(torch::kCPU), opt.seed),
       penalty ? context : std::vector<int64_t>{}});
  any_penalty_ = any_penalty_ || penalty;
  if (seen_.defined()) { // made already: the new row joins it
    seen_ = torch::cat(
        {seen_,
         seen_rows({&rows_.back().context}, seen_.size(1), seen_.device())});
    rows_.back().context.clear();
  }
  dirty_ = true;
}

void Sampler::remove_row(int64_t row) {
  const int64_t last = int64_t(rows_.size()) - 1;
  if (row != last)
    rows_[size_t(row)] = std::move(rows_.back());
  rows_.pop_back();
  if (seen_.defined()) {
    if (row != last)
      seen_[row].copy_(seen_[last]);
    seen_ = seen_.narrow(0, 0, last).clone();
  }
  dirty_ = true;
}

void Sampler::mark_seen(const torch::Tensor& logits) {
  if (seen_.defined())
    return;
  std::vector<const std::vector<int64_t>*> contexts;
  for (auto& row : rows_)
    contexts.push_back(&row.context);
  seen_ = seen_rows(contexts, logits.size(1), logits.device());
  for (auto& row : rows_)
    row.context.clear();
}

torch::Tensor Sampler::sample(
    const torch::Tensor& logits,
    int64_t first,
    torch::Tensor* logprobs) {
  const int64_t n = logits.size(0);
  if (first < 0 || first + n > rows())
    throw std::invalid_argument("[Sampler::sample] rows out of range");
  torch::NoGradGuard no_grad;
  torch::Tensor tokens;
  torch::Tensor x = logits;
  if (any_penalty_) {
    mark_seen(logits);
    if (dirty_ || columns_rows_ != rows() ||
        penalties_.device() != logits.device())
      refresh_columns();
    x = penalize_repetition(
        logits.to(torch::kFloat32),
        seen_.narrow(0, first, n),
        penalties_.narrow(0, first, n));
  }
  if (on_device_) {
    tokens = sample_on_device(x, first);
  } else {
    auto cpu = x.to(torch::kCPU, torch::kFloat32);
    std::vector<int64_t> picked(size_t(n), 0);
    for (int64_t r = 0; r < n; ++r) {
      Row& row = rows_[size_t(first + r)];
      picked[size_t(r)] = sample_token(cpu[r], row.opt, row.gen);
    }
    tokens = torch::tensor(picked, torch::kInt64).to(logits.device());
  }
  if (any_penalty_) // the drawn tokens are seen from now on
    seen_.narrow(0, first, n).scatter_(1, tokens.view({n, 1}), true);
  if (logprobs)
    *logprobs = torch::log_softmax(logits.to(torch::kFloat32), -1)
                    .gather(1, tokens.view({n, 1}))
                    .view({n});
  return tokens;
}

void Sampler::refresh_columns() {
  // Rebuilt only when rows change: a copy from the host would wait for
  // the device's queued work.
  std::vector<float> temps, ps, min_ps, penalties;
  std::vector<int64_t> ks;
  std::vector<uint8_t> greedy;
  for (const Row& row : rows_) {
    const SamplingOptions& o = row.opt;
    greedy.push_back(is_greedy(o));
    temps.push_back(is_greedy(o) ? 1.0f : float(o.temperature));
    ks.push_back(std::max<int64_t>(0, o.top_k));
    ps.push_back(o.top_p < 1 ? float(o.top_p) : 2.0f); // 2: never cuts
    min_ps.push_back(float(o.min_p));
    penalties.push_back(float(o.repetition_penalty));
  }
  const int64_t n = rows();
  auto column = [&](const auto& v, torch::ScalarType t) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    // A copy (from_blob aliases the vector, which goes away).
    return torch::from_blob(
               const_cast<T*>(v.data()), {n, 1}, torch::TensorOptions(t))
        .clone()
        .to(device_);
  };
  temps_ = column(temps, torch::kFloat32);
  ks_ = column(ks, torch::kInt64);
  ps_ = column(ps, torch::kFloat32);
  min_ps_ = column(min_ps, torch::kFloat32);
  penalties_ = column(penalties, torch::kFloat32);
  greedy_ = column(greedy, torch::kUInt8).view({n}).to(torch::kBool);
  columns_rows_ = n;
  dirty_ = false;
}

torch::Tensor Sampler::sample_on_device(
    const torch::Tensor& logits,
    int64_t first) {
  const int64_t n = logits.size(0), V = logits.size(1);
  auto x = logits.to(torch::kFloat32);
  auto greedy = x.argmax(-1);
  bool all_greedy = true, any_k = false, any_p = false, any_min_p = false;
  int64_t kmax = 0;
  for (int64_t r = 0; r < n; ++r) {
    const SamplingOptions& o = rows_[size_t(first + r)].opt;
    if (is_greedy(o))
      continue;
    all_greedy = false;
    if (o.top_k > 0 && o.top_k < V) {
      any_k = true;
      kmax = std::max(kmax, o.top_k);
    }
    any_p = any_p || o.top_p < 1;
    any_min_p = any_min_p || o.min_p > 0;
  }
  if (all_greedy)
    return greedy;
  if (dirty_ || columns_rows_ != rows() || temps_.device() != x.device())
    refresh_columns();
  auto cols = [&](const torch::Tensor& t) { return t.narrow(0, first, n); };
  const float inf = std::numeric_limits<float>::infinity();
  auto z = x / cols(temps_);
  if (any_k) {
    // The k-th largest value of each row; rows without top-k (0, or k at
    // least the vocabulary) keep every token.
    auto k = cols(ks_);
    auto off = k.eq(0).logical_or(k.ge(V));
    auto top = std::get<0>(z.topk(kmax, -1)); // (n, kmax), descending
    auto kth = top.gather(1, (k.clamp(1, kmax) - 1));
    kth = kth.masked_fill(off, -inf);
    z = z.masked_fill(z < kth, -inf);
  }
  auto probs = torch::softmax(z, -1);
  if (any_p) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    auto before = sorted.cumsum(-1) - sorted; // strictly likelier mass
    sorted = sorted.masked_fill(before >= cols(ps_), 0.0);
    probs = torch::zeros_like(probs).scatter(1, order, sorted);
  }
  if (any_min_p) // keeps each row's likeliest token
    probs = probs.masked_fill(
        probs < cols(min_ps_) * std::get<0>(probs.max(-1, true)), 0.0);
  // E ~ Exp(1) per token from each row's generator; argmax(p / E) is a
  // draw from p. E is kept above zero so a zero-probability token never
  // wins by 0 / 0.
  auto e = torch::empty_like(probs);
  for (int64_t r = 0; r < n; ++r) {
    Row& row = rows_[size_t(first + r)];
    if (row.gen.device() == x.device())
      e.select(0, r).exponential_(1.0, row.gen);
    else // MPS: drawn on the CPU, copied over
      e.select(0, r).copy_(
          torch::empty({V}, torch::kFloat32).exponential_(1.0, row.gen));
  }
  e.clamp_min_(std::numeric_limits<float>::min());
  auto drawn = (probs / e).argmax(-1);
  return torch::where(cols(greedy_), greedy, drawn);
}

} // namespace orchard::infer
