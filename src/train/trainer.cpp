#include "train/trainer.h"
#include "core/clock.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/memory_stats.h"
#include "core/progress.h"
#include "core/torch_compat.h"
#include "dist/launch_env.h"
#include "dist/world.h"
#include "ops/copy_pieces.h"
#include "ops/mean_of.h"
#include "train/schedule.h"
#include "train/sharded_optimizer.h"
#include "train/step_trace.h"
#include "train/train_state.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>

#if defined(ORCHARD_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/detail/MPSHooksInterface.h>
#endif

namespace orchard::train {
namespace {

// The parameters a run trains, and so checkpoints, averages and restores:
// those that require gradients (a LoRA run's adapters, not its frozen base).
std::vector<std::pair<std::string, torch::Tensor>> trained_parameters(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters())
    if (p.value().requires_grad())
      out.push_back({p.key(), p.value()});
  return out;
}

// Returns cached blocks to the device after an out-of-memory error.
void free_device_caches(const torch::Device& device) {
#if defined(ORCHARD_WITH_CUDA)
  if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
#if TORCH_VERSION_MAJOR >= 2
  if (device.is_mps() && compat::mps_available())
    at::detail::getMPSHooks().emptyCache();
#endif
}

std::atomic<int> g_stop_signal{0};   // the signal this process was sent
std::atomic<int> g_agreed_signal{0}; // several processes: another rank's

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

// SIGINT, SIGTERM and SIGHUP (the terminal or the ssh session closed) set
// a flag; the loop finishes its step, saves and exits. (SIGPIPE is ignored
// by the whole program: cli/main.cpp.)
struct SignalGuard {
  static constexpr int kStops[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old[3] = {};
  SignalGuard() {
    g_stop_signal = 0;
    g_agreed_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i)
      sigaction(kStops[i], &sa, &old[i]);
  }
  ~SignalGuard() {
    for (int i = 0; i < 3; ++i)
      sigaction(kStops[i], &old[i], nullptr);
  }
};

// Steps in a row with a non-finite gradient (float32/bfloat16) before the
// run stops as diverged rather than train on garbage.
constexpr int64_t kMaxNonFiniteSteps = 5;
// float16 with loss scaling: a scale below this means the gradient is not
// finite even unscaled.
constexpr double kMinLossScale = 1.0;

double number_or(
    const nlohmann::json& j,
    const std::string& key,
    double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>()
                                               : fallback;
}

} // namespace

std::vector<torch::Tensor> trained_tensors(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : trained_parameters(model))
    out.push_back(t);
  return out;
}

void make_run_folder(
    const std::string& dir,
    const std::function<void()>& write) {
  if (dist::leader()) {
    std::filesystem::create_directories(dir);
    if (write)
      write();
  }
  dist::barrier("creating the run folder");
}

RunLog::RunLog(const std::string& path) {
  if (dist::leader()) // with several processes, rank 0 alone writes
    file_.open(path, std::ios::app);
}

void RunLog::operator()(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  file_only(line);
}

void RunLog::file_only(const std::string& line) {
  if (!file_.is_open())
    return;
  file_ << line << "\n";
  file_.flush();
}

Trainer::Trainer(
    TrainerOptions options,
    TrainingTask task,
    Optimizers& optimizers,
    RunLog& log)
    : opt_(std::move(options)),
      task_(std::move(task)),
      optimizers_(optimizers),
      log_(log),
      scaler_(opt_.precision.loss_scaling) {
  if (const char* rows = std::getenv("ORCHARD_TEST_OOM_ROWS"))
    test_oom_rows_ = std::atoll(rows);
  if (opt_.ema) {
    torch::NoGradGuard no_grad;
    for (const auto& p : trained_tensors(*task_.model))
      ema_.push_back(p.detach().clone());
  }
}

int last_stop_signal() {
  return g_stop_signal ? int(g_stop_signal) : int(g_agreed_signal);
}

