#include "stages/trm/recursion.h"

#include "text/tokenizer_io.h"

#include "core/error.h"
#include "core/torch_compat.h"
#include "dist/world.h"
#include "models/trm_language_model.h"
#include "ops/stablemax.h"
#include "runs/load.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

namespace orchard::trm {
namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

using data::kIgnoreLabel;
// The halting losses' weight against the cells' (upstream's 0.5).
constexpr double kQLossWeight = 0.5;

torch::Tensor bce_sum(
    const torch::Tensor& logits,
    const torch::Tensor& target) {
  return F::binary_cross_entropy_with_logits(
      logits,
      target.to(logits.scalar_type()),
      F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum));
}

} // namespace

StepLoss act_loss(
    const models::TrmStepOutput& out,
    const torch::Tensor& labels,
    const torch::Tensor& target_continue) {
  StepLoss r;
  const auto valid = labels != kIgnoreLabel;
  const auto counts = valid.sum(-1).clamp_min(1);
  const auto ce =
      ops::stablemax_cross_entropy(out.logits, labels, kIgnoreLabel);
  const auto lm = ce.sum(-1) / counts.to(torch::kFloat64); // (B)
  {
    torch::NoGradGuard no_grad;
    const auto right = valid & (out.logits.argmax(-1) == labels);
    const auto n_right = right.sum(-1);
    r.exact = n_right == valid.sum(-1);
    r.cells = n_right.to(torch::kFloat64) / counts.to(torch::kFloat64);
  }
  auto q = bce_sum(out.q_halt, r.exact);
  if (target_continue.defined())
    q = q + bce_sum(out.q_continue, target_continue);
  // float32 (float64 where the model runs in it, as the reference tests do).
  r.loss = (lm.sum() + kQLossWeight * q).to(out.q_halt.scalar_type());
  r.lm = lm.detach();
  return r;
}

RowStream::RowStream(int64_t rows, uint64_t seed) : rows_(rows), seed_(seed) {
  shuffle();
}

void RowStream::shuffle() {
  // Fisher-Yates with our own draw: the same order from every standard
  // library (std::shuffle's is the library's own).
  std::seed_seq seq{seed_, uint64_t(epoch_), uint64_t(0x7e57)};
  std::mt19937_64 rng(seq);
  order_.resize(size_t(rows_));
  for (int64_t i = 0; i < rows_; ++i)
    order_[size_t(i)] = i;
  for (int64_t i = rows_ - 1; i > 0; --i)
    std::swap(order_[size_t(i)], order_[size_t(rng() % uint64_t(i + 1))]);
}

std::vector<int64_t> RowStream::next(int64_t count) {
  std::vector<int64_t> out;
  out.reserve(size_t(count));
  while (int64_t(out.size()) < count) {
    if (position_ == rows_) {
      ++epoch_;
      position_ = 0;
      shuffle();
    }
    out.push_back(order_[size_t(position_++)]);
  }
  return out;
}

nlohmann::json RowStream::state() const {
  return {{"epoch", epoch_}, {"position", position_}, {"rows", rows_}};
}

void RowStream::restore(const nlohmann::json& j) {
  if (j.value("rows", rows_) != rows_)
    throw UserError(
        "the checkpoint was trained on " +
        std::to_string(j.value("rows", int64_t(0))) +
        " training rows, this data has " + std::to_string(rows_) +
        ": the data changed. Use the run's data, another run name, or "
        "resume=never.");
  epoch_ = j.at("epoch");
  position_ = j.at("position");
  shuffle();
}

double RowStream::epochs_done() const {
  return double(epoch_) +
      double(position_) / double(std::max<int64_t>(1, rows_));
}

ActTrainer::ActTrainer(
    models::Trm model,
    data::PuzzleSet train,
    int64_t slots,
    uint64_t seed,
    torch::Device device)
    : model_(std::move(model)),
      train_(std::move(train)),
      slots_(slots),
      device_(device),
      stream_(train_.size(), seed),
      rank_(dist::rank()),
      world_(dist::size()) {
  now_ = fresh();
  next_ = fresh();
}

void ActTrainer::draw_step_rows() {
  const torch::Tensor all =
      dist::gather_rows(now_.halted_cpu.to(torch::kUInt8)).contiguous();
  const auto* h = all.data_ptr<uint8_t>();
  int64_t before = 0, total = 0;
  for (int64_t i = 0; i < all.numel(); ++i)
    if (h[i]) {
      before += i < int64_t(rank_) * slots_ ? 1 : 0;
      ++total;
    }
  step_rows_ = stream_.next(total);
  rows_used_ = size_t(before);
  // Exploration drawn for the world's slots too: every rank draws the same
  // numbers (its generator stays in step with rank 0's, whose state the
  // checkpoint keeps) and takes its own.
  const auto& c = model_->config;
  if (c.halt_max_steps > 1)
    step_minimum_ = to_device(
        models::exploration_minimum(c, slots_ * world_)
            .narrow(0, int64_t(rank_) * slots_, slots_)
            .contiguous());
}

