// One training step of the Trainer (train/trainer.h): the micro-steps'
// forward and backward (eager, or replayed from a CUDA graph), the one
// read of the gradient norm and loss, clipping, the finite check and the
// optimizer's update. The run around it (resume, logging, evaluation,
// checkpoints, stopping) is in trainer.cpp.
#include "train/trainer.h"

#include "core/error.h"
#include "core/torch_compat.h"
#include "dist/world.h"
#include "train/schedule.h"
#include "train/sharded_optimizer.h"

#include <cmath>
#include <exception>

namespace orchard::train {
namespace {

constexpr double kClipEps = 1e-6; // torch.nn.utils.clip_grad_norm_'s

} // namespace

void Trainer::take_step(
    int64_t step,
    double& loss,
    double& grad_norm,
    bool& applied) {
  const double scale = scaler_.scale();
  const int64_t accum =
      opt_.grad_accum * opt_.batch_schedule.multiple_at(step, opt_.total_steps);
  make_averager();
  if (averager_) {
    if (!stop_flag_.defined())
      stop_flag_ = torch::zeros(
          {2},
          torch::TensorOptions().dtype(torch::kFloat32).device(opt_.device));
    // Written when it changes (once, if ever), not every step.
    const int sig = last_stop_signal();
    if (sig != stop_flag_holds_) {
      stop_flag_[0].fill_(sig != 0 ? 1.0 : 0.0);
      stop_flag_[1].fill_(double(sig));
      stop_flag_holds_ = sig;
    }
  }
  torch::Tensor read = graph_gradients(accum, scale);
  if (!read.defined()) {
    optimizers_.zero_grad();
    read = gradients(accum, scale, nullptr);
  }
  torch::NoGradGuard no_grad;
  // The host's copy of `read`: the norm, the loss and the ranks' stop.
  auto take_read = [&](const torch::Tensor& host) {
    grad_norm = host[0].item<double>();
    loss = host[1].item<double>();
    if (host.size(0) > 3) { // the means of the ranks' stop flags
      stop_agreed_ = host[2].item<double>() > 0;
      stop_signal_ =
          agreed_stop_signal(host[2].item<double>(), host[3].item<double>());
    }
  };
  const double lr_mult = lr_multiplier(
      step, opt_.total_steps, opt_.warmup_steps, opt_.warmdown_ratio);
  if (ema_.empty() && !scaler_.enabled() && stepper().can_step_on_device()) {
    // Clipping and the finite check decided on the device, so the
    // optimizer is queued before the host reads the norm and the loss,
    // and the GPU is not left waiting for the host between backward and
    // update (0.3 ms of a 31 ms GPT d12 step on an H200). Several
    // processes too: every rank holds the same mean gradient's norm (with
    // zero_stage=1 summed over the ranks' pieces), so every rank decides
    // alike, and the sharded update's all-gather is queued after it.
    const auto norm = read.narrow(0, 0, 1);
    const auto found_inf = norm.isfinite().logical_not().to(torch::kFloat32);
    const auto grad_scale = opt_.grad_clip > 0
        ? torch::where(
              norm > opt_.grad_clip,
              (norm + kClipEps) / opt_.grad_clip,
              torch::ones_like(norm))
        : torch::ones_like(norm);
    const torch::Tensor host = read_then_launch(read, [&] {
      stepper().step_on_device(lr_mult, grad_scale, found_inf);
      if (shard_optimizers_) // every rank's updated pieces into every rank
        averager_->gather_parameters(/*exact=*/false);
    });
    take_read(host);
    applied = scaler_.update(std::isfinite(grad_norm));
    if (!applied)
      stepper().uncount_step(); // the kernel skipped it
    return;
  }
  // The gradient norm (after unscaling), the loss and the ranks' stop in
  // one host sync; clipping and the finite check follow from them.
  take_read(read.to(torch::kCPU, torch::kFloat64));
  const bool finite = std::isfinite(grad_norm);
  applied = scaler_.update(finite);
  if (!applied)
    return;
  if (opt_.grad_clip > 0 && grad_norm > opt_.grad_clip) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : stepper().parameters())
      if (p.grad().defined())
        grads.push_back(p.grad());
    at::_foreach_mul_(grads, opt_.grad_clip / (grad_norm + kClipEps));
  }
  stepper().step(lr_mult, step);
  if (shard_optimizers_) // every rank's updated pieces into every rank
    averager_->gather_parameters(/*exact=*/false);
  if (!ema_.empty()) {
    auto params = trained_tensors(*task_.model);
    for (size_t i = 0; i < params.size(); ++i)
      ema_[i].mul_(opt_.ema_rate).add_(params[i].detach(), 1.0 - opt_.ema_rate);
  }
}