std::string signal_name(int sig) {
  return sig == SIGINT ? "SIGINT (Ctrl-C)"
      : sig == SIGTERM ? "SIGTERM"
      : sig == SIGHUP  ? "SIGHUP (the terminal closed)"
                       : "signal " + std::to_string(sig);
}

int agreed_stop_signal(double signalled, double signal_sum) {
  if (signalled <= 0)
    return 0;
  const double mean = signal_sum / signalled;
  const long sig = std::lround(mean);
  // Ranks sent different signals: a mean that is none of them.
  return std::abs(mean - double(sig)) < 1e-3 && sig > 0 && sig < 64 ? int(sig)
                                                                    : SIGTERM;
}

void Trainer::make_averager() {
  if (!dist::active() || averager_)
    return;
  const auto trained = trained_tensors(*task_.model);
  // ZeRO-1's all-gather may send the parameters products read in the
  // compute dtype in that dtype, unless the EMA reads their float32 values.
  const bool low = opt_.device.is_cuda() &&
      opt_.precision.compute != torch::kFloat32 && ema_.empty();
  const dist::AveragingOptions sends{
      .same_rows_on_every_rank = task_.same_shapes_on_every_rank,
      .reduce_dtype = opt_.grad_reduce_dtype,
      .bucket_bytes = opt_.bucket_cap_mb << 20,
      .mover = opt_.grad_average,
      .mean_of = ops::mean_of,
      .gather_dtype = low ? opt_.precision.compute : torch::kFloat32,
      .copy_pieces = ops::prepare_copies};
  if (opt_.zero_stage < 1) {
    averager_ = dist::GradientAverager::make(trained, sends);
    return;
  }
  std::vector<dist::Shardable> shards = shardables(optimizers_, trained);
  for (auto& s : shards) {
    for (const auto& t : task_.read_in_compute_dtype)
      s.low = s.low || t.is_same(s.param);
    for (const auto& t : task_.embeddings)
      s.everywhere = s.everywhere ||
          (task_.same_shapes_on_every_rank && !s.whole && t.is_same(s.param));
  }
  averager_ = dist::GradientAverager::make_sharded(shards, sends);
  shard_optimizers_ = optimizers_of_pieces(optimizers_, averager_->pieces());
  int64_t mine = 0, all = 0, everywhere = 0;
  for (const auto& p : averager_->pieces()) {
    (p.everywhere ? everywhere : mine) += p.length;
    if (p.everywhere)
      everywhere_.insert(p.value.unsafeGetTensorImpl());
  }
  for (const auto& t : trained)
    all += t.numel();
  shard_note_ = "Optimizer state sharded over " + std::to_string(dist::size()) +
      " processes (zero_stage=1): rank 0 steps " + std::to_string(mine) +
      " of the " + std::to_string(all) +
      " trained values and keeps their state only" +
      (everywhere > 0 ? "; every rank steps the embedding's " +
               std::to_string(everywhere) +
               " values whole and keeps their state, as without sharding"
                      : "") +
      ".";
}

