// One supervision step of the TRM paper's Sudoku model (MLP across
// positions, 2 layers x 512, H_cycles 3, L_cycles 6) as stage=trm trains
// it on the GPU: bfloat16 autocast, float32 weights, stable-max + Q-halt
// loss, backward, AdamATan2 on the network and SignSGD on the puzzle
// embedding. Random puzzles; every slot continues from its carry (halting
// does not change the work of a step). bench/peers/trm_step.py is the
// PyTorch peer; bench/RESULTS.md has both.
//   orchard_bench_trm DEVICE [BATCH=768] [STEPS=20] [HIDDEN=512]
// Prints seconds per step (median after 3 warm-up steps), cells per second
// (BATCH x 81 per step) and the peak memory. ORCHARD_TRACE=FILE (the
// orchard_bench_trm_trace build) writes a Kineto trace of one more step.
#include "core/machine.h"
#include "core/memory_stats.h"
#include "core/torch_compat.h"
#include "models/trm.h"
#include "stages/trm/recursion.h"
#include "train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef ORCHARD_KINETO
#include "kineto_trace.h"
#endif

int main(int argc, char** argv) {
  orchard::configure_allocator(); // as `orchard` does
  if (argc < 2) {
    std::fprintf(
        stderr, "usage: %s DEVICE [BATCH] [STEPS] [HIDDEN]\n", argv[0]);
    return 2;
  }
  const torch::Device dev(argv[1]);
  const int64_t B = argc > 2 ? std::stoll(argv[2]) : 768;
  const int64_t steps = argc > 3 ? std::stoll(argv[3]) : 20;
  orchard::models::TrmConfig c;
  c.hidden_size = argc > 4 ? std::stoll(argv[4]) : 512;
  c.puzzle_emb_ndim = c.hidden_size;
  c.mlp_t = true;
  c.pos_encodings = "none";
  torch::manual_seed(0);
  orchard::models::Trm model(c);
  model->to(dev);
  model->train();
  orchard::train::NamedTensors network, embeddings;
  for (const auto& p : model->named_parameters())
    (p.key() == "puzzle_emb" ? embeddings : network)
        .push_back({p.key(), p.value()});
  orchard::train::OptimizerOptions oo;
  oo.adam_beta1 = 0.9;
  oo.adam_beta2 = 0.95;
  orchard::train::Optimizers opt(
      {{.name = "network",
        .params = network,
        .lr = 1e-4,
        .weight_decay = 1.0,
        .rule = "adam_atan2"},
       {.name = "puzzle_emb",
        .params = embeddings,
        .lr = 1e-4,
        .weight_decay = 1.0,
        .rule = "sign_sgd"}},
      oo);
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(dev);
  const auto inputs = torch::randint(1, 11, {B, c.seq_len}, opts);
  const auto labels = torch::randint(2, 11, {B, c.seq_len}, opts);
  const auto ids = torch::zeros({B}, opts);
  auto [z_H, z_L] = model->initial_carry(B);
  const char* trace = std::getenv("ORCHARD_TRACE");
#ifndef ORCHARD_KINETO
  trace = nullptr;
#endif
  const torch::ScalarType dtype =
      dev.is_cpu() ? torch::kFloat32 : torch::kBFloat16;
  std::vector<double> times;
  orchard::reset_peak_memory(dev);
  using clock = std::chrono::steady_clock;
  const int64_t warmup = 3;
  for (int64_t s = 0; s < warmup + steps + (trace ? 1 : 0); ++s) {
    const bool traced = trace && s == warmup + steps;
#ifdef ORCHARD_KINETO
    if (traced)
      orchard::bench::trace_start();
#endif
    orchard::compat::synchronize(dev);
    const auto a = clock::now();
    {
      orchard::compat::AutocastGuard autocast(dev.type(), dtype);
      auto out = model->step(z_H, z_L, inputs, ids);
      auto loss = orchard::trm::act_loss(out, labels).loss / double(B);
      loss.backward();
      z_H = out.z_H;
      z_L = out.z_L;
    }
    opt.step(1.0, s);
    opt.zero_grad();
    orchard::compat::synchronize(dev);
    const auto b = clock::now();
#ifdef ORCHARD_KINETO
    if (traced)
      orchard::bench::trace_stop(trace);
#endif
    if (s >= warmup && !traced)
      times.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];
  const auto mem = orchard::read_memory(dev);
  std::printf(
      "{\"peer\": \"orchard_bench_trm\", \"batch\": %lld, \"hidden\": %lld, "
      "\"parameters\": %lld, \"s_per_step\": %.5f, \"cells_per_s\": %.0f, "
      "\"peak_memory_mb\": %.1f, \"torch\": \"%s\"}\n",
      (long long)B,
      (long long)c.hidden_size,
      (long long)model->network_parameters(),
      t,
      double(B * c.seq_len) / t,
      double(mem.peak) / (1 << 20),
      orchard::compat::torch_version().c_str());
  return 0;
}
