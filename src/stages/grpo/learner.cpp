#include "stages/grpo/learner.h"

#include "core/clock.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "dist/world.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

namespace orchard::grpo {
namespace {

// A seed per generation that does not collide with the neighbours'.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFull; // stays exact in JSON
}

std::vector<text::Message> messages_of(const nlohmann::json& m) {
  std::vector<text::Message> out;
  for (const auto& x : m)
    out.push_back({x.at("role").get<std::string>(),
                   x.at("content").get<std::string>()});
  return out;
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0
                   : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

// Bessel-corrected, as torch.std.
double stdev(const std::vector<double>& v) {
  if (v.size() < 2)
    return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v)
    s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

} // namespace

// ---------------------------------------------------------------------------

Prompter::Prompter(
    std::shared_ptr<const text::Tokenizer> tokenizer,
    std::shared_ptr<const text::ChatTemplate> chat,
    int64_t max_prompt_length)
    : tok_(std::move(tokenizer)),
      chat_(std::move(chat)),
      max_prompt_(max_prompt_length) {
  if (chat_) {
    for (auto id : chat_->stop_tokens())
      stops_.push_back(id);
  } else {
    if (auto bos = tok_->document_start())
      stops_.push_back(*bos);
    for (auto id : tok_->document_ends())
      stops_.push_back(id);
  }
  if (stops_.empty())
    throw UserError(
        "the tokenizer has no end-of-turn or end-of-document token, so "
        "completions could not end; use a model whose tokenizer has one.");
}

std::vector<int64_t> Prompter::ids(const Example& e) const {
  std::vector<int64_t> out;
  if (chat_) {
    for (auto id : chat_->generation_prompt(messages_of(e.messages)))
      out.push_back(id);
  } else {
    if (auto bos = tok_->document_start())
      out.push_back(*bos);
    for (auto id : tok_->encode(e.raw))
      out.push_back(id);
  }
  if (int64_t(out.size()) > max_prompt_)
    out.erase(out.begin(), out.end() - max_prompt_);
  return out;
}

std::string Prompter::text(const std::vector<int64_t>& completion) const {
  // Models may have more rows in their embedding than the tokenizer has
  // tokens (Qwen2.5: 151,936 and 151,665); a sampled id past the
  // vocabulary is text nobody can read, so it adds nothing.
  std::string out, piece;
  for (auto id : completion)
    if (std::find(stops_.begin(), stops_.end(), id) == stops_.end() &&
        tok_->token_bytes(text::TokenId(id), piece))
      out += piece;
  return out;
}

// ---------------------------------------------------------------------------

struct Learner::Buffer {
  std::vector<std::vector<int64_t>> prompt_ids; // per prompt
  std::vector<int64_t> prompt_of_row;
  std::vector<std::vector<int64_t>> completions;
  std::vector<char> truncated;
  std::vector<float> advantages;
  std::vector<std::vector<float>> old_logps, ref_logps; // per row, or none
  double active_tokens = 0;
  int64_t offset = 0, pass = 0;
};

Learner::Learner(
    LearnerOptions options,
    Policy policy,
    const Environment& env,
    std::shared_ptr<const Prompter> prompter,
    RewardProcess* rewards)
    : opt_(std::move(options)),
      policy_(std::move(policy)),
      env_(env),
      prompter_(std::move(prompter)),
      rewards_(rewards) {
  if (env_.train().empty())
    throw UserError("the environment has no training prompts.");
  if (env_.reward_names().empty() && !rewards_)
    throw UserError(
        "this environment has no built-in rewards; give reward_cmd=\"...\" "
        "(a command scoring each completion).");
  shuffle_epoch();
}

Learner::~Learner() = default;

void Learner::shuffle_epoch() {
  order_.resize(env_.train().size());
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(mix(opt_.seed, 1000 + uint64_t(epoch_)));
  std::shuffle(order_.begin(), order_.end(), rng);
}

std::vector<std::string> Learner::reward_names() const {
  auto names = env_.reward_names();
  if (rewards_)
    for (const auto& n : rewards_->names())
      names.push_back(n);
  return names;
}

Learner::Scored Learner::rollout(
    const std::vector<const Example*>& examples,
    int64_t samples,
    uint64_t seed) {
  Scored s;
  const double t0 = now_s();
  for (const Example* e : examples)
    s.prompt_ids.push_back(prompter_->ids(*e));
  infer::SamplingOptions so;
  so.max_new_tokens = opt_.max_completion_length;
  so.temperature = opt_.temperature;
  so.top_k = opt_.top_k;
  so.top_p = opt_.top_p;
  so.min_p = opt_.min_p;
  so.repetition_penalty = opt_.repetition_penalty;
  so.seed = seed;
  so.stop_tokens = prompter_->stops();
  so.sampling_device = opt_.sampling_device;
  infer::BatchGeneration g;
  infer::GenerationStats stats;
  {
    // In the weights' own dtype, without gradients or dropout.
    compat::AutocastOff no_autocast(policy_.device.type());
    torch::NoGradGuard no_grad;
    const bool was_training = policy_.model->is_training();
    policy_.model->eval();
    if (!engine_)
      engine_ = std::make_unique<infer::Engine>(
          policy_.model, policy_.device, opt_.graphs);
    g = engine_->generate_batch(s.prompt_ids, samples, so, &stats);
    if (was_training)
      policy_.model->train();
  }
  s.gen_s = now_s() - t0;
  s.tokens_per_s = double(stats.new_tokens) / std::max(s.gen_s, 1e-9);
  const double t1 = now_s();
  s.completions = g.tokens;
  for (const auto& f : g.finish)
    s.truncated.push_back(f == "length");
  // Scores: the environment's functions, then reward_cmd's.
  std::vector<std::string> texts;
  for (const auto& c : s.completions)
    texts.push_back(prompter_->text(c));
  s.scores.resize(texts.size());
  for (size_t p = 0; p < examples.size(); ++p) {
    std::vector<std::string> group(
        texts.begin() + int64_t(p) * samples,
        texts.begin() + int64_t(p + 1) * samples);
    auto sc = env_.score(*examples[p], group);
    for (int64_t j = 0; j < samples; ++j)
      s.scores[p * size_t(samples) + size_t(j)] = sc[size_t(j)];
  }
  if (rewards_) {
    std::vector<nlohmann::json> requests;
    for (size_t r = 0; r < texts.size(); ++r) {
      const Example& e = *examples[r / size_t(samples)];
      nlohmann::json j = e.columns;
      j["prompt"] = prompter_->chat() ? e.messages.back().value("content", "")
                                      : e.raw;
      j["completion"] = texts[r];
      j["completion_ids"] = s.completions[r];
      requests.push_back(std::move(j));
    }
    auto extra = rewards_->score(requests);
    for (size_t r = 0; r < texts.size(); ++r)
      s.scores[r].insert(
          s.scores[r].end(), extra[r].begin(), extra[r].end());
  }
  // Weights: as set (one per function), else the environment's and 1 for
  // each of reward_cmd's.
  const auto names = reward_names();
  std::vector<double> w = opt_.weights;
  if (w.empty()) {
    w = env_.default_weights();
    w.resize(names.size(), 1.0);
  } else if (w.size() != names.size()) {
    std::string list;
    for (const auto& n : names)
      list += (list.empty() ? "" : ", ") + n;
    throw UserError(
        "reward_weights has " + std::to_string(w.size()) +
        " numbers but there are " + std::to_string(names.size()) +
        " reward functions (" + list + "); give one weight for each.");
  }
  for (const auto& row : s.scores) {
    double t = 0;
    for (size_t k = 0; k < row.size(); ++k)
      t += w[k] * row[k];
    s.totals.push_back(t);
  }
  s.score_s = now_s() - t1;
  return s;
}

void Learner::generate() {
  const int64_t G = opt_.num_generations;
  // This process's rows of the whole generation (every process's, in rank
  // order): [first_row, first_row + rows). Where G divides them each
  // process samples whole groups; else (TRL allows it: 2 processes of 4
  // rows, G = 8) a group is split between processes, and each row is
  // generated as a prompt of its own.
  const int64_t rows = opt_.generation_batch, first_row = opt_.rank * rows;
  const bool whole_groups = rows % G == 0;
  std::vector<const Example*> examples; // per prompt, or per row
  for (int64_t i = 0; i < rows * opt_.world / G; ++i) {
    if (cursor_ >= int64_t(order_.size())) {
      ++epoch_;
      cursor_ = 0;
      shuffle_epoch();
    }
    const Example* e = &env_.train()[size_t(order_[size_t(cursor_++)])];
    for (int64_t k = 0; k < (whole_groups ? 1 : G); ++k) {
      const int64_t row = whole_groups ? i * G : i * G + k;
      if (row >= first_row && row < first_row + rows)
        examples.push_back(e);
    }
  }
  // Row r of the whole generation samples with seed + r (the engine adds
  // this process's row to the seed it is given).
  Scored s = rollout(
      examples,
      whole_groups ? G : 1,
      mix(opt_.seed, uint64_t(generations_)) + uint64_t(first_row));
  // The engine's caches and captured graphs would sit through training:
  // the next rollout makes them again.
  engine_.reset();
  ++generations_;
  gen_seconds_ += s.gen_s + s.score_s;

  auto b = std::make_unique<Buffer>();
  b->prompt_ids = s.prompt_ids;
  for (int64_t r = 0; r < rows; ++r)
    b->prompt_of_row.push_back(whole_groups ? r / G : r);
  b->completions = s.completions;
  b->truncated = s.truncated;
  // Advantages over the whole generation (every process's rows; batch
  // scaling's std spans them all), this process taking its own.
  const auto all_totals =
      dist::gather_rows(torch::tensor(s.totals, torch::kFloat64));
  Advantages adv =
      group_advantages(all_totals.to(torch::kFloat32), G, opt_.scale);
  auto a = opt_.zero_advantages
      ? torch::zeros({rows}, torch::kFloat32)
      : adv.values.narrow(0, first_row, rows).contiguous();
  b->advantages.assign(a.data_ptr<float>(), a.data_ptr<float>() + a.numel());
  for (size_t r = 0; r < b->completions.size(); ++r)
    if (!(opt_.mask_truncated && b->truncated[r]))
      b->active_tokens += double(b->completions[r].size());
  // dapo divides by the generation's active tokens: the whole
  // generation's over the processes, as the gradients are then averaged.
  if (opt_.world > 1)
    b->active_tokens = dist::gather_rows(
                           torch::tensor({b->active_tokens}, torch::kFloat64))
                           .sum()
                           .item<double>() /
        double(opt_.world);
  buffer_ = std::move(b);

  // Old and reference log-probabilities, without gradients, in chunks.
  const bool need_ref = opt_.loss.beta != 0.0 && policy_.with_reference;
  if (opt_.keep_old_logps || need_ref) {
    compat::AutocastOff no_autocast(policy_.device.type());
    torch::NoGradGuard no_grad;
    const int64_t chunk = std::min<int64_t>(opt_.generation_batch, 8);
    for (int64_t r0 = 0; r0 < opt_.generation_batch; r0 += chunk) {
      const int64_t n = std::min(chunk, opt_.generation_batch - r0);
      torch::Tensor ids, starts, targets, mask;
      int64_t width = 0;
      batch_rows(r0, n, ids, starts, targets, mask, width);
      auto keep = [&](const torch::Tensor& lp,
                      std::vector<std::vector<float>>& into) {
        auto c = lp.to(torch::kCPU, torch::kFloat32).contiguous();
        for (int64_t i = 0; i < n; ++i) {
          const auto len = int64_t(buffer_->completions[size_t(r0 + i)].size());
          const float* p = c.data_ptr<float>() + i * c.size(1);
          into.emplace_back(p, p + len);
        }
      };
      if (opt_.keep_old_logps)
        keep(logps(*policy_.model, ids, starts, width), buffer_->old_logps);
      if (need_ref)
        policy_.with_reference([&](models::LanguageModel& ref) {
          keep(logps(ref, ids, starts, width), buffer_->ref_logps);
        });
    }
  }

  // The generation's metrics, in TRL's names.
  gen_metrics_.clear();
  const auto names = reward_names();
  for (size_t k = 0; k < names.size(); ++k) {
    std::vector<double> v;
    for (const auto& row : s.scores)
      v.push_back(row[k]);
    gen_metrics_["rewards/" + names[k] + "/mean"] = mean(v);
    gen_metrics_["rewards/" + names[k] + "/std"] = stdev(v);
  }
  // The rewards of the whole generation (every process's); the rest of
  // these figures are this process's rows.
  const auto t = all_totals.contiguous();
  const std::vector<double> totals(
      t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  gen_metrics_["reward"] = mean(totals);
  std::vector<double> group_std;
  int64_t zero_std = 0;
  const int64_t groups = int64_t(totals.size()) / G;
  for (int64_t p = 0; p < groups; ++p) {
    std::vector<double> g(totals.begin() + p * G, totals.begin() + (p + 1) * G);
    group_std.push_back(stdev(g));
    zero_std += group_std.back() == 0.0;
  }
  gen_metrics_["reward_std"] = mean(group_std);
  gen_metrics_["frac_reward_zero_std"] = double(zero_std) / double(groups);
  std::vector<double> lengths;
  int64_t clipped = 0;
  for (size_t r = 0; r < s.completions.size(); ++r) {
    lengths.push_back(double(s.completions[r].size()));
    clipped += s.truncated[r];
  }
  gen_metrics_["completions/mean_length"] = mean(lengths);
  gen_metrics_["completions/min_length"] =
      *std::min_element(lengths.begin(), lengths.end());
  gen_metrics_["completions/max_length"] =
      *std::max_element(lengths.begin(), lengths.end());
  gen_metrics_["completions/clipped_ratio"] =
      double(clipped) / double(lengths.size());
  gen_metrics_["rollout_tokens_per_s"] = s.tokens_per_s;
  gen_metrics_["generation_s"] = s.gen_s;
  gen_metrics_["scoring_s"] = s.score_s;
}

void Learner::batch_rows(
    int64_t row0,
    int64_t n,
    torch::Tensor& ids,
    torch::Tensor& starts,
    torch::Tensor& targets,
    torch::Tensor& mask,
    int64_t& width) const {
  const Buffer& b = *buffer_;
  int64_t L = 0;
  width = 1;
  for (int64_t i = 0; i < n; ++i) {
    const auto r = size_t(row0 + i);
    const auto P = int64_t(b.prompt_ids[size_t(b.prompt_of_row[r])].size());
    const auto C = int64_t(b.completions[r].size());
    L = std::max(L, P + C);
    width = std::max(width, C);
  }
  ids = torch::zeros({n, L}, torch::kLong);
  starts = torch::zeros({n}, torch::kLong);
  targets = torch::zeros({n, width}, torch::kLong);
  mask = torch::zeros({n, width}, torch::kFloat32);
  auto ia = ids.accessor<int64_t, 2>();
  auto sa = starts.accessor<int64_t, 1>();
  auto ta = targets.accessor<int64_t, 2>();
  auto ma = mask.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const auto r = size_t(row0 + i);
    const auto& p = b.prompt_ids[size_t(b.prompt_of_row[r])];
    const auto& c = b.completions[r];
    for (size_t k = 0; k < p.size(); ++k)
      ia[i][int64_t(k)] = p[k];
    for (size_t k = 0; k < c.size(); ++k) {
      ia[i][int64_t(p.size() + k)] = c[k];
      ta[i][int64_t(k)] = c[k];
      ma[i][int64_t(k)] = opt_.mask_truncated && b.truncated[r] ? 0.f : 1.f;
    }
    sa[i] = int64_t(p.size());
  }
  const auto dev = policy_.device;
  ids = ids.to(dev);
  starts = starts.to(dev);
  targets = targets.to(dev);
  mask = mask.to(dev);
}

torch::Tensor Learner::logps(
    models::LanguageModel& model,
    const torch::Tensor& ids,
    const torch::Tensor& starts,
    int64_t completion_len) {
  // Token j of row r is predicted at position starts[r] - 1 + j (rows
  // shorter than the widest repeat their last position; masked out).
  const int64_t from = starts.min().item<int64_t>() - 1;
  auto cols = (starts - 1).unsqueeze(1) +
      torch::arange(completion_len, starts.options()).unsqueeze(0);
  cols = cols.clamp_max(ids.size(1) - 2);
  auto targets = ids.gather(1, cols + 1);
  return model.token_logprobs(ids, from, cols, targets, opt_.temperature);
}

torch::Tensor Learner::micro_step(int64_t micro_batch) {
  if (!buffer_ || buffer_->pass >= opt_.policy_iterations)
    generate();
  Buffer& b = *buffer_;
  if (b.offset + micro_batch > opt_.generation_batch)
    throw std::logic_error("[grpo] micro-batch past the generation batch");
  torch::Tensor ids, starts, targets, mask;
  int64_t width = 0;
  batch_rows(b.offset, micro_batch, ids, starts, targets, mask, width);
  auto lp = logps(*policy_.model, ids, starts, width);
  auto rows_tensor = [&](const std::vector<std::vector<float>>& v) {
    auto t = torch::zeros({micro_batch, width}, torch::kFloat32);
    for (int64_t i = 0; i < micro_batch; ++i) {
      const auto& row = v[size_t(b.offset + i)];
      std::copy(row.begin(), row.end(), t[i].data_ptr<float>());
    }
    return t.to(policy_.device);
  };
  torch::Tensor old, ref;
  if (!b.old_logps.empty())
    old = rows_tensor(b.old_logps);
  if (!b.ref_logps.empty())
    ref = rows_tensor(b.ref_logps);
  auto adv = torch::from_blob(
                 b.advantages.data() + b.offset, {micro_batch}, torch::kFloat32)
                 .clone()
                 .to(policy_.device);
  LossOptions lo = opt_.loss;
  lo.generation_batch_tokens = std::max(1.0, b.active_tokens);
  lo.accumulation_steps = 1; // the Trainer divides by its accumulation
  LossParts parts = policy_loss(lp, old, ref, adv, mask, lo);
  torch::Tensor loss = parts.loss;
  // dapo's normaliser already spans the step: undo the Trainer's division.
  if (lo.type == LossType::dapo)
    loss = loss * double(opt_.rows_per_step / micro_batch);
  auto add = [&](const std::string& k, const torch::Tensor& t) {
    if (t.defined())
      loss_sums_[k] += t.item<double>();
  };
  add("kl", parts.kl);
  add("clip_ratio/low_mean", parts.clip_low);
  add("clip_ratio/high_mean", parts.clip_high);
  add("clip_ratio/region_mean", parts.clip_region);
  ++loss_count_;
  b.offset += micro_batch;
  if (b.offset == opt_.generation_batch) {
    b.offset = 0;
    ++b.pass;
  }
  return loss;
}

std::map<std::string, double> Learner::step_metrics() {
  std::map<std::string, double> m = gen_metrics_;
  for (const auto& [k, v] : loss_sums_)
    m[k] = v / double(std::max<int64_t>(1, loss_count_));
  loss_sums_.clear();
  loss_count_ = 0;
  // Seconds are the generation's own: once.
  gen_metrics_.erase("generation_s");
  gen_metrics_.erase("scoring_s");
  return m;
}

std::string Learner::progress_note() const {
  auto it = gen_metrics_.find("reward");
  if (it == gen_metrics_.end())
    return "";
  char buf[96];
  std::snprintf(
      buf,
      sizeof buf,
      "reward %.3f (group std %.3f)",
      it->second,
      gen_metrics_.count("reward_std") ? gen_metrics_.at("reward_std") : 0.0);
  return buf;
}

Evaluation Learner::evaluate(int64_t prompts) {
  const auto& pool = env_.held_out();
  const int64_t n = std::min<int64_t>(prompts, int64_t(pool.size()));
  const int64_t G = opt_.num_generations;
  const int64_t per_call =
      std::max<int64_t>(1, opt_.generation_batch / G); // bounds memory
  Evaluation ev;
  std::vector<double> sums;
  double total = 0;
  for (int64_t p0 = 0; p0 < n; p0 += per_call) {
    std::vector<const Example*> ex;
    for (int64_t i = p0; i < std::min(n, p0 + per_call); ++i)
      ex.push_back(&pool[size_t(i * int64_t(pool.size()) / n)]);
    Scored s = rollout(ex, G, mix(opt_.seed ^ 0x5EED, uint64_t(p0)));
    for (size_t r = 0; r < s.scores.size(); ++r) {
      sums.resize(s.scores[r].size(), 0.0);
      for (size_t k = 0; k < s.scores[r].size(); ++k)
        sums[k] += s.scores[r][k];
      total += s.totals[r];
      ev.success += env_.success(s.scores[r]) ? 1.0 : 0.0;
      ++ev.completions;
    }
  }
  engine_.reset(); // as after a training rollout
  const auto names = reward_names();
  ev.reward = total / double(std::max<int64_t>(1, ev.completions));
  ev.success /= double(std::max<int64_t>(1, ev.completions));
  for (size_t k = 0; k < sums.size() && k < names.size(); ++k)
    ev.per_function.push_back(
        {names[k], sums[k] / double(std::max<int64_t>(1, ev.completions))});
  return ev;
}

std::vector<Learner::Sample> Learner::samples(int count, uint64_t seed) {
  const auto& pool = env_.held_out();
  std::vector<const Example*> ex;
  const int64_t n = std::min<int64_t>(count, int64_t(pool.size()));
  for (int64_t i = 0; i < n; ++i)
    ex.push_back(&pool[size_t(i * int64_t(pool.size()) / std::max<int64_t>(1, n))]);
  std::vector<Sample> out;
  if (ex.empty())
    return out;
  Scored s = rollout(ex, 1, seed);
  engine_.reset();
  for (size_t i = 0; i < ex.size(); ++i) {
    const Example& e = *ex[i];
    const std::string prompt = prompter_->chat()
        ? e.messages.back().value("content", "")
        : e.raw;
    const auto ref = e.columns.find("reference");
    out.push_back(
        {prompt,
         prompter_->text(s.completions[i]),
         s.totals[i],
         ref != e.columns.end() && ref->is_string() ? ref->get<std::string>()
                                                    : ""});
  }
  return out;
}

nlohmann::json Learner::state() const {
  nlohmann::json j = {
      {"epoch", epoch_}, {"cursor", cursor_}, {"generations", generations_}};
  if (buffer_ && buffer_->pass < opt_.policy_iterations) {
    const Buffer& b = *buffer_;
    j["buffer"] = {
        {"prompt_ids", b.prompt_ids},
        {"prompt_of_row", b.prompt_of_row},
        {"completions", b.completions},
        {"truncated", std::vector<int>(b.truncated.begin(), b.truncated.end())},
        {"advantages", b.advantages},
        {"old_logps", b.old_logps},
        {"ref_logps", b.ref_logps},
        {"active_tokens", b.active_tokens},
        {"offset", b.offset},
        {"pass", b.pass},
        {"metrics", gen_metrics_}};
  }
  return j;
}

void Learner::restore(const nlohmann::json& j) {
  try {
    epoch_ = j.at("epoch");
    cursor_ = j.at("cursor");
    generations_ = j.at("generations");
    shuffle_epoch();
    buffer_.reset();
    if (j.contains("buffer")) {
      const auto& x = j["buffer"];
      auto b = std::make_unique<Buffer>();
      b->prompt_ids = x.at("prompt_ids").get<std::vector<std::vector<int64_t>>>();
      b->prompt_of_row = x.at("prompt_of_row").get<std::vector<int64_t>>();
      b->completions =
          x.at("completions").get<std::vector<std::vector<int64_t>>>();
      for (int t : x.at("truncated").get<std::vector<int>>())
        b->truncated.push_back(char(t));
      b->advantages = x.at("advantages").get<std::vector<float>>();
      b->old_logps = x.at("old_logps").get<std::vector<std::vector<float>>>();
      b->ref_logps = x.at("ref_logps").get<std::vector<std::vector<float>>>();
      b->active_tokens = x.at("active_tokens");
      b->offset = x.at("offset");
      b->pass = x.at("pass");
      gen_metrics_ = x.at("metrics").get<std::map<std::string, double>>();
      if (int64_t(b->completions.size()) != opt_.generation_batch)
        throw UserError(
            "the checkpoint's rollouts hold " +
            std::to_string(b->completions.size()) +
            " completions, but this run's generation batch is " +
            std::to_string(opt_.generation_batch) +
            "; resume with the settings it was made with, or start over "
            "with resume=never.");
      buffer_ = std::move(b);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError(
        std::string("the checkpoint's GRPO data state is damaged (") +
        e.what() + "); resume from an earlier checkpoint or resume=never.");
  }
}

} // namespace orchard::grpo