int64_t Trainer::resume() {
  if (start_)
    return *start_;
  start_ = 0;
  make_averager(); // a sharded run loads only its own optimizer state
  if (!dist::active() && opt_.zero_stage >= 1)
    log_(
        "zero_stage=1 shards the optimizer state over several processes; "
        "with one process it changes nothing (all of the state is here).");
  if (!dist::active() && opt_.grad_reduce_dtype != torch::kFloat32)
    log_(
        "grad_reduce_dtype=" + dtype_name(opt_.grad_reduce_dtype) +
        " is how several processes average their gradients; with one "
        "process it changes nothing.");
  std::optional<runs::Checkpoint> ckpt;
  auto newest = [&] {
    // Rank 0 sets damaged checkpoints aside before the others look.
    dist::leader_first("finding the newest checkpoint", [&] {
      std::vector<std::string> skipped;
      ckpt = runs::latest_checkpoint(
          opt_.run_dir, &skipped, /*move_damaged_aside=*/dist::leader());
      for (const auto& s : skipped)
        log_("Warning: " + s);
    });
  };
  if (opt_.resume == "auto") {
    newest();
  } else if (opt_.resume != "never") {
    // A restart (dist::restart_count) goes on from the failed attempt's
    // newest checkpoint, not back to resume=DIR's.
    if (dist::restart_count() > 0)
      newest();
    if (ckpt)
      log_(
          "Restart " + std::to_string(dist::restart_count()) +
          " of this run (TORCHELASTIC_RESTART_COUNT): resuming from its "
          "newest checkpoint, not from resume=" +
          opt_.resume + ".");
    else
      ckpt = runs::load_checkpoint(opt_.resume);
  }
  if (!ckpt) {
    same_weights_everywhere();
    return 0;
  }
  torch::NoGradGuard no_grad;
  auto params = trained_parameters(*task_.model);
  for (auto& [key, value] : params) {
    auto it = ckpt->model.find(key);
    if (it == ckpt->model.end() || it->second.sizes() != value.sizes())
      throw UserError(
          "checkpoint " + ckpt->dir + " does not fit this model ('" + key +
          "' missing or of another shape): the architecture settings changed. "
          "Use the original settings, another run name, or resume=never.");
    value.copy_(it->second);
  }
  for (size_t i = 0; i < ema_.size(); ++i) {
    auto it = ckpt->model.find("ema." + params[i].first);
    // A checkpoint from a run without EMA starts the average at the weights.
    ema_[i].copy_(it != ckpt->model.end() ? it->second : params[i].second);
  }
  if (shard_optimizers_)
    shard_optimizers_->load(
        slice_sharded_state(ckpt->optimizer, averager_->pieces()));
  else
    optimizers_.load(ckpt->optimizer);
  // The checkpoint holds the whole optimizer state whoever wrote it: say
  // so when it was another number of processes or another sharding.
  const int was = int(number_or(ckpt->state, "processes", 1));
  const bool was_sharded = number_or(ckpt->state, "zero_stage", 0) >= 1;
  if (was != dist::size() || was_sharded != bool(shard_optimizers_))
    log_(
        "The checkpoint was written by " + std::to_string(was) +
        " process(es)" +
        (was_sharded ? ", each keeping its share of the optimizer state" : "") +
        "; this run has " + std::to_string(dist::size()) +
        (shard_optimizers_
             ? ", each taking its share of the checkpoint's optimizer state "
               "(zero_stage=1)"
             : dist::size() > 1 ? ", each with all of the optimizer state"
                                : ", with all of the optimizer state") +
        ": weights and optimizer state carry over.");
  load_rng_state(ckpt->optimizer, opt_.device);
  if (task_.restore_tensors)
    task_.restore_tensors(*ckpt);
  // The data position is in units of the checkpoint's micro-batch (it may
  // differ from this run's: halved after running out of memory, or set
  // differently by hand). Restore in its units, then continue with it when
  // it still divides the step, else convert to this run's size.
  const int64_t rows = opt_.micro_batch * opt_.grad_accum;
  const int64_t saved = ckpt->state.contains("micro_batch")
      ? ckpt->state.at("micro_batch").get<int64_t>()
      : opt_.micro_batch;
  const bool other_size =
      saved != opt_.micro_batch && saved > 0 && task_.set_micro_batch;
  if (other_size)
    task_.set_micro_batch(saved);
  if (task_.restore_data && ckpt->state.contains("loader"))
    task_.restore_data(ckpt->state.at("loader"));
  if (other_size && rows % saved == 0) {
    log_(
        "Continuing with device_batch_size=" + std::to_string(saved) +
        " as the checkpoint's run did (it was " +
        std::to_string(opt_.micro_batch) + " here), so resume stays exact.");
    opt_.micro_batch = saved;
    opt_.grad_accum = rows / saved;
  }
  // This run's micro-batch, from the checkpoint's, or from the units the
  // data position was restored in (another number of processes may need
  // smaller ones); UserError if the position does not divide into it.
  if (task_.set_micro_batch &&
      (other_size || (task_.restore_data && ckpt->state.contains("loader"))))
    task_.set_micro_batch(opt_.micro_batch);
  if (ckpt->state.contains("loss_scaler"))
    scaler_.load(ckpt->state.at("loss_scaler"));
  best_val_ = number_or(ckpt->state, "best_val_loss", best_val_);
  best_step_ = int64_t(number_or(ckpt->state, "best_step", -1));
  last_val_ = number_or(ckpt->state, "val_loss", last_val_);
  skipped_ = int64_t(number_or(ckpt->state, "skipped_steps", 0));
  seconds_ = number_or(ckpt->state, "train_seconds", 0);
  peak_memory_ = uint64_t(number_or(ckpt->state, "peak_memory_bytes", 0));
  start_ = ckpt->step;
  same_weights_everywhere();
  log_(
      "Resuming from " + ckpt->dir + " (step " + std::to_string(ckpt->step) +
      " of " + std::to_string(opt_.total_steps) + ").");
  return *start_;
}

