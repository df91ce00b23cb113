// Predicted vs measured peak memory of one training configuration of
// Orchard's GPT (train/memory_probe.h), for bench/run_memory_grid.sh.
//   orchard_bench_memory DEVICE LAYERS WIDTH HEADS VOCAB BATCH SEQ CKPT DTYPE
//   OPTIMIZER ACCUM
// One configuration per process, so the CPU's resident set starts clean.
#include "train/memory_probe.h"
#include "core/machine.h"
#include "core/torch_compat.h"

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 12) {
    std::fprintf(
        stderr,
        "usage: %s DEVICE LAYERS WIDTH HEADS VOCAB BATCH SEQ CKPT DTYPE "
        "OPTIMIZER ACCUM\n",
        argv[0]);
    return 2;
  }
  orchard::configure_allocator(); // as `orchard` does
  orchard::configure_cpu_threads();
  torch::Device dev(argv[1]);
  orchard::models::GptConfig c;
  c.n_layer = std::atoll(argv[2]);
  c.n_embd = std::atoll(argv[3]);
  c.n_head = c.n_kv_head = std::atoll(argv[4]);
  c.vocab_size = std::atoll(argv[5]);
  const int64_t B = std::atoll(argv[6]), accum = std::atoll(argv[11]);
  const std::string prec = argv[9];
  orchard::train::PlanSettings s;
  s.seq_len = std::atoll(argv[7]);
  s.gradient_checkpointing = std::atoi(argv[8]) != 0;
  s.compute = prec == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  s.muon = std::string(argv[10]) == "muon";
  s.device = dev.type();
  s.no_attention_scores = orchard::train::attention_keeps_no_scores(s.device);
  auto r = orchard::train::measure_step_peak(c, s, B, accum, dev);
  const auto& e = r.estimate;
  std::printf(
      "{\"device\":\"%s\",\"L\":%lld,\"C\":%lld,\"V\":%lld,\"B\":%lld,\"T\":%lld,"
      "\"ckpt\":%d,\"dtype\":\"%s\",\"opt\":\"%s\",\"accum\":%lld,"
      "\"measured_mb\":%.1f,\"predicted_mb\":%.1f,\"ratio\":%.3f,"
      "\"weights_mb\":%.1f,\"grads_mb\":%.1f,\"optimizer_mb\":%.1f,"
      "\"activations_mb\":%.1f,\"logits_mb\":%.1f}\n",
      argv[1],
      (long long)c.n_layer,
      (long long)c.n_embd,
      (long long)c.vocab_size,
      (long long)B,
      (long long)s.seq_len,
      int(s.gradient_checkpointing),
      prec.c_str(),
      argv[10],
      (long long)accum,
      r.measured / 1e6,
      r.predicted / 1e6,
      r.predicted / r.measured,
      e.weights / 1e6,
      e.gradients / 1e6,
      e.optimizer / 1e6,
      e.activations / 1e6,
      e.logits / 1e6);
  return 0;
}
