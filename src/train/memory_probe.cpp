#include "train/memory_probe.h"

#include "core/memory_stats.h"
#include "core/torch_compat.h"
#include "train/optimizer.h"

namespace orchard::train {

uint64_t probe_baseline(const c10::Device& dev) {
  // Warm the device up so its context and kernels are in the baseline.
  {
    auto a = torch::randn({64, 64}, dev);
    auto l = torch::matmul(a, a).sum();
    compat::synchronize(dev);
  }
  trim_host_heap(dev);
  reset_peak_memory(dev);
  return read_memory(dev).current;
}

uint64_t peak_of_two_steps(
    const std::function<torch::Tensor()>& loss,
    Optimizers& optimizers,
    int64_t accum,
    torch::ScalarType compute,
    const c10::Device& dev) {
  for (int64_t step = 0; step < 2; ++step) {
    if (step == 1)
      reset_peak_memory(dev); // the second step has optimizer state
    optimizers.zero_grad();
    for (int64_t m = 0; m < accum; ++m) {
      torch::Tensor l;
      {
        compat::AutocastGuard g(dev.type(), compute);
        l = loss();
      }
      l.backward();
    }
    optimizers.step(1.0, step);
    compat::synchronize(dev);
  }
  return read_memory(dev).peak;
}

ProbeResult measure_step_peak(
    models::GptConfig c,
    const PlanSettings& s,
    int64_t batch,
    int64_t accum,
    const c10::Device& dev) {
  const uint64_t base = probe_baseline(dev);
  uint64_t peak = 0;
  {
    c.max_seq_len = s.seq_len;
    c.gradient_checkpointing = s.gradient_checkpointing;
    torch::manual_seed(0);
    models::Gpt model(c);
    model->to(dev);
    model->train();
    NamedTensors matrices, rest;
    for (const auto& p : model->named_parameters())
      (s.muon && p.key().rfind("blocks.", 0) == 0 ? matrices : rest)
          .push_back({p.key(), p.value()});
    std::vector<ParamGroup> groups = {{"rest", rest, 1e-3, 0.0}};
    if (!matrices.empty())
      groups.push_back({"matrices", matrices, 0.02, 0.0, true});
    OptimizerOptions oo;
    oo.newton_schulz_dtype = s.compute;
    Optimizers opt(groups, oo);
    auto x = torch::randint(0, c.vocab_size, {batch, s.seq_len}, torch::kLong)
                 .to(dev);
    auto y = torch::randint(0, c.vocab_size, {batch, s.seq_len}, torch::kLong)
                 .to(dev);
    peak = peak_of_two_steps(
        [&] { return model->loss(x, y); }, opt, accum, s.compute, dev);
  }
  ProbeResult r;
  r.measured = double(peak > base ? peak - base : 0);
  r.estimate = estimate_memory(plan_model_of(c), s, batch, accum);
  r.predicted = r.estimate.total();
  return r;
}

} // namespace orchard::train