void Trainer::with_eval_weights(const std::function<void()>& fn, bool raw) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> saved;
  auto params = trained_tensors(*task_.model);
  if (!ema_.empty() && !raw)
    for (size_t i = 0; i < params.size(); ++i) {
      saved.push_back(params[i].detach().clone());
      params[i].copy_(ema_[i]);
    }
  struct Restore { // also when fn throws
    std::vector<torch::Tensor>& saved;
    std::vector<torch::Tensor>& params;
    torch::nn::Module& model;
    ~Restore() {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < saved.size(); ++i)
        params[i].copy_(saved[i]);
      model.train();
    }
  } restore{saved, params, *task_.model};
  task_.model->eval();
  compat::AutocastGuard autocast(opt_.device.type(), opt_.precision.compute);
  fn();
}

void Trainer::same_weights_everywhere() {
  std::vector<torch::Tensor> all = trained_tensors(*task_.model);
  all.insert(all.end(), ema_.begin(), ema_.end());
  dist::broadcast_from_leader(all);
}

void Trainer::save(int64_t step, bool complete, const EvalResult* eval) {
  // Every rank comes here: state kept per rank is gathered first.
  NamedTensors state_t;
  if (task_.state_tensors)
    state_t = task_.state_tensors();
  if (task_.state_per_rank)
    for (auto& [name, t] : state_t)
      t = dist::gather_rows(t);
  NamedTensors model_t, opt_t;
  if (shard_optimizers_) {
    // The owners' float32 values of every piece (the last step may have
    // sent some in the compute dtype), and their optimizer state.
    averager_->gather_parameters(/*exact=*/true);
    opt_t =
        gather_sharded_state(shard_optimizers_->state(), averager_->pieces());
  }
  if (!dist::leader())
    return; // rank 0 writes the checkpoints
  auto params = trained_parameters(*task_.model);
  for (auto& [key, value] : params)
    model_t.push_back({key, value});
  for (size_t i = 0; i < ema_.size(); ++i)
    model_t.push_back({"ema." + params[i].first, ema_[i]});
  if (task_.model_tensors)
    for (auto& t : task_.model_tensors())
      model_t.push_back(t);
  if (!shard_optimizers_)
    opt_t = optimizers_.state();
  for (auto& t : state_t)
    opt_t.push_back(t);
  for (auto& r : rng_state(opt_.device))
    opt_t.push_back(r);
  nlohmann::json state = task_.describe;
  state["total_steps"] = opt_.total_steps;
  if (task_.data_state)
    state["loader"] = task_.data_state();
  state["val_loss"] = last_val_;
  if (eval)
    for (const auto& [name, v] : eval->metrics)
      state[name] = v;
  state["best_val_loss"] = best_val_;
  state["best_step"] = best_step_;
  state["complete"] = complete;
  state["skipped_steps"] = skipped_;
  state["micro_batch"] = opt_.micro_batch;
  state["processes"] = dist::size();
  state["zero_stage"] = shard_optimizers_ ? 1 : 0;
  state["train_seconds"] = seconds_;
  state["peak_memory_bytes"] = peak_memory_;
  if (scaler_.enabled())
    state["loss_scaler"] = scaler_.state();
  std::string dir =
      runs::save_checkpoint(opt_.run_dir, step, model_t, opt_t, state);
  runs::prune_checkpoints(
      opt_.run_dir,
      opt_.save_total_limit,
      opt_.keep_best && best_step_ >= 0 ? std::optional<int64_t>(best_step_)
                                        : std::nullopt);
  last_checkpoint_ = dir;
}

