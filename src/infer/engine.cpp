#include "infer/engine.h"
#include "core/clock.h"

#include "core/error.h"
#include "core/torch_compat.h"
#include "data/shards.h"
#include "infer/decode_step.h"
#include "text/tokenizer_io.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace orchard::infer {
namespace {} // namespace

// A KV cache and the step that decodes over it, kept between calls so the
// captured graphs are reused; grown (and the graphs recaptured) when a
// call needs more rows or positions.
struct Engine::Decoding {
  explicit Decoding(std::shared_ptr<models::LanguageModel> model, bool graphs)
      : step(std::move(model), graphs) {}
  DecodeStep step;
  models::BatchKvCache cache;
  // A cache of at least `rows` x `capacity` like `prefilled`'s layers.
  void ensure(
      const models::KvCache& prefilled,
      int64_t rows,
      int64_t capacity) {
    if (!cache.k.empty() && cache.rows() >= rows &&
        cache.k[0].size(2) >= capacity &&
        cache.k[0].scalar_type() == prefilled.k[0].scalar_type())
      return;
    cache.k.clear();
    cache.v.clear();
    step.reset();
    cache = allocate_cache(prefilled, rows, capacity);
  }
};

Engine::Engine(
    std::shared_ptr<models::LanguageModel> model,
    torch::Device device,
    bool graphs)
    : model_(std::move(model)), device_(device) {
  model_->to(device_);
  model_->eval();
  single_ = std::make_unique<Decoding>(model_, graphs);
  batch_ = std::make_unique<Decoding>(model_, graphs);
}

Engine::~Engine() = default;

bool Engine::uses_graphs() const {
  // Capturing turns graphs off for good when it fails.
  return single_->step.uses_graphs() && batch_->step.uses_graphs() &&
      single_->step.captured() + batch_->step.captured() > 0;
}

namespace {

// Positions a cache must hold for `length` tokens, in whole buckets, at
// most the model's limit.
int64_t cache_capacity(int64_t length, int64_t max_len) {
  return std::min(max_len, (length + kKeyBucket - 1) / kKeyBucket * kKeyBucket);
}

torch::Tensor id_tensor(
    const std::vector<int64_t>& v,
    size_t from,
    const torch::Device& device) {
  return torch::tensor(
             std::vector<int64_t>(v.begin() + int64_t(from), v.end()),
             torch::kInt64)
      .view({1, -1})
      .to(device);
}

void check_prompt(const std::vector<int64_t>& prompt, int64_t max_len) {
  if (prompt.empty())
    throw UserError("the prompt is empty.");
  if (int64_t(prompt.size()) >= max_len)
    throw UserError(
        "the prompt is " + std::to_string(prompt.size()) +
        " tokens; the model reads at most " + std::to_string(max_len) +
        ". Shorten it.");
}

bool is_stop(const SamplingOptions& opt, int64_t id) {
  return std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), id) !=
      opt.stop_tokens.end();
}

// The recompute-everything reference: no cache, the CPU sampler.
std::vector<int64_t> generate_without_cache(
    models::LanguageModel& model,
    const torch::Device& device,
    const std::vector<int64_t>& prompt,
    const SamplingOptions& opt,
    const std::function<bool(int64_t)>& on_token) {
  auto gen = make_generator(torch::Device(torch::kCPU), opt.seed);
  std::vector<int64_t> seq = prompt, out;
  const int64_t max_len = model.max_seq_len();
  while (int64_t(out.size()) < opt.max_new_tokens &&
         int64_t(seq.size()) < max_len) {
    auto logits = model.forward(id_tensor(seq, 0, device));
    int64_t next = sample_token(logits[0][logits.size(1) - 1], opt, gen, seq);
    seq.push_back(next);
    out.push_back(next);
    if ((on_token && !on_token(next)) || is_stop(opt, next))
      break;
  }
  return out;
}

} // namespace

