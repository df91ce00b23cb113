// Training throughput of Orchard's GPT: forward, backward and an optimizer
// step on random tokens, with the optimizer and autocast `orchard train`
// uses (train/optimizer.h, compat::AutocastGuard).
//   orchard_bench_train DEVICE DEPTH WIDTH HEADS VOCAB BATCH SEQ STEPS
//   [fp32|bf16] [adamw|muon]
// Prints tokens/s (median of the timed steps after 3 warm-up steps) and the
// peak memory (CUDA allocator; process RSS on the CPU). The
// orchard_bench_train_trace build (libtorch 2.x, on request) writes a
// Kineto trace of one more step with ORCHARD_TRACE=FILE
// (bench/trace_summary.py sums its GPU kernels).
#include "core/machine.h"
#include "core/torch_compat.h"
#include "models/gpt.h"
#include "train/optimizer.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#if defined(ORCHARD_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#ifdef ORCHARD_KINETO
#include "kineto_trace.h"
#endif

int main(int argc, char** argv) {
  orchard::configure_allocator(); // as `orchard` does
  if (argc < 9) {
    std::fprintf(
        stderr,
        "usage: %s DEVICE DEPTH WIDTH HEADS VOCAB BATCH SEQ STEPS "
        "[fp32|bf16] [adamw|muon]\n",
        argv[0]);
    return 2;
  }
  orchard::configure_cpu_threads(); // every core, as orchard itself does
  torch::Device dev(argv[1]);
  orchard::models::GptConfig c;
  c.n_layer = std::atoll(argv[2]);
  c.n_embd = std::atoll(argv[3]);
  c.n_head = c.n_kv_head = std::atoll(argv[4]);
  c.vocab_size = std::atoll(argv[5]);
  int64_t B = std::atoll(argv[6]), T = std::atoll(argv[7]),
          steps = std::atoll(argv[8]);
  const std::string prec = argc > 9 ? argv[9] : "fp32";
  const std::string optimizer = argc > 10 ? argv[10] : "adamw";
  const auto dtype = prec == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  c.max_seq_len = T;
  torch::manual_seed(0);
  orchard::models::Gpt model(c);
  model->to(dev);
  // One group per optimizer kind, as orchard train builds them.
  orchard::train::NamedTensors matrices, rest;
  for (const auto& p : model->named_parameters())
    (optimizer == "muon" && p.value().dim() == 2 &&
             p.key().rfind("blocks.", 0) == 0
         ? matrices
         : rest)
        .push_back({p.key(), p.value()});
  std::vector<orchard::train::ParamGroup> groups = {{"rest", rest, 1e-3, 0.0}};
  if (!matrices.empty())
    groups.push_back({"matrices", matrices, 0.02, 0.0, true});
  orchard::train::OptimizerOptions oo;
  oo.newton_schulz_dtype = dtype;
  orchard::train::Optimizers opt(groups, oo);
  auto x = torch::randint(0, c.vocab_size, {B, T}, torch::kLong).to(dev);
  auto y = torch::randint(0, c.vocab_size, {B, T}, torch::kLong).to(dev);
  std::vector<double> times;
  // ORCHARD_CPU_PROFILE=FILE: the last two steps under the (legacy)
  // autograd profiler, a Chrome trace of every op; libtorch 1.13 and 2.x,
  // any device (bench/trace_summary.py --ops sums it).
  const char* profile_path = std::getenv("ORCHARD_CPU_PROFILE");
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  const char* trace = std::getenv("ORCHARD_TRACE");
#ifndef ORCHARD_KINETO
  trace = nullptr;
#endif
  for (int64_t s = 0; s < steps + 3 + (trace ? 1 : 0); ++s) {
    const bool traced = trace && s == steps + 3;
    if (profile_path && s == steps + 1)
      profile = std::make_unique<torch::autograd::profiler::RecordProfile>(
          std::string(profile_path));
#ifdef ORCHARD_KINETO
    if (traced)
      orchard::bench::trace_start();
#endif
    orchard::compat::synchronize(dev);
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor loss;
    {
      orchard::compat::AutocastGuard autocast(dev.type(), dtype);
      loss = model->loss(x, y);
    }
    opt.zero_grad();
    loss.backward();
    opt.step(1.0, s);
    orchard::compat::synchronize(dev);
    double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
#ifdef ORCHARD_KINETO
    if (traced)
      orchard::bench::trace_stop(trace);
#endif
    if (s >= 3 && !traced)
      times.push_back(dt);
  }
  profile.reset(); // writes the trace
  std::sort(times.begin(), times.end());
  double med = times[times.size() / 2];
  double peak_mb = 0;
#if defined(ORCHARD_WITH_CUDA)
  if (dev.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        dev.index() < 0 ? 0 : dev.index());
    peak_mb = double(stats.allocated_bytes[0].peak) / 1e6;
  }
#endif
  if (!dev.is_cuda()) {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    peak_mb = double(ru.ru_maxrss) / 1e3;
  }
  std::printf(
      "orchard %s %s d%lld w%lld vocab %lld batch %lldx%lld: %.0f tokens/s (median %.4f s/step), "
      "peak %.0f MB, %lld params\n",
      prec.c_str(),
      optimizer.c_str(),
      (long long)c.n_layer,
      (long long)c.n_embd,
      (long long)c.vocab_size,
      (long long)B,
      (long long)T,
      double(B * T) / med,
      med,
      peak_mb,
      (long long)model->num_parameters());
  return 0;
}
