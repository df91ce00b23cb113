#include "infer/decode_step.h"

#include "core/torch_compat.h"

#include <cstdio>

#if defined(ORCHARD_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define ORCHARD_CUDA_GRAPHS 1
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#else
#define ORCHARD_CUDA_GRAPHS 0
#endif

namespace orchard::infer {

bool cuda_graphs_built() {
  return ORCHARD_CUDA_GRAPHS;
}

models::BatchKvCache allocate_cache(
    const models::KvCache& like,
    int64_t rows,
    int64_t capacity) {
  models::BatchKvCache cache;
  for (size_t l = 0; l < like.k.size(); ++l) {
    const auto& k = like.k[l];
    const auto& v = like.v[l];
    cache.k.push_back(
        torch::zeros({rows, k.size(1), capacity, k.size(3)}, k.options()));
    cache.v.push_back(
        torch::zeros({rows, v.size(1), capacity, v.size(3)}, v.options()));
  }
  return cache;
}

void copy_into_row(
    const models::KvCache& prefilled,
    models::BatchKvCache& cache,
    int64_t row) {
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    const int64_t T = prefilled.k[l].size(2);
    cache.k[l][row].narrow(1, 0, T).copy_(prefilled.k[l][0]);
    cache.v[l][row].narrow(1, 0, T).copy_(prefilled.v[l][0]);
  }
}

void move_row(models::BatchKvCache& cache, int64_t from, int64_t to) {
  if (from == to)
    return;
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    cache.k[l][to].copy_(cache.k[l][from]);
    cache.v[l][to].copy_(cache.v[l][from]);
  }
}

namespace {

// Rows 0..B-1 of the cache, as views (the same memory).
models::BatchKvCache first_rows(models::BatchKvCache& cache, int64_t B) {
  if (cache.rows() == B)
    return cache;
  models::BatchKvCache view;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    view.k.push_back(cache.k[l].narrow(0, 0, B));
    view.v.push_back(cache.v[l].narrow(0, 0, B));
  }
  return view;
}

} // namespace

struct DecodeStep::Graph {
#if ORCHARD_CUDA_GRAPHS
  at::cuda::CUDAGraph graph;
#endif
  torch::Tensor idx, pos, out;
};

DecodeStep::DecodeStep(
    std::shared_ptr<models::LanguageModel> model,
    bool graphs)
    : model_(std::move(model)), graphs_(graphs && ORCHARD_CUDA_GRAPHS) {}

DecodeStep::~DecodeStep() = default;

void DecodeStep::reset() {
  captured_.clear();
  cache_id_ = nullptr;
  // The pool went with its last graph: its id must not be reused (CUDA's
  // caching allocator asserts on a pool whose graphs are gone).
  pool_ = {0, 0};
}

int64_t DecodeStep::captured() const {
  return int64_t(captured_.size());
}

torch::Tensor DecodeStep::run(
    const torch::Tensor& idx,
    const torch::Tensor& pos,
    models::BatchKvCache& cache,
    int64_t key_len) {
  torch::NoGradGuard no_grad;
  const int64_t B = idx.size(0);
  const int64_t capacity = cache.k.at(0).size(2);
  const int64_t L =
      std::min(capacity, (key_len + kKeyBucket - 1) / kKeyBucket * kKeyBucket);
  models::BatchKvCache rows = first_rows(cache, B);
  // Under autocast (samples drawn while training) the cast weights live in
  // autocast's cache, freed when its region ends: a graph would keep
  // reading them. Eager there.
  if (!graphs_ || !idx.is_cuda() ||
      compat::autocast_dtype(torch::kCUDA) != torch::kFloat32)
    return model_->decode_batch(idx, pos, rows, L);
#if ORCHARD_CUDA_GRAPHS
  if (cache.k[0].data_ptr() != cache_id_) {
    reset();
    cache_id_ = cache.k[0].data_ptr();
  }
  auto& g = captured_[{B, L}];
  if (!g) {
    g = std::make_unique<Graph>();
    g->idx = idx.clone();
    g->pos = pos.clone();
    torch::cuda::synchronize(idx.device().index());
    // One side stream per thread and device for every capture: cuBLAS
    // keeps a workspace (32 MB on an H100) for each stream it has run on,
    // so a fresh pool stream per capture left one more behind each time a
    // decoder was made (GRPO makes one per rollout).
    thread_local std::map<int, c10::cuda::CUDAStream> capture_streams;
    const int dev = idx.device().index();
    auto found = capture_streams.find(dev);
    if (found == capture_streams.end())
      found = capture_streams
                  .emplace(dev, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev))
                  .first;
    auto stream = found->second;
    try {
      c10::cuda::CUDAStreamGuard on_side_stream(stream);
      // Warm-up outside the capture (workspaces, cached tables): it writes
      // the same keys and values the real step does.
      model_->decode_batch(g->idx, g->pos, rows, L);
      stream.synchronize();
      // Thread-local capture: what other threads do on the device (a
      // server's or a test's other work) neither breaks this capture nor
      // is refused because of it; only this thread is held to the
      // capture's rules.
      g->graph.capture_begin(
          {pool_.first, pool_.second}, cudaStreamCaptureModeThreadLocal);
      try {
        g->out = model_->decode_batch(g->idx, g->pos, rows, L);
      } catch (...) {
        try {
          g->graph.capture_end();
        } catch (...) {
        }
        throw;
      }
      g->graph.capture_end();
      auto pool = g->graph.pool();
      pool_ = {pool.first, pool.second};
    } catch (const std::exception& e) {
      std::string what = e.what();
      std::fprintf(
          stderr,
          "Note: CUDA graph capture failed (%s); decoding runs without "
          "graphs.\n",
          what.substr(0, what.find('\n')).c_str());
      captured_.clear();
      graphs_ = false;
      torch::cuda::synchronize(idx.device().index());
      return model_->decode_batch(idx, pos, rows, L);
    }
  }
  g->idx.copy_(idx);
  g->pos.copy_(pos);
  g->graph.replay();
  return g->out;
#else
  return model_->decode_batch(idx, pos, rows, L);
#endif
}

} // namespace orchard::infer