void Trainer::recover_from_oom(
    int64_t step,
    const nlohmann::json& data_at_start,
    const std::string& what) {
  drop_graph(); // made for the old micro-batch
  optimizers_.zero_grad();
  free_device_caches(opt_.device);
  const int64_t b = opt_.micro_batch;
  // The largest proper divisor of b: half of an even b. It divides the
  // rows of the step and the windows already served, so the data order is
  // kept exactly.
  int64_t smaller = 1;
  for (int64_t d = b / 2; d > 1; --d)
    if (b % d == 0) {
      smaller = d;
      break;
    }
  if (b <= 1 || !task_.set_micro_batch) {
    std::string first_line = what.substr(0, what.find('\n'));
    throw UserError(
        "out of memory at step " + std::to_string(step + 1) +
        " with device_batch_size=" + std::to_string(b) + " (" + first_line +
        "), and the micro-batch cannot be halved further. Turn on "
        "gradient_checkpointing=true, shorten max_seq_len, or train a smaller "
        "model; `orchard plan` shows what fits. Checkpoints already written "
        "in " +
        opt_.run_dir + "/checkpoints are intact.");
  }
  if (task_.restore_data && !data_at_start.is_null())
    task_.restore_data(data_at_start); // the step's first micro-batch again
  task_.set_micro_batch(smaller);
  opt_.micro_batch = smaller;
  opt_.grad_accum *= b / smaller;
  log_(
      "Out of memory at step " + std::to_string(step + 1) +
      " with device_batch_size=" + std::to_string(b) + ": " +
      (smaller * 2 == b ? "halved to " : "lowered to ") +
      std::to_string(smaller) + ", gradient accumulation now " +
      std::to_string(opt_.grad_accum) + "; redoing the step.");
}