ActTrainer::Carry ActTrainer::fresh() const {
  const auto& c = model_->config;
  const auto f = torch::TensorOptions().device(device_);
  Carry k;
  k.z_H = torch::zeros({slots_, c.positions(), c.hidden_size}, f);
  k.z_L = torch::zeros_like(k.z_H);
  k.steps = torch::zeros({slots_}, f.dtype(torch::kLong));
  k.halted = torch::ones({slots_}, f.dtype(torch::kBool)); // empty slots
  k.halted_cpu = torch::ones({slots_}, torch::kBool);
  k.inputs = torch::zeros({slots_, c.seq_len}, f.dtype(torch::kLong));
  k.labels = torch::zeros_like(k.inputs);
  k.ids = torch::zeros({slots_}, f.dtype(torch::kLong));
  return k;
}

torch::Tensor ActTrainer::micro_step(int64_t micro) {
  const int64_t from = done_slots_;
  TORCH_CHECK(
      micro > 0 && from + micro <= slots_ && slots_ % micro == 0,
      "[trm] micro-batch ",
      micro,
      " does not divide ",
      slots_,
      " slots");
  const auto& c = model_->config;
  auto part = [&](const torch::Tensor& t) { return t.narrow(0, from, micro); };
  const auto halted = part(now_.halted);
  auto inputs = part(now_.inputs).clone();
  auto labels = part(now_.labels).clone();
  auto ids = part(now_.ids).clone();
  // Halted slots take the next rows.
  if (from == 0)
    draw_step_rows();
  const auto idx_cpu =
      now_.halted_cpu.narrow(0, from, micro).nonzero().squeeze(1);
  if (idx_cpu.numel() > 0) {
    const auto first = step_rows_.begin() + std::ptrdiff_t(rows_used_);
    const std::vector<int64_t> rows(first, first + idx_cpu.numel());
    rows_used_ += rows.size();
    const auto r = torch::tensor(rows, torch::kLong);
    const auto idx = to_device(idx_cpu);
    inputs.index_copy_(0, idx, to_device(train_.inputs.index_select(0, r)));
    labels.index_copy_(0, idx, to_device(train_.labels.index_select(0, r)));
    ids.index_copy_(0, idx, to_device(train_.puzzle_ids.index_select(0, r)));
  }
  const int64_t D = c.hidden_size;
  const auto reset = halted.view({-1, 1, 1});
  const auto z_H = torch::where(
      reset,
      model_->H_init.view({1, 1, D}).to(torch::kFloat32),
      part(now_.z_H));
  const auto z_L = torch::where(
      reset,
      model_->L_init.view({1, 1, D}).to(torch::kFloat32),
      part(now_.z_L));
  auto steps = torch::where(
      halted, torch::zeros_like(part(now_.steps)), part(now_.steps));

  const auto out = model_->step(z_H, z_L, inputs, ids);
  steps = steps + 1;
  torch::Tensor target_continue;
  if (!c.no_ACT_continue && c.halt_max_steps > 1) {
    // The value of continuing: the next step's best Q (its halt Q at the
    // last step), without gradients and without replay buffers (the
    // batch's many slots play parallel environments).
    torch::NoGradGuard no_grad;
    const auto nxt = model_->step(out.z_H, out.z_L, inputs, ids);
    target_continue = torch::sigmoid(torch::where(
        steps >= c.halt_max_steps,
        nxt.q_halt,
        torch::maximum(nxt.q_halt, nxt.q_continue)));
  }
  torch::Tensor now_halted;
  {
    torch::NoGradGuard no_grad;
    now_halted = models::halt_decision(
        c,
        steps,
        out.q_halt.detach(),
        out.q_continue.detach(),
        true,
        step_minimum_.defined() ? part(step_minimum_) : torch::Tensor());
  }
  const StepLoss loss = act_loss(out, labels, target_continue);
  {
    torch::NoGradGuard no_grad;
    part(next_.z_H).copy_(out.z_H);
    part(next_.z_L).copy_(out.z_L);
    part(next_.steps).copy_(steps);
    part(next_.halted).copy_(now_halted);
    part(next_.inputs).copy_(inputs);
    part(next_.labels).copy_(labels);
    part(next_.ids).copy_(ids);
    const auto h = now_halted.to(torch::kFloat64);
    // The step's one host sync: the halted puzzles' sums and the mask.
    const auto sums =
        torch::cat({torch::stack(
                        {h.sum(),
                         (loss.exact.to(torch::kFloat64) * h).sum(),
                         (loss.cells * h).sum(),
                         (steps.to(torch::kFloat64) * h).sum()}),
                    h})
            .cpu();
    next_.halted_cpu.narrow(0, from, micro)
        .copy_(sums.narrow(0, 4, micro) > 0.5);
    const auto* s = sums.data_ptr<double>();
    pending_.halted += int64_t(s[0]);
    pending_.exact += s[1];
    pending_.cells += s[2];
    pending_.steps += s[3];
  }
  done_slots_ += micro;
  if (done_slots_ == slots_) {
    std::swap(now_, next_);
    done_slots_ = 0;
    metrics_ = pending_;
    pending_ = {};
  }
  return loss.loss / double(micro);
}

