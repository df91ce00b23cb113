// Decoding speed of a Hugging Face model folder (or an Orchard run) as
// `orchard generate` runs it, against the memory-bandwidth bound:
//   orchard_bench_decode MODEL_DIR DEVICE PROMPT NEW [BW_GBPS]
// Greedy, random prompt tokens, bfloat16 weights on CUDA (the automatic
// dtype elsewhere). Prints, each the best of 3 runs after a warm-up:
//   batch 1 with CUDA graphs and without (eager), decode tokens/s and the
//     fraction of the bound (every weight byte read once per token at
//     BW_GBPS, default 3350: an H100 SXM's HBM3);
//   batches 8 and 32 (one prompt each, aggregate tokens/s);
//   a GRPO-shaped rollout: 8 samples x NEW tokens of one prompt,
//     temperature 1, with log-probabilities;
//   with ORCHARD_BENCH_NF4 set (CUDA), batch 1 again with the layers'
//     projections in NF4 (the fraction is of the bf16 bound).
//   with ORCHARD_BENCH_PRODUCTS set (CUDA), each kind of the layers'
//     one-row products alone, as GB/s of weights streamed, and the MLP's
//     chain of kernels with and without the small ones between products.
// ORCHARD_BENCH_STEP_ONLY stops after batch 1 with graphs, the step alone
// and the products.
// ORCHARD_BENCH_DTYPE=float32|bfloat16|float16 loads the weights in that
// dtype instead (the CPU's bfloat16 decoding, for one).
// ORCHARD_PDL=0 launches the kernels plainly (for a before/after).
#include "core/dtype.h"
#include "core/machine.h"
#include "core/torch_compat.h"
#include "infer/decode_step.h"
#include "infer/engine.h"
#include "models/hf/model.h"
#include "ops/attention.h"
#include "ops/kernel_call.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rotary_cache.h"
#include "ops/silu_mul.h"