TrainerResult Trainer::run() {
  TrainerResult result;
  result.total = opt_.total_steps;
  const int64_t start = resume();
  if (start >= opt_.total_steps) {
    result.already_done = true;
    result.step = start;
    result.final_eval.loss = last_val_;
    result.train_seconds = seconds_;
    result.peak_memory_bytes = peak_memory_;
    log_(
        "This run is already complete at step " + std::to_string(start) +
        "; raise the number of steps to train further, or use another run "
        "name.");
    return result;
  }
  task_.model->train();
  // With several processes rank 0 alone evaluates, samples and writes; the
  // others go on to the next step's collective and wait for it there.
  const bool leader = dist::leader();
  std::optional<MetricsWriter> metrics;
  if (leader)
    metrics.emplace(opt_.run_dir + "/metrics.jsonl", start);
  SignalGuard signals;
  ProgressLine progress;
  EvalResult last_eval;
  int64_t non_finite_run = 0;
  const double peak_lr =
      optimizers_.groups().empty() ? 0.0 : optimizers_.groups().front().lr;
  auto units = [&](int64_t step) { // of tokens_per_step (batch_schedule)
    return opt_.batch_schedule.multiple_at(step, opt_.total_steps);
  };
  auto evaluate = [&](int64_t done) {
    if (!leader)
      return;
    const double t0 = now_s();
    with_eval_weights([&] { last_eval = task_.evaluate(); });
    if (task_.evaluate_raw_too && !ema_.empty()) {
      EvalResult raw;
      with_eval_weights([&] { raw = task_.evaluate(); }, /*raw=*/true);
      for (const auto& [name, v] : raw.metrics)
        last_eval.metrics.push_back({"raw_" + name, v});
      last_eval.summary += "; raw weights: " + raw.summary;
    }
    seconds_ += now_s() - t0;
    last_val_ = last_eval.loss;
    if (last_eval.loss < best_val_) {
      best_val_ = last_eval.loss;
      best_step_ = done;
    }
    std::map<std::string, double> row = {
        {"step", double(done)}, {"val_loss", last_eval.loss}};
    for (const auto& [name, v] : last_eval.metrics)
      row[name] = v;
    metrics->write(row);
  };
  StepTrace trace; // ORCHARD_TRACE, ORCHARD_TRACE_STEP
  for (int64_t step = start; step < opt_.total_steps; ++step) {
    trace.begin(step);
    const double t0 = now_s();
    double loss = 0, grad_norm = 0;
    bool applied = true;
    const nlohmann::json data_at_start =
        task_.data_state ? task_.data_state() : nlohmann::json();
    for (;;) {
      try {
        take_step(step, loss, grad_norm, applied);
        break;
      } catch (const c10::Error& e) {
        if (!is_out_of_memory(e))
          throw;
        progress.finish();
        if (dist::active()) // the ranks' batches must stay in step
          throw UserError(
              "out of memory at step " + std::to_string(step + 1) +
              " on rank " + std::to_string(dist::rank()) +
              " with device_batch_size=" + std::to_string(opt_.micro_batch) +
              "; with several processes the micro-batch is not lowered "
              "on the fly. Run again with a smaller device_batch_size (the "
              "checkpoints in " +
              opt_.run_dir + "/checkpoints are intact).");
        recover_from_oom(step, data_at_start, e.what_without_backtrace());
      }
    }
    const int64_t done = step + 1;
    if (!applied) {
      ++skipped_;
      // With loss scaling an overflow now and then is normal (the scale
      // halves); once the scale is below 1 the gradient is not finite even
      // unscaled, which is divergence, as 5 such steps in a row are
      // without scaling.
      const bool scaled_overflow =
          scaler_.enabled() && scaler_.scale() >= kMinLossScale;
      if (scaled_overflow) {
        progress.message(
            "step " + std::to_string(done) +
            ": float16 gradients overflowed; step skipped, loss scale now " +
            fmt("%g", scaler_.scale()));
      } else if (scaler_.enabled() || ++non_finite_run >= kMaxNonFiniteSteps) {
        progress.finish();
        throw UserError(
            "training diverged: the gradient was not finite " +
            (scaler_.enabled()
                 ? std::string("even with the loss scale lowered below 1")
                 : "for " + std::to_string(kMaxNonFiniteSteps) +
                     " steps in a row") +
            " (step " + std::to_string(done) +
            "). Lower the learning rates or use dtype=float32, and resume "
            "from the last good checkpoint in " +
            opt_.run_dir + "/checkpoints (or start over with resume=never).");
      } else {
        progress.message(
            "step " + std::to_string(done) +
            ": the gradient is not finite (loss " + fmt("%g", loss) +
            "); step skipped.");
      }
    } else {
      non_finite_run = 0;
    }
    const double dt = now_s() - t0;
    if (step == start && averager_)
      progress.message("Gradient averaging: " + averager_->describe() + ".");
    if (step == start && !shard_note_.empty())
      progress.message(shard_note_);
    if (!note_.empty()) {
      progress.message(note_);
      log_.file_only(note_);
      note_.clear();
    }
    const int64_t step_tokens = opt_.tokens_per_step * units(step);
    const double tok_s = double(step_tokens) / std::max(dt, 1e-9);
    const double lr =
        peak_lr *
        lr_multiplier(
            step, opt_.total_steps, opt_.warmup_steps, opt_.warmdown_ratio);
    const MemoryReading mem = read_memory(opt_.device);
    peak_memory_ = std::max(peak_memory_, mem.peak);
    seconds_ += dt;
    std::map<std::string, double> extra;
    if (task_.step_metrics)
      extra = task_.step_metrics();
    progress.update(
        {.step = done,
         .total = opt_.total_steps,
         .loss = loss,
         .lr = lr,
         .tokens_per_s = tok_s,
         .memory_bytes = mem.peak,
         .note = task_.progress_note ? task_.progress_note() : ""});
    std::map<std::string, double> row = {
        {"step", double(done)},
        {"loss", loss},
        {"lr", lr},
        {"grad_norm", grad_norm},
        {"tokens_per_s", tok_s},
        {"peak_memory_mb", double(mem.peak) / 1e6},
        {"elapsed_s", seconds_}};
    if (scaler_.enabled())
      row["loss_scale"] = scaler_.scale();
    if (opt_.batch_schedule.on()) {
      row["batch_tokens"] = double(step_tokens);
      if (done < opt_.total_steps && units(done) != units(step))
        progress.message(
            "step " + std::to_string(done + 1) +
            " on: " + std::to_string(opt_.tokens_per_step * units(done)) +
            " tokens a step (batch_schedule stage " +
            std::to_string(
                opt_.batch_schedule.stage_at(done, opt_.total_steps) + 1) +
            " of " + std::to_string(opt_.batch_schedule.stages()) + ")");
    }
    for (const auto& [k, v] : extra)
      row.emplace(k, v);
    if (leader)
      metrics->write(row);
    trace.end(step);
    const bool last = done == opt_.total_steps;
    if (leader && opt_.eval_every > 0 && done % opt_.eval_every == 0 && !last) {
      evaluate(done);
      progress.message(
          "step " + std::to_string(done) + ": " + last_eval.summary);
      log_.file_only("step " + std::to_string(done) + ": " + last_eval.summary);
    }
    if (leader && task_.sample && opt_.sample_every > 0 &&
        done % opt_.sample_every == 0 && !last) {
      progress.finish();
      const double t0 = now_s();
      with_eval_weights([&] { task_.sample(done); });
      seconds_ += now_s() - t0;
    }
    const bool stop = dist::active() ? stop_agreed_ : g_stop_signal != 0;
    if ((opt_.save_every > 0 && done % opt_.save_every == 0 && !last) || stop)
      save(done, false, nullptr);
    if (stop) {
      progress.finish();
      if (!g_stop_signal)
        g_agreed_signal = stop_signal_;
      log_(
          "Stopped by " +
          (g_stop_signal
               ? signal_name(g_stop_signal)
               : signal_name(stop_signal_) + " sent to another rank") +
          " after step " + std::to_string(done) +
          "; saved a checkpoint. Run the same command again to resume from "
          "step " +
          std::to_string(done) + ".");
      result.step = done;
      result.interrupted = true;
      result.checkpoint_dir = last_checkpoint_;
      result.skipped_steps = skipped_;
      result.micro_batch = opt_.micro_batch;
      result.train_seconds = seconds_;
      result.peak_memory_bytes = peak_memory_;
      return result;
    }
  }
  progress.finish();
  evaluate(opt_.total_steps);
  save(opt_.total_steps, true, &last_eval);
  result.step = opt_.total_steps;
  result.final_eval = last_eval;
  result.checkpoint_dir = last_checkpoint_;
  result.skipped_steps = skipped_;
  result.peak_memory_bytes = peak_memory_;
  result.train_seconds = seconds_;
  result.micro_batch = opt_.micro_batch;
  log_(
      "Peak memory: " + format_bytes(peak_memory_) + " (" +
      read_memory(opt_.device).what + ").");
  if (skipped_ > 0)
    log_(
        std::to_string(skipped_) +
        " step(s) were skipped for non-finite "
        "gradients.");
  return result;
}

} // namespace orchard::train