nlohmann::json ActTrainer::data_state() const {
  return stream_.state();
}

void ActTrainer::restore_data(const nlohmann::json& j) {
  stream_.restore(j);
  done_slots_ = 0; // a half-done step is dropped: `now_` is its start
  pending_ = {};
}

runs::NamedTensors ActTrainer::carry_tensors() const {
  return {
      {"carry.z_H", now_.z_H},
      {"carry.z_L", now_.z_L},
      {"carry.steps", now_.steps},
      {"carry.halted", now_.halted.to(torch::kUInt8)},
      {"carry.inputs", now_.inputs},
      {"carry.labels", now_.labels},
      {"carry.puzzle_ids", now_.ids}};
}

void ActTrainer::restore_carry(
    const std::map<std::string, torch::Tensor>& saved) {
  torch::NoGradGuard no_grad;
  // The checkpoint holds every rank's slots (global_batch_size of them);
  // this rank takes its own, whatever the number of processes that saved.
  auto put = [&](const std::string& key, torch::Tensor& into) {
    auto it = saved.find(key);
    if (it == saved.end() || it->second.dim() != into.dim() ||
        it->second.size(0) != slots_ * world_ ||
        it->second.sizes().slice(1) != into.sizes().slice(1))
      throw UserError(
          "the checkpoint's ACT carry ('" + key +
          "') is missing or of another shape: global_batch_size or the "
          "model changed. Use the run's settings, another run name, or "
          "resume=never.");
    into.copy_(it->second.narrow(0, int64_t(rank_) * slots_, slots_)
                   .to(into.scalar_type()));
  };
  put("carry.z_H", now_.z_H);
  put("carry.z_L", now_.z_L);
  put("carry.steps", now_.steps);
  put("carry.halted", now_.halted);
  put("carry.inputs", now_.inputs);
  put("carry.labels", now_.labels);
  put("carry.puzzle_ids", now_.ids);
  now_.halted_cpu = now_.halted.to(torch::kCPU).clone();
}

torch::Tensor ActTrainer::to_device(const torch::Tensor& t) const {
  return compat::to_device_async(t, device_);
}

TrainMetrics ActTrainer::take_metrics() {
  TrainMetrics m = metrics_;
  metrics_ = {};
  return m;
}

nlohmann::json EvalStats::to_json() const {
  return {
      {"puzzles", puzzles},
      {"exact_accuracy", exact},
      {"cell_accuracy", cells},
      {"q_halt_accuracy", q_halt_accuracy},
      {"loss", loss},
      {"exact_accuracy_by_step", exact_by_step}};
}

EvalStats evaluate(
    models::Trm& model,
    const data::PuzzleSet& set,
    int64_t count,
    int64_t batch,
    torch::Device device) {
  EvalStats s;
  const int64_t steps = model->config.halt_max_steps;
  count = std::min(count, set.size());
  s.puzzles = count;
  s.exact_by_step.assign(size_t(steps), 0.0);
  for (int64_t from = 0; from < count; from += batch) {
    const int64_t b = std::min(batch, count - from);
    const auto inputs = set.inputs.narrow(0, from, b).to(device);
    const auto labels = set.labels.narrow(0, from, b).to(device);
    const auto ids = set.puzzle_ids.narrow(0, from, b).to(device);
    auto [z_H, z_L] = model->initial_carry(b);
    for (int64_t k = 0; k < steps; ++k) {
      const auto out = model->step(z_H, z_L, inputs, ids);
      z_H = out.z_H;
      z_L = out.z_L;
      const StepLoss l = act_loss(out, labels);
      s.exact_by_step[size_t(k)] += l.exact.sum().item<double>();
      if (k + 1 == steps) {
        s.exact += l.exact.sum().item<double>();
        s.cells += l.cells.sum().item<double>();
        s.q_halt_accuracy +=
            ((out.q_halt >= 0) == l.exact).sum().item<double>();
        s.loss += l.lm.sum().item<double>();
      }
    }
  }
  const double n = double(std::max<int64_t>(1, count));
  s.exact /= n;
  s.cells /= n;
  s.q_halt_accuracy /= n;
  s.loss /= n;
  for (auto& e : s.exact_by_step)
    e /= n;
  return s;
}