#if defined(ORCHARD_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define ORCHARD_BENCH_GRAPHS 1
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace {

using orchard::infer::Engine;
using orchard::infer::GenerationStats;
using orchard::infer::SamplingOptions;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(
        stderr, "usage: %s MODEL_DIR DEVICE PROMPT NEW [BW_GBPS]\n", argv[0]);
    return 2;
  }
  orchard::configure_allocator(); // as `orchard` does
  orchard::configure_cpu_threads();
  const std::string dir = argv[1];
  torch::Device dev(argv[2]);
  const int64_t P = std::atoll(argv[3]), N = std::atoll(argv[4]);
  const double bw = argc > 5 ? std::atof(argv[5]) : 3350.0;
  orchard::models::LoadOptions lo;
  lo.device = dev;
  lo.dtype = dev.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  if (const char* d = std::getenv("ORCHARD_BENCH_DTYPE"))
    lo.dtype = orchard::parse_dtype(d, "ORCHARD_BENCH_DTYPE");
  lo.context = P + N;
  double t0 = now_s();
  auto model = orchard::models::load_hf_model(dir, lo);
  model->eval();
  model->prepare_inference();
  orchard::compat::synchronize(dev);
  double bytes = 0;
  for (const auto& p : model->parameters())
    bytes += double(p.numel()) * double(p.element_size());
  std::printf(
      "load %.1f s; %.2f GB of weights; bound at %.0f GB/s: %.1f tok/s\n",
      now_s() - t0,
      bytes / 1e9,
      bw,
      bw * 1e9 / bytes);
  if (dev.is_cuda())
    std::printf(
        "kernels launched early (programmatic dependent launch): %s\n",
        orchard::ops::kernel::launches_early() ? "yes" : "no");
  const int64_t V = model->config.vocab_size;
  auto prompt = [&](int64_t seed) {
    std::vector<int64_t> p(static_cast<size_t>(P), 0);
    for (size_t i = 0; i < p.size(); ++i)
      p[i] = int64_t((i * 7919 + size_t(seed) * 104729) % size_t(V));
    return p;
  };
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = N;
  // Batch 1, best of 3 after a warm-up: decode tok/s, prefill tok/s.
  auto batch1 = [&](orchard::models::Llama& m, bool graphs, const char* what) {
    Engine e(m.ptr(), dev, graphs);
    double best = 0, prefill = 0;
    std::vector<int64_t> first;
    for (int run = 0; run < 4; ++run) {
      GenerationStats st;
      auto out = e.generate(prompt(0), greedy, {}, true, &st);
      if (run == 0) {
        first = out;
        continue; // warm-up (and graph capture)
      }
      if (out != first)
        std::printf("  (run %d gave other tokens)\n", run);
      // The first token comes from the prefill: N - 1 decode steps.
      best = std::max(best, double(out.size() - 1) / st.decode_seconds);
      prefill = std::max(prefill, st.prefill_tokens_per_s());
    }
    std::printf(
        "batch 1, %s%s: decode %.1f tok/s (%.0f %% of the bf16 bound), "
        "prefill %.0f tok/s, %zu tokens\n",
        graphs ? (e.uses_graphs() ? "CUDA graphs" : "graphs unavailable")
               : "eager",
        what,
        best,
        100.0 * best * bytes / (bw * 1e9),
        prefill,
        first.size());
  };
  const bool step_only = std::getenv("ORCHARD_BENCH_STEP_ONLY") != nullptr;
  for (bool graphs : {true, false})
    if (graphs || !step_only)
      batch1(model, graphs, "");
  {
    // The decoding step alone (no sampling, no host work between steps):
    // what the engine's per-token overhead is measured against.
    const auto& c = model->config;
    const auto opt =
        torch::TensorOptions().device(dev).dtype(*lo.dtype);
    orchard::models::BatchKvCache cache;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      cache.k.push_back(
          torch::zeros({1, c.num_key_value_heads, P + N, c.head_dim}, opt));
      cache.v.push_back(torch::zeros_like(cache.k.back()));
    }
    orchard::infer::DecodeStep step(model.ptr(), true);
    auto idx = torch::ones({1}, opt.dtype(torch::kInt64));
    auto pos = torch::full({1}, P + N / 2, opt.dtype(torch::kInt64));
    for (int i = 0; i < 3; ++i)
      step.run(idx, pos, cache, P + N);
    orchard::compat::synchronize(dev);
    const int reps = 200;
    const double s0 = now_s();
    for (int i = 0; i < reps; ++i)
      step.run(idx, pos, cache, P + N);
    orchard::compat::synchronize(dev);
    const double per = (now_s() - s0) / reps;
    std::printf(
        "decode step alone (%s, batch 1, %lld keys): %.3f ms = %.1f tok/s "
        "(%.0f %% of the bound)\n",
        step.uses_graphs() ? "CUDA graph" : "eager",
        (long long)(P + N),
        per * 1e3,
        1.0 / per,
        100.0 * bytes / (bw * 1e9) / per);
  }
