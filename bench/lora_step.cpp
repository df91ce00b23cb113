// LoRA fine-tuning step and generation speed of a Hugging Face model folder,
// as `orchard train stage=lora` and `orchard generate --model` run them:
// base frozen in bfloat16, float32 adapters on every linear layer, gradient
// checkpointing, AdamW; random tokens.
//   orchard_bench_lora MODEL_DIR DEVICE SEQ STEPS [RANK] [GEN_PROMPT GEN_NEW]
// Prints seconds per step (median of the timed steps after 2 warm-up steps),
// the peak memory of the training steps (CUDA allocator), and decode tokens/s
// of greedy generation (GEN_NEW tokens after a GEN_PROMPT-token prompt).
#include "core/machine.h"
#include "core/memory_stats.h"
#include "core/torch_compat.h"
#include "infer/engine.h"
#include "models/hf/model.h"
#include "train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#ifdef ORCHARD_KINETO
#include "kineto_trace.h"
using orchard::bench::trace_start;
using orchard::bench::trace_stop;
#endif

int main(int argc, char** argv) {
  orchard::configure_allocator(); // as `orchard` does
  if (argc < 5) {
    std::fprintf(
        stderr,
        "usage: %s MODEL_DIR DEVICE SEQ STEPS [RANK] [GEN_PROMPT GEN_NEW]\n",
        argv[0]);
    return 2;
  }
  orchard::configure_cpu_threads();
  const std::string dir = argv[1];
  torch::Device dev(argv[2]);
  const int64_t T = std::atoll(argv[3]), steps = std::atoll(argv[4]);
  const int64_t rank = argc > 5 ? std::atoll(argv[5]) : 16;
  const int64_t gen_prompt = argc > 7 ? std::atoll(argv[6]) : 0;
  const int64_t gen_new = argc > 7 ? std::atoll(argv[7]) : 0;
  using clock = std::chrono::steady_clock;
  orchard::models::LoadOptions lo;
  lo.device = dev;
  lo.dtype = torch::kBFloat16;
  lo.context = std::max(T, gen_prompt + gen_new);
  // LORA_4BIT=1: the layers' projections in 4 bits (NF4), as
  // `orchard train stage=lora load_in_4bit=true` loads them.
  const char* four = std::getenv("LORA_4BIT");
  lo.load_in_4bit = four && std::string(four) == "1";
  auto t0 = clock::now();
  auto model = orchard::models::load_hf_model(dir, lo);
  orchard::compat::synchronize(dev);
  std::printf(
      "load: %.1f s\n",
      std::chrono::duration<double>(clock::now() - t0).count());
  const int64_t V = model->config.vocab_size;
  // Generation first, on the base model (as the peer script does).
  if (gen_new > 0) {
    model->eval();
    orchard::infer::Engine engine(model.ptr(), dev);
    orchard::infer::SamplingOptions so;
    so.temperature = 0;
    so.max_new_tokens = gen_new;
    std::vector<int64_t> prompt(static_cast<size_t>(gen_prompt), 0);
    for (size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = int64_t((i * 7919) % size_t(V));
    orchard::infer::GenerationStats st;
    engine.generate(prompt, so, {}, true, &st); // warm-up
    engine.generate(prompt, so, {}, true, &st);
    std::printf(
        "orchard generate: prompt %lld, %lld new tokens: %.1f tok/s (prefill "
        "included; decode alone %.1f tok/s)\n",
        (long long)gen_prompt,
        (long long)st.new_tokens,
        double(st.new_tokens) / (st.prefill_seconds + st.decode_seconds),
        st.decode_tokens_per_s());
  }
  torch::manual_seed(0);
  orchard::models::LoraSpec spec;
  spec.r = rank;
  spec.alpha = 2.0 * double(rank);
  model->add_lora(spec, torch::kFloat32);
  model->gradient_checkpointing = true;
  model->train();
  orchard::train::NamedTensors trained;
  for (const auto& p : model->named_parameters())
    if (p.value().requires_grad())
      trained.push_back({p.key(), p.value()});
  orchard::train::OptimizerOptions oo;
  oo.adam_beta1 = 0.9;
  oo.adam_beta2 = 0.999;
  oo.adam_eps = 1e-8;
  orchard::train::Optimizers opt({{"adapters", trained, 1e-4, 0.0}}, oo);
  std::vector<double> times, fwd, bwd, upd;
  orchard::reset_peak_memory(dev);
  const char* trace = std::getenv("ORCHARD_TRACE");
#ifndef ORCHARD_KINETO
  trace = nullptr;
#endif
  for (int64_t s = 0; s < steps + 2; ++s) {
    auto ids = torch::randint(
        V, {1, T + 1}, torch::TensorOptions().dtype(torch::kInt64).device(dev));
    orchard::compat::synchronize(dev);
#ifdef ORCHARD_KINETO
    if (trace && s == steps + 1)
      trace_start();
#endif
    auto a = clock::now();
    auto loss = model->loss(ids.narrow(1, 0, T), ids.narrow(1, 1, T));
    orchard::compat::synchronize(dev);
    auto b = clock::now();
    loss.backward();
    orchard::compat::synchronize(dev);
    auto c = clock::now();
    opt.step(1.0, s);
    opt.zero_grad();
    orchard::compat::synchronize(dev);
    auto e = clock::now();
#ifdef ORCHARD_KINETO
    if (trace && s == steps + 1)
      trace_stop(trace);
#endif
    using sec = std::chrono::duration<double>;
    if (s >= 2 && !(trace && s == steps + 1)) { // the traced step is not timed
      times.push_back(sec(e - a).count());
      fwd.push_back(sec(b - a).count());
      bwd.push_back(sec(c - b).count());
      upd.push_back(sec(e - c).count());
    }
  }
  for (auto* v : {&times, &fwd, &bwd, &upd})
    std::sort(v->begin(), v->end());
  const auto mem = orchard::read_memory(dev);
  std::printf(
      "orchard lora%s seq %lld: %.3f s/step, %.0f tok/s, peak %.2f GB (%s)\n",
      lo.load_in_4bit ? " nf4" : "",
      (long long)T,
      times[times.size() / 2],
      double(T) / times[times.size() / 2],
      double(mem.peak) / 1e9,
      mem.what.c_str());
  std::printf(
      "  median forward %.3f s, backward %.3f s, optimizer %.3f s\n",
      fwd[fwd.size() / 2],
      bwd[bwd.size() / 2],
      upd[upd.size() / 2]);
  return 0;
}