TrainedTrm load_trm(const std::string& path, torch::Device device) {
  const std::optional<runs::Checkpoint> ckpt =
      runs::checkpoint_at(path, "a stage=trm run, such as runs/trm/NAME");
  if (!ckpt->state.contains("trm"))
    throw UserError(
        ckpt->dir + " is not a tiny recursive model (stage=trm) checkpoint.");
  TrainedTrm out;
  out.model = models::Trm(models::trm_config_from_json(ckpt->state.at("trm")));
  torch::NoGradGuard no_grad;
  for (auto& named : out.model->named_parameters()) {
    auto it = ckpt->model.find("ema." + named.key());
    if (it != ckpt->model.end())
      out.ema = true;
    else
      it = ckpt->model.find(named.key());
    if (it == ckpt->model.end() || it->second.sizes() != named.value().sizes())
      throw UserError(
          "checkpoint " + ckpt->dir + " lacks '" + named.key() +
          "' or has it in another shape.");
    named.value().copy_(it->second);
  }
  for (const char* key : {"H_init", "L_init"}) {
    auto it = ckpt->model.find(key);
    if (it == ckpt->model.end())
      throw UserError("checkpoint " + ckpt->dir + " lacks '" + key + "'.");
    out.model->named_buffers()[key].copy_(it->second);
  }
  out.model->to(device);
  out.model->eval();
  out.state = ckpt->state;
  out.checkpoint_dir = ckpt->dir;
  out.data = ckpt->state.value("data", "");
  return out;
}

runs::LoadedModel load_trm_chat(const std::string& path, torch::Device device) {
  TrainedTrm t = load_trm(path, device);
  const std::string tokenizer = t.state.value("tokenizer_dir", "");
  if (!t.model->config.causal || tokenizer.empty())
    throw UserError(
        t.checkpoint_dir +
        " is a tiny recursive model trained on puzzles, not conversations: "
        "`orchard solve --checkpoint` and `orchard eval --checkpoint` use "
        "it.");
  if (!fs::exists(tokenizer) && !text::builtin_tokenizer(tokenizer))
    throw UserError(
        "the tokenizer " + t.checkpoint_dir + " was trained with, " +
        tokenizer + ", is gone; put it back there.");
  auto lm = std::make_shared<models::TrmLanguageModel>(t.model);
  runs::LoadedModel out =
      runs::loaded_from(lm, tokenizer, t.state.value("chat_template", ""));
  out.checkpoint_dir = t.checkpoint_dir;
  out.step = t.state.value("step", int64_t(0));
  out.description = t.checkpoint_dir + " (a tiny recursive model, " +
      (t.ema ? "EMA" : "raw") + " weights, " +
      std::to_string(t.model->config.halt_max_steps) +
      " supervision steps a token, up to " +
      std::to_string(t.model->config.seq_len) + " tokens)";
  out.name = fs::path(t.checkpoint_dir).lexically_normal().string();
  return out;
}

bool is_trm_checkpoint(const std::string& path) {
  fs::path state = fs::path(path) / "state.json";
  if (!fs::exists(state)) {
    const auto all = runs::list_checkpoints(path);
    if (all.empty())
      return false;
    state = fs::path(all.back().second) / "state.json";
  }
  std::ifstream in(state);
  const auto j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() && j.contains("trm");
}

std::vector<Solution> solve(
    models::Trm& model,
    const torch::Tensor& inputs,
    const torch::Tensor& puzzle_ids,
    torch::Device device) {
  const int64_t B = inputs.size(0);
  std::vector<Solution> out(static_cast<size_t>(B));
  const auto in = inputs.to(device);
  const auto ids = puzzle_ids.to(device);
  auto [z_H, z_L] = model->initial_carry(B);
  std::vector<bool> done(size_t(B), false);
  for (int64_t k = 1; k <= model->config.halt_max_steps; ++k) {
    const auto step = model->step(z_H, z_L, in, ids);
    z_H = step.z_H;
    z_L = step.z_L;
    const auto pred = step.logits.argmax(-1).cpu();
    const auto halt = (step.q_halt > 0).cpu();
    for (int64_t b = 0; b < B; ++b) {
      if (done[size_t(b)])
        continue;
      const bool by_q = halt[b].item<bool>();
      if (by_q || k == model->config.halt_max_steps) {
        const auto row = pred[b].contiguous();
        out[size_t(b)].tokens.assign(
            row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
        out[size_t(b)].steps = k;
        out[size_t(b)].halted_by_q = by_q;
        done[size_t(b)] = true;
      }
    }
  }
  return out;
}

} // namespace orchard::trm
