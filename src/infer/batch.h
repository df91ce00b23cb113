// Serving many conversations at once: requests wait in a queue; a worker
// thread prefills each new one on its own, then decodes every active
// request together, one token per request per step (a DecodeStep over a
// KV cache of fixed rows, infer/decode_step.h: a replayed CUDA graph on
// CUDA), so N clients cost about one decode step each, not N. A finished,
// stopped or cancelled request leaves the batch at once (the last row
// moves into its place); a waiting one joins at the next step.
#pragma once

#include "infer/decode_step.h"
#include "infer/engine.h"
#include "infer/sampling.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace orchard::infer {

struct BatchRequest {
  std::vector<int64_t> prompt;
  SamplingOptions options;
  // Each new token, from the worker thread; return false to stop.
  std::function<bool(int64_t)> on_token;
  // Once, at the end: "stop" (a stop token), "length" (max_new_tokens or
  // the model's context), "cancelled", or "error: ..." for a failure.
  std::function<void(const std::string& reason)> on_done;
  // Set from any thread (a client that went away); the request leaves the
  // batch before the next step.
  std::atomic<bool> cancelled{false};
};

struct BatchStats {
  int64_t steps = 0, tokens = 0, max_rows = 0, requests = 0, cancelled = 0;
};

class BatchEngine {
 public:
  // `max_batch` requests decode together; more wait in the queue.
  BatchEngine(
      std::shared_ptr<models::LanguageModel> model,
      torch::Device device,
      int64_t max_batch);
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  void submit(std::shared_ptr<BatchRequest> request);
  // Requests waiting and decoding now.
  size_t queued() const;
  size_t active() const;
  BatchStats stats() const;
  int64_t max_seq_len() const {
    return model_->max_seq_len();
  }

 private:
  struct Slot;
  void loop();
  void admit(std::shared_ptr<BatchRequest> r);
  void step();
  void finish(size_t index, const std::string& reason);

  std::shared_ptr<models::LanguageModel> model_;
  torch::Device device_;
  int64_t max_batch_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<BatchRequest>> queue_;
  std::vector<std::unique_ptr<Slot>> slots_; // worker thread only
  // Row i of the cache and of the sampler is slots_[i]'s; the cache's rows
  // grow by doubling up to max_batch.
  models::BatchKvCache cache_;
  Sampler sampler_;
  DecodeStep step_;
  std::atomic<size_t> active_{0};
  BatchStats stats_;
  bool stopping_ = false;
  std::thread worker_;
};

} // namespace orchard::infer
