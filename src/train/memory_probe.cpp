#include "train/memory_probe.h"

#include "core/memory_stats.h"
#include "core/torch_compat.h"
#include "train/optimizer.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace orchard::train {

ProbeResult measure_step_peak(
    models::GptConfig c,
    const PlanSettings& s,
    int64_t batch,
    int64_t accum,
    const c10::Device& dev) {
  // Warm the device up so its context and kernels are in the baseline.
  {
    auto a = torch::randn({64, 64}, dev);
    auto l = torch::matmul(a, a).sum();
    compat::synchronize(dev);
  }
#if defined(__GLIBC__)
  // Hand memory freed by earlier work (an earlier probe) back to the
  // system, so the resident set starts from what is really in use.
  if (dev.is_cpu())
    malloc_trim(0);
#endif
  reset_peak_memory(dev);
  const uint64_t base = read_memory(dev).current;
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
    for (int step = 0; step < 2; ++step) {
      if (step == 1)
        reset_peak_memory(dev); // the second step has optimizer state
      opt.zero_grad();
      for (int64_t m = 0; m < accum; ++m) {
        torch::Tensor loss;
        {
          compat::AutocastGuard g(dev.type(), s.compute);
          loss = model->loss(x, y);
        }
        loss.backward();
      }
      opt.step(1.0, step);
      compat::synchronize(dev);
    }
    peak = read_memory(dev).peak;
  }
  ProbeResult r;
  r.measured = double(peak > base ? peak - base : 0);
  r.estimate = estimate_memory(plan_model_of(c), s, batch, accum);
  r.predicted = r.estimate.total();
  return r;
}

} // namespace orchard::train
