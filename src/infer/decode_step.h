// One decoding step of a batch: the model's decode_batch over a KV cache
// allocated once (rows x capacity), with fixed shapes. On CUDA (libtorch
// 2.x) each shape (rows, key length rounded up to kKeyBucket) is captured
// once as a CUDA graph and replayed for every later token of that shape:
// one launch instead of a few hundred kernels, so a small batch runs at
// the speed of reading the weights rather than of launching kernels.
// Elsewhere (CPU, MPS, libtorch 1.13) the step runs eagerly; the numbers
// are the same.
#pragma once

#include "models/language_model.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace orchard::infer {

// Attention reads the cache in multiples of this many positions: a graph
// per bucket, never more than kKeyBucket - 1 unused positions read.
constexpr int64_t kKeyBucket = 128;

// A KV cache of `rows` rows of `capacity` positions, zero-filled, with the
// layers, heads, dtype and device of a prefilled cache.
models::BatchKvCache allocate_cache(
    const models::KvCache& like,
    int64_t rows,
    int64_t capacity);

// Copies a prefilled KvCache (batch 1) into row `row` of `cache`.
void copy_into_row(
    const models::KvCache& prefilled,
    models::BatchKvCache& cache,
    int64_t row);

// Moves row `from` of `cache` into row `to` (in place: addresses stay, so
// captured graphs stay valid).
void move_row(models::BatchKvCache& cache, int64_t from, int64_t to);

class DecodeStep {
 public:
  // `graphs`: capture CUDA graphs where possible (false: always eager).
  DecodeStep(std::shared_ptr<models::LanguageModel> model, bool graphs = true);
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;

  // Logits (B, V) of tokens `idx` (B) at positions `pos` (B), device
  // tensors, over rows 0..B-1 of `cache`; every pos < key_len. The result
  // is overwritten by the next call.
  torch::Tensor run(
      const torch::Tensor& idx,
      const torch::Tensor& pos,
      models::BatchKvCache& cache,
      int64_t key_len);
  // Drops the captured graphs (call when the cache is reallocated).
  void reset();
  // Whether graphs are captured and replayed on this build and device.
  bool uses_graphs() const {
    return graphs_;
  }
  // How many graphs have been captured so far.
  int64_t captured() const;

 private:
  struct Graph;
  std::shared_ptr<models::LanguageModel> model_;
  bool graphs_ = false;
  const void* cache_id_ = nullptr; // the cache the graphs were captured on
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> captured_;
  // The graphs' shared memory pool (CUDA's MempoolId_t; {0, 0}: none yet).
  std::pair<unsigned long long, unsigned long long> pool_{0, 0};
};

// Whether this build can capture CUDA graphs (a CUDA libtorch 2.x).
bool cuda_graphs_built();

} // namespace orchard::infer