#if ORCHARD_BENCH_GRAPHS
  if (std::getenv("ORCHARD_BENCH_PRODUCTS") != nullptr) {
    // The one-row products alone, each kind over every layer's matrix in
    // turn (so no matrix is read from L2), 20 passes captured in a CUDA
    // graph: the weight bytes streamed per second.
    torch::NoGradGuard no_grad;
    auto& layers = model->model->layers;
    auto kinds =
        std::vector<std::pair<const char*, std::vector<torch::Tensor>>>{
            {"qkv", {}}, {"o", {}}, {"gate_up", {}}, {"down", {}}};
    for (size_t l = 0; l < layers->size(); ++l) {
      auto* layer = layers[l]->as<orchard::models::LlamaLayerImpl>();
      kinds[0].second.push_back(layer->self_attn->qkv_weight);
      kinds[1].second.push_back(layer->self_attn->o_proj->weight);
      kinds[2].second.push_back(layer->mlp->gate_up_weight);
      kinds[3].second.push_back(layer->mlp->down_proj->weight);
    }
    // `passes` calls of fn captured in one CUDA graph (after a call
    // outside it: workspaces, tables), the best of five replays in seconds.
    auto graph_seconds = [&](const std::function<void()>& fn, int passes) {
      auto stream = c10::cuda::getStreamFromPool(false, dev.index());
      at::cuda::CUDAGraph graph;
      {
        c10::cuda::CUDAStreamGuard guard(stream);
        fn();
        stream.synchronize();
        graph.capture_begin();
        for (int pass = 0; pass < passes; ++pass)
          fn();
        graph.capture_end();
      }
      graph.replay();
      orchard::compat::synchronize(dev);
      double best = 1e9;
      for (int rep = 0; rep < 5; ++rep) {
        const double t0 = now_s();
        graph.replay();
        orchard::compat::synchronize(dev);
        best = std::min(best, now_s() - t0);
      }
      return best;
    };
    double all_bytes = 0, all_s = 0;
    for (auto& [name, ws] : kinds) {
      if (!ws[0].defined())
        continue;
      auto x = torch::randn({1, ws[0].size(1)}, ws[0].options());
      const double best = graph_seconds(
          [&] {
            for (auto& w : ws)
              orchard::ops::linear(x, w);
          },
          20);
      double b = 0;
      for (auto& w : ws)
        b += double(w.numel()) * double(w.element_size()) * 20;
      all_bytes += b;
      all_s += best;
      std::printf(
          "products %-7s %lld x %lld: %.2f us each, %.0f GB/s\n",
          name,
          (long long)ws[0].size(0),
          (long long)ws[0].size(1),
          best / double(20 * ws.size()) * 1e6,
          b / best / 1e9);
    }
    std::printf(
        "products, the layers' all: %.0f GB/s\n", all_bytes / all_s / 1e9);
    // What a kernel between two products costs in a chain where each op
    // reads the one before (as in the step): every layer's MLP, its
    // products as the step runs them, then with silu_mul as a kernel of
    // its own, then with the residual add and norm before it. The
    // differences per layer are what fusing that kernel saves.
    const int64_t C = kinds[3].second[0].size(0);
    auto w_norm = torch::ones({C}, kinds[3].second[0].options());
    auto r = torch::randn({1, C}, w_norm.options()) * 0.1;
    auto x0 = torch::randn({1, C}, w_norm.options()); // read, never written
    auto mlp = [&](int variant) {
      auto x = x0;
      for (size_t l = 0; l < kinds[2].second.size(); ++l) {
        const auto& gu = kinds[2].second[l];
        if (variant == 2)
          x = std::get<1>(orchard::ops::add_rms_norm(x, r, w_norm, 1e-6));
        torch::Tensor a;
        if (variant == 1) {
          auto y = orchard::ops::linear(x, gu);
          const int64_t F = gu.size(0) / 2;
          a = orchard::ops::silu_mul(y.narrow(1, 0, F), y.narrow(1, F, F));
        } else {
          a = orchard::ops::linear_silu_mul(x, gu);
        }
        x = orchard::ops::linear(a, kinds[3].second[l]);
      }
    };
    // The attention half likewise: qkv, rotary and the cache write,
    // attention over P + N keys (several chunks, then their combination),
    // o; then without the rotary kernel (q read from the product), then
    // over 32 keys (one chunk of decode_attention.cu's: no combination
    // kernel).
    const auto& c = model->config;
    const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                  D = c.head_dim, cap = P + N;
    std::vector<torch::Tensor> ck, cv;
    for (size_t l = 0; l < kinds[0].second.size(); ++l) {
      ck.push_back(torch::randn({1, Hkv, cap, D}, w_norm.options()));
      cv.push_back(torch::randn({1, Hkv, cap, D}, w_norm.options()));
    }
    auto cos = torch::randn({cap, D}, w_norm.options()),
         sin = torch::randn({cap, D}, w_norm.options());
    auto pos_long =
        torch::full({1}, cap - 1, w_norm.options().dtype(torch::kInt64));
    auto pos_short =
        torch::full({1}, 31, w_norm.options().dtype(torch::kInt64));
    auto attention = [&](int variant) {
      auto x = x0;
      for (size_t l = 0; l < kinds[0].second.size(); ++l) {
        auto qkv = orchard::ops::linear(x, kinds[0].second[l]);
        auto q = qkv.narrow(1, 0, H * D), k = qkv.narrow(1, H * D, Hkv * D),
             v = qkv.narrow(1, (H + Hkv) * D, Hkv * D);
        const auto& pos = variant == 2 ? pos_short : pos_long;
        auto qr = variant == 1 ? q.view({1, H, 1, D})
                               : orchard::ops::rotary_cache_write(
                                     q, k, v, cos, sin, pos, ck[l], cv[l]);
        auto y = orchard::ops::decode_attention(
            qr, ck[l], cv[l], pos, variant == 2 ? 32 : cap);
        x = orchard::ops::linear(y.reshape({1, -1}), kinds[1].second[l]);
      }
    };
    auto chain_us = [&](const std::function<void()>& fn) {
      return graph_seconds(fn, 10) / double(10 * kinds[0].second.size()) *
          1e6;
    };
    if (kinds[0].second[0].defined() && kinds[2].second[0].defined()) {
      const char* mlp_names[] = {
          "products only", "silu_mul apart", "add_rms_norm before"};
      const char* attention_names[] = {
          "as in the step", "no rotary kernel", "32 keys (no combine)"};
      for (int half = 0; half < 2; ++half) {
        double base = 0;
        for (int variant = 0; variant < 3; ++variant) {
          const double us =
              chain_us([&] { half == 0 ? mlp(variant) : attention(variant); });
          if (variant == 0)
            base = us;
          std::printf(
              "%s chain, %-20s: %.2f us a layer (%+.2f)\n",
              half == 0 ? "mlp" : "attention",
              half == 0 ? mlp_names[variant] : attention_names[variant],
              us,
              us - base);
        }
      }
    }
  }