torch::Tensor Trainer::gradients(
    int64_t accum,
    double scale,
    const std::vector<std::vector<torch::Tensor>>* inputs) {
  torch::Tensor loss_sum;
  struct Disarm { // an error mid-backward leaves nothing armed
    dist::GradientAverager* a;
    ~Disarm() {
      if (a && std::uncaught_exceptions() > 0)
        a->disarm();
    }
  } disarm{averager_.get()};
  for (int64_t m = 0; m < accum; ++m) {
    torch::Tensor micro;
    {
      compat::AutocastGuard autocast(
          opt_.device.type(), opt_.precision.compute);
      micro =
          (inputs ? task_.loss_of((*inputs)[size_t(m)]) : task_.micro_step()) /
          double(accum);
    }
    TORCH_CHECK_WITH(
        OutOfMemoryError,
        test_oom_rows_ <= 0 || opt_.micro_batch <= test_oom_rows_,
        "CUDA out of memory (injected by ORCHARD_TEST_OOM_ROWS=",
        test_oom_rows_,
        ")");
    if (averager_ && m == accum - 1) // sent while the backward runs
      averager_->arm();
    (scale != 1.0 ? micro * scale : micro).backward();
    loss_sum = loss_sum.defined() ? loss_sum + micro.detach() : micro.detach();
  }
  torch::NoGradGuard no_grad;
  torch::Tensor stop;
  // The squares of the gradients the copy engines averaged, summed as they
  // averaged them (dist::GradientAverager::share_squares): those are not
  // read again for the norm.
  torch::Tensor bucket_squares;
  if (averager_) {
    // Several processes: the mean gradient (sent during the last backward)
    // and loss over the ranks, and whether any rank was asked to stop (all
    // stop after the same step).
    averager_->finish();
    stop = stop_flag_.to(
        loss_sum.options(), /*non_blocking=*/false, /*copy=*/true);
    if (scale == 1.0 && !shard_optimizers_)
      bucket_squares = averager_->share_squares();
    if (bucket_squares.defined()) { // each rank's shares: the mean, times n
      dist::all_reduce_mean({loss_sum, stop, bucket_squares});
      bucket_squares = bucket_squares * double(dist::size());
    } else if (!shard_optimizers_) { // sharded: below, with the norm
      dist::all_reduce_mean({loss_sum, stop});
    }
  }
  std::vector<torch::Tensor> grads;
  std::vector<bool> on_every_rank; // sharded: a parameter every rank steps
  for (const auto& p : stepper().parameters())
    if (p.grad().defined() &&
        !(bucket_squares.defined() && averager_->in_share_squares(p))) {
      grads.push_back(p.grad());
      on_every_rank.push_back(
          shard_optimizers_ && everywhere_.count(p.unsafeGetTensorImpl()) > 0);
    }
  if (scale != 1.0 && !grads.empty())
    at::_foreach_mul_(grads, 1.0 / scale);
  // On CUDA the norms in one multi-tensor kernel, not one a parameter.
  std::vector<torch::Tensor> norms;
  if (opt_.device.is_cuda() && !grads.empty())
    norms = at::_foreach_norm(grads, 2);
  else
    for (const auto& g : grads)
      norms.push_back(g.norm(2));
  for (auto& n : norms)
    n = n.to(torch::kFloat32);
  // A parameter every rank steps whole has its squares on every rank:
  // each counts 1 / ranks of them in the sum over the ranks below.
  for (size_t i = 0; i < norms.size(); ++i)
    if (on_every_rank[i])
      norms[i] = norms[i] / std::sqrt(double(dist::size()));
  torch::Tensor norm = norms.empty()
      ? torch::zeros({1}, loss_sum.options().dtype(torch::kFloat32))
      : torch::stack(norms).norm(2).reshape({1});
  if (bucket_squares.defined())
    norm = (norm.square() + bucket_squares).sqrt();
  std::vector<torch::Tensor> read = {
      norm, loss_sum.to(torch::kFloat32).reshape({1})};
  if (stop.defined())
    read.push_back(stop.to(torch::kFloat32).reshape({-1}));
  if (shard_optimizers_) {
    // Each rank has the norm of its own pieces: the squares, the loss and
    // the stop flag summed over the ranks in one all-reduce.
    const double n = double(dist::size());
    auto sums = torch::cat({read[0].square(), read[1] / n, read[2] / n});
    dist::all_reduce_sum(sums);
    read = {sums.narrow(0, 0, 1).sqrt(), sums.narrow(0, 1, sums.size(0) - 1)};
  }
  return torch::cat(read);
}