std::vector<int64_t> Engine::generate(
    const std::vector<int64_t>& prompt,
    const SamplingOptions& opt,
    const std::function<bool(int64_t)>& on_token,
    bool use_cache,
    GenerationStats* stats) {
  const int64_t max_len = model_->max_seq_len();
  check_prompt(prompt, max_len);
  torch::NoGradGuard no_grad;
  if (!use_cache || !model_->supports_kv_cache()) {
    const double t0 = now_s();
    auto out = generate_without_cache(*model_, device_, prompt, opt, on_token);
    if (stats) {
      stats->prompt_tokens = int64_t(prompt.size());
      stats->new_tokens = int64_t(out.size());
      stats->decode_seconds = now_s() - t0;
    }
    return out;
  }
  const int64_t P = int64_t(prompt.size());
  const int64_t most = std::min(opt.max_new_tokens, max_len - P);
  Sampler sampler(device_);
  sampler.add_row(opt, prompt);
  double t0 = now_s();
  models::KvCache kv;
  auto logits = model_->forward(id_tensor(prompt, 0, device_), &kv);
  auto next = sampler.sample(logits.select(1, P - 1)); // (1)
  Decoding& d = *single_;
  d.ensure(kv, 1, cache_capacity(P + most, max_len));
  copy_into_row(kv, d.cache, 0);
  kv = {};
  compat::synchronize(device_);
  double t1 = now_s();
  // The tokens made but not yet read by the host; read every `chunk`.
  std::vector<torch::Tensor> pending = {next};
  const size_t chunk = on_token ? 4 : 32;
  std::vector<int64_t> out;
  bool stopped = false;
  auto read_pending = [&] {
    if (pending.empty())
      return;
    auto ids = torch::cat(pending).to(torch::kCPU);
    pending.clear();
    for (int64_t i = 0; i < ids.size(0) && !stopped; ++i) {
      const int64_t id = ids[i].item<int64_t>();
      out.push_back(id);
      stopped = (on_token && !on_token(id)) || is_stop(opt, id);
    }
  };
  auto pos = torch::full(
      {1}, P, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  for (int64_t made = 1; !stopped;) {
    if (made >= most) {
      read_pending();
      break;
    }
    // The newest token is at position P + made - 1.
    logits = d.step.run(next, pos, d.cache, P + made);
    next = sampler.sample(logits);
    pos.add_(1);
    pending.push_back(next);
    ++made;
    if (pending.size() >= chunk)
      read_pending();
  }
  if (stats) {
    stats->prompt_tokens = P;
    stats->new_tokens = int64_t(out.size());
    stats->prefill_seconds = t1 - t0;
    stats->decode_seconds = now_s() - t1;
  }
  return out;
}

BatchGeneration Engine::generate_batch(
    const std::vector<std::vector<int64_t>>& prompts,
    int64_t samples,
    const SamplingOptions& opt,
    GenerationStats* stats) {
  const int64_t max_len = model_->max_seq_len();
  if (prompts.empty() || samples < 1)
    throw UserError("generate_batch needs at least one prompt and sample.");
  if (!model_->supports_kv_cache())
    throw UserError(
        "this model (a tiny recursive model) decodes one sequence at a time "
        "by running it whole for every token; batched generation (orchard "
        "serve, GRPO rollouts) needs a model with a cache.");
  int64_t longest = 0, prompt_tokens = 0;
  for (const auto& p : prompts) {
    check_prompt(p, max_len);
    longest = std::max<int64_t>(longest, int64_t(p.size()));
    prompt_tokens += int64_t(p.size());
  }
  torch::NoGradGuard no_grad;
  const int64_t N = int64_t(prompts.size()), R = N * samples;
  const int64_t capacity =
      cache_capacity(longest + opt.max_new_tokens, max_len);
  // Row r may make at most limit[r] tokens.
  std::vector<int64_t> limit(static_cast<size_t>(R), 0),
      start(static_cast<size_t>(R), 0);
  Sampler sampler(device_);
  for (int64_t r = 0; r < R; ++r) {
    SamplingOptions o = opt;
    o.seed = opt.seed + uint64_t(r);
    sampler.add_row(o, prompts[size_t(r / samples)]);
    const int64_t P = int64_t(prompts[size_t(r / samples)].size());
    start[size_t(r)] = P;
    limit[size_t(r)] = std::min(opt.max_new_tokens, max_len - P);
  }
  double t0 = now_s();
  Decoding& d = *batch_;
  std::vector<torch::Tensor> first_ids, first_lps;
  for (int64_t i = 0; i < N; ++i) {
    const auto& p = prompts[size_t(i)];
    models::KvCache kv;
    auto logits = model_->forward(id_tensor(p, 0, device_), &kv);
    if (i == 0)
      d.ensure(kv, R, capacity);
    for (int64_t j = 0; j < samples; ++j)
      copy_into_row(kv, d.cache, i * samples + j);
    auto last = logits.select(1, int64_t(p.size()) - 1)
                    .expand({samples, logits.size(2)});
    torch::Tensor lp;
    first_ids.push_back(sampler.sample(last, i * samples, &lp));
    first_lps.push_back(lp);
  }
  auto next = torch::cat(first_ids);
  std::vector<torch::Tensor> ids = {next}, lps = {torch::cat(first_lps)};
  compat::synchronize(device_);
  double t1 = now_s();
  auto pos = torch::tensor(start, torch::kInt64).to(device_);
  const int64_t most = *std::max_element(limit.begin(), limit.end());
  // Which rows are finished, as far as the host has read.
  std::vector<char> done(size_t(R), 0);
  std::vector<int64_t> read(size_t(R), 0); // tokens checked per row
  auto all_done = [&] {
    auto got = torch::stack(ids, 1).to(torch::kCPU); // (R, steps)
    bool all = true;
    for (int64_t r = 0; r < R; ++r) {
      auto& k = read[size_t(r)];
      for (; !done[size_t(r)] && k < got.size(1); ++k)
        if (k + 1 >= limit[size_t(r)] ||
            is_stop(opt, got[r][k].item<int64_t>()))
          done[size_t(r)] = 1;
      all = all && done[size_t(r)];
    }
    return all;
  };
  for (int64_t made = 1; made < most; ++made) {
    if (made % 16 == 0 && all_done())
      break;
    // Rows past their own limit keep decoding at their last position (their
    // tokens are dropped below).
    auto logits = d.step.run(next, pos, d.cache, longest + made);
    torch::Tensor lp;
    next = sampler.sample(logits, 0, &lp);
    pos.add_(1).clamp_max_(capacity - 1);
    ids.push_back(next);
    lps.push_back(lp);
  }
  auto all_ids = torch::stack(ids, 1).to(torch::kCPU);
  auto all_lps = torch::stack(lps, 1).to(torch::kCPU, torch::kFloat32);
  BatchGeneration out;
  int64_t made_total = 0;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int64_t> toks;
    std::vector<float> row_lps;
    std::string finish = "length";
    for (int64_t k = 0; k < std::min(all_ids.size(1), limit[size_t(r)]); ++k) {
      const int64_t id = all_ids[r][k].item<int64_t>();
      toks.push_back(id);
      row_lps.push_back(all_lps[r][k].item<float>());
      if (is_stop(opt, id)) {
        finish = "stop";
        break;
      }
    }
    made_total += int64_t(toks.size());
    out.tokens.push_back(std::move(toks));
    out.logprobs.push_back(std::move(row_lps));
    out.finish.push_back(finish);
  }
  if (stats) {
    stats->prompt_tokens = prompt_tokens;
    stats->new_tokens = made_total;
    stats->prefill_seconds = t1 - t0;
    stats->decode_seconds = now_s() - t1;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> sample_validation_documents(
    const runs::LoadedModel& loaded,
    const std::vector<std::string>& val_shards,
    int count,
    int64_t prompt_tokens,
    const SamplingOptions& opt) {
  const text::Tokenizer& tok = *loaded.tokenizer;
  auto bos = tok.document_start();
  std::vector<std::pair<std::string, std::string>> out;
  if (!bos || val_shards.empty())
    return out;
  // On the device the weights are on (the GPU while training samples).
  Engine engine(loaded.model, loaded.model->device());
  SamplingOptions o = opt;
  o.stop_tokens.push_back(*bos);
  data::Shard shard = data::Shard::open(val_shards.front());
  for (size_t i = 0; i < shard.size() && int(out.size()) < count; ++i) {
    if (shard[i] != *bos || i + 1 + size_t(prompt_tokens) > shard.size())
      continue;
    std::vector<int64_t> prompt;
    std::vector<text::TokenId> prompt_ids;
    for (int64_t k = 0; k <= prompt_tokens; ++k) {
      prompt.push_back(shard[i + k]);
      if (k > 0)
        prompt_ids.push_back(shard[i + k]);
    }
    auto ids = engine.generate(prompt, o);
    std::vector<text::TokenId> gen;
    for (auto id : ids)
      if (id != int64_t(*bos))
        gen.push_back(text::TokenId(id));
    out.push_back({tok.decode(prompt_ids), tok.decode(gen)});
  }
  return out;
}

} // namespace orchard::infer