#endif
  if (step_only)
    return 0;
  Engine e(model.ptr(), dev, true);
  for (int64_t B : {8, 32}) {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t b = 0; b < B; ++b)
      prompts.push_back(prompt(b + 1));
    double best = 0;
    for (int run = 0; run < 3; ++run) {
      GenerationStats st;
      e.generate_batch(prompts, 1, greedy, &st);
      if (run > 0)
        best = std::max(best, st.decode_tokens_per_s());
    }
    std::printf("batch %lld: %.1f tok/s decode (all rows)\n", (long long)B, best);
  }
  SamplingOptions grpo;
  grpo.temperature = 1.0;
  grpo.top_k = 0;
  grpo.max_new_tokens = N;
  double best = 0, best_wall = 0;
  for (int run = 0; run < 3; ++run) {
    GenerationStats st;
    double w0 = now_s();
    e.generate_batch({prompt(99)}, 8, grpo, &st);
    double wall = now_s() - w0;
    if (run > 0) {
      best = std::max(best, st.decode_tokens_per_s());
      best_wall = best_wall == 0 ? wall : std::min(best_wall, wall);
    }
  }
  std::printf(
      "rollout 8 x %lld (T=1, log-probs): %.1f tok/s decode, %.2f s each\n",
      (long long)N,
      best,
      best_wall);
  if (dev.is_cuda() && std::getenv("ORCHARD_BENCH_NF4") != nullptr) {
    // The same weights with the layers' projections in 4 bits (QLoRA's
    // base), decoded as a QLoRA run's samples are.
    lo.load_in_4bit = true;
    auto q4 = orchard::models::load_hf_model(dir, lo);
    q4->eval();
    q4->prepare_inference();
    batch1(q4, true, ", NF4 base");
  }
  return 0;
}