torch::Tensor Trainer::graph_gradients(int64_t accum, double scale) {
  // Several processes: the graph holds the buckets' collectives too (NCCL
  // since 2.9.6 runs them in a graph; the copy engines' barriers and
  // copies are captured like kernels). With the optimizer state sharded,
  // the update and its all-gather stay outside, as every update does.
  if (!opt_.cuda_graphs || graphs_off_ || !StepGraph::built() ||
      !opt_.device.is_cuda() || !task_.next_inputs || !task_.loss_of ||
      scaler_.enabled() || scale != 1.0 || test_oom_rows_ > 0)
    return {};
  if (graph_ && (graph_micro_ != opt_.micro_batch || graph_accum_ != accum))
    drop_graph(); // another shape: warm up and capture again
  std::vector<std::vector<torch::Tensor>> inputs;
  for (int64_t m = 0; m < accum; ++m)
    inputs.push_back(task_.next_inputs());
  if (graph_ && graph_->captured()) {
    bool same = true;
    for (size_t m = 0; m < inputs.size() && same; ++m) {
      same = inputs[m].size() == graph_inputs_[m].size();
      for (size_t i = 0; i < inputs[m].size() && same; ++i)
        same = inputs[m][i].sizes() == graph_inputs_[m][i].sizes() &&
            inputs[m][i].dtype() == graph_inputs_[m][i].dtype();
    }
    if (same) {
      for (size_t m = 0; m < inputs.size(); ++m)
        for (size_t i = 0; i < inputs[m].size(); ++i)
          graph_inputs_[m][i].copy_(inputs[m][i], /*non_blocking=*/true);
      graph_->replay();
      return graph_read_;
    }
    drop_graph(); // this step eagerly; the next warms up a new graph
    optimizers_.zero_grad();
    return gradients(accum, scale, &inputs);
  }
  optimizers_.zero_grad();
  if (!graph_) {
    graph_ = std::make_unique<StepGraph>(opt_.device);
    graph_micro_ = opt_.micro_batch;
    graph_accum_ = accum;
    torch::Tensor read;
    graph_->warm_up([&] { read = gradients(accum, scale, &inputs); });
    return read;
  }
  graph_inputs_ = inputs; // the buffers the graph reads from now on
  try {
    graph_->capture(
        [&] { graph_read_ = gradients(accum, scale, &graph_inputs_); });
  } catch (const std::exception& e) {
    const std::string what = e.what();
    drop_graph();
    graphs_off_ = true;
    note_ = "Note: the step could not be captured as a CUDA graph (" +
        what.substr(0, what.find('\n')) +
        "); training goes on without graphs (cuda_graphs=false skips the "
        "attempt).";
    optimizers_.zero_grad();
    return gradients(accum, scale, &inputs);
  }
  note_ = "CUDA graph: the step's forward and backward (" +
      std::to_string(accum) + " micro-step" + (accum > 1 ? "s" : "") + " of " +
      std::to_string(opt_.micro_batch) +
      " rows) captured; each step replays it.";
  graph_->replay();
  return graph_read_;
}

void Trainer::drop_graph() {
  if (!graph_)
    return;
  optimizers_.zero_grad(); // the gradients are in the graph's memory
  graph_inputs_.clear();
  graph_read_ = torch::Tensor();
  graph_.reset();
}

} // namespace orchard::train
