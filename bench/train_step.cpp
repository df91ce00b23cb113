// Training throughput of Orchard's GPT: forward, backward and an AdamW step
// on random tokens, float32.
//   orchard_bench_train DEVICE DEPTH WIDTH HEADS VOCAB BATCH SEQ STEPS
// Prints tokens/s (median of the timed steps after 3 warm-up steps) and the
// peak memory (CUDA allocator; process RSS on the CPU).
#include "core/machine.h"
#include "core/torch_compat.h"
#include "models/gpt.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#if defined(ORCHARD_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

int main(int argc, char** argv) {
  if (argc < 9) {
    std::fprintf(
        stderr,
        "usage: %s DEVICE DEPTH WIDTH HEADS VOCAB BATCH SEQ STEPS\n",
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
  c.max_seq_len = T;
  torch::manual_seed(0);
  orchard::models::Gpt model(c);
  model->to(dev);
  torch::optim::AdamW opt(
      model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto x = torch::randint(0, c.vocab_size, {B, T}, torch::kLong).to(dev);
  auto y = torch::randint(0, c.vocab_size, {B, T}, torch::kLong).to(dev);
  std::vector<double> times;
  for (int64_t s = 0; s < steps + 3; ++s) {
    orchard::compat::synchronize(dev);
    auto t0 = std::chrono::steady_clock::now();
    auto loss = model->loss(x, y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    orchard::compat::synchronize(dev);
    double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (s >= 3)
      times.push_back(dt);
  }
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
      "orchard  d%lld w%lld vocab %lld batch %lldx%lld: %.0f tokens/s (median %.4f s/step), "
      "peak %.0f MB, %lld params\n",
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
