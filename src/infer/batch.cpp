#include "infer/batch.h"

#include "core/error.h"

#include <algorithm>

namespace orchard::infer {

struct BatchEngine::Slot {
  std::shared_ptr<BatchRequest> request;
  int64_t length = 0;    // tokens in the cache + the pending one
  int64_t last = 0;      // the token the next step feeds
  int64_t generated = 0; // new tokens so far
};

BatchEngine::BatchEngine(
    std::shared_ptr<models::LanguageModel> model,
    torch::Device device,
    int64_t max_batch)
    : model_(std::move(model)),
      device_(device),
      max_batch_(std::max<int64_t>(1, max_batch)),
      sampler_(device),
      step_(model_) {
  model_->to(device_);
  model_->eval();
  worker_ = std::thread([this] { loop(); });
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void BatchEngine::submit(std::shared_ptr<BatchRequest> request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(request));
  }
  cv_.notify_all();
}

size_t BatchEngine::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t BatchEngine::active() const {
  return active_.load();
}

BatchStats BatchEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BatchEngine::loop() {
  for (;;) {
    std::vector<std::shared_ptr<BatchRequest>> incoming;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !queue_.empty() || !slots_.empty();
      });
      if (stopping_)
        break;
      while (!queue_.empty() &&
             int64_t(slots_.size() + incoming.size()) < max_batch_) {
        incoming.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    try {
      for (auto& r : incoming)
        admit(r);
      if (!slots_.empty())
        step();
    } catch (const std::exception& e) {
      // Out of memory or a bad model: every request in flight ends with
      // the error; the server goes on.
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      cache_.k.clear();
      cache_.v.clear();
      step_.reset();
      sampler_ = Sampler(device_);
      while (!slots_.empty()) {
        auto r = slots_.back()->request;
        slots_.pop_back();
        if (r->on_done)
          r->on_done("error: " + what);
      }
    }
    active_ = slots_.size();
  }
  // Shutting down: whoever waits is told.
  for (size_t i = slots_.size(); i-- > 0;)
    finish(i, "cancelled");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : queue_)
    if (r->on_done)
      r->on_done("cancelled");
  queue_.clear();
}

void BatchEngine::finish(size_t index, const std::string& reason) {
  auto request = slots_[index]->request;
  // The last row moves into the freed one (cache, sampler and slot alike).
  const size_t last = slots_.size() - 1;
  if (!cache_.k.empty())
    move_row(cache_, int64_t(last), int64_t(index));
  sampler_.remove_row(int64_t(index));
  slots_[index] = std::move(slots_[last]);
  slots_.pop_back();
  // The slot is free before the request counts as cancelled, so /health
  // never shows a cancelled request still active.
  active_ = slots_.size();
  if (reason == "cancelled") {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.cancelled;
  }
  if (request->on_done)
    request->on_done(reason);
}

// Prefills the prompt on its own, samples the first token and copies the
// request's keys and values into the next row of the batch cache.
void BatchEngine::admit(std::shared_ptr<BatchRequest> r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
  }
  const int64_t Tmax = model_->max_seq_len();
  if (r->cancelled) {
    if (r->on_done)
      r->on_done("cancelled");
    return;
  }
  if (r->prompt.empty() || int64_t(r->prompt.size()) >= Tmax) {
    if (r->on_done)
      r->on_done(
          "error: the prompt is " + std::to_string(r->prompt.size()) +
          " tokens; the model reads 1 to " + std::to_string(Tmax - 1));
    return;
  }
  auto slot = std::make_unique<Slot>();
  slot->request = r;
  torch::NoGradGuard no_grad;
  const int64_t row = int64_t(slots_.size());
  sampler_.add_row(r->options, r->prompt);
  try {
    models::KvCache kv;
    auto ids =
        torch::tensor(r->prompt, torch::kInt64).view({1, -1}).to(device_);
    auto logits = model_->forward(ids, &kv);
    if (cache_.k.empty() || cache_.rows() <= row) {
      // Twice the rows (at most max_batch), the rows so far copied over.
      const int64_t rows =
          std::min(max_batch_, std::max<int64_t>(1, 2 * cache_.rows()));
      auto grown = allocate_cache(kv, std::max(rows, row + 1), Tmax);
      for (size_t l = 0; l < cache_.k.size(); ++l) {
        grown.k[l].narrow(0, 0, row).copy_(cache_.k[l].narrow(0, 0, row));
        grown.v[l].narrow(0, 0, row).copy_(cache_.v[l].narrow(0, 0, row));
      }
      cache_ = std::move(grown);
      step_.reset();
    }
    copy_into_row(kv, cache_, row);
    slot->last = sampler_.sample(logits.select(1, logits.size(1) - 1), row)
                     .item<int64_t>();
  } catch (const std::exception& e) {
    sampler_.remove_row(row);
    std::string what = e.what();
    if (r->on_done)
      r->on_done("error: " + what.substr(0, what.find('\n')));
    return;
  }
  slot->length = int64_t(r->prompt.size());
  slot->generated = 1;
  slots_.push_back(std::move(slot));
  // The first token goes out now; the request may already be finished.
  const size_t i = slots_.size() - 1;
  Slot& s = *slots_[i];
  const auto& stops = r->options.stop_tokens;
  bool keep = !r->cancelled && (!r->on_token || r->on_token(s.last));
  if (!keep)
    finish(i, r->cancelled ? "cancelled" : "stop");
  else if (std::find(stops.begin(), stops.end(), s.last) != stops.end())
    finish(i, "stop");
  else if (s.generated >= r->options.max_new_tokens || s.length + 1 >= Tmax)
    finish(i, "length");
}

// One token for every active request.
void BatchEngine::step() {
  const int64_t Tmax = model_->max_seq_len();
  // Requests cancelled since the last step leave first.
  for (size_t i = slots_.size(); i-- > 0;)
    if (slots_[i]->request->cancelled)
      finish(i, "cancelled");
  if (slots_.empty())
    return;
  torch::NoGradGuard no_grad;
  const int64_t B = int64_t(slots_.size());
  std::vector<int64_t> last, pos;
  int64_t key_len = 0;
  for (const auto& s : slots_) {
    last.push_back(s->last);
    pos.push_back(s->length); // the fed token's position
    key_len = std::max(key_len, s->length + 1);
  }
  auto logits = step_.run(
      torch::tensor(last, torch::kInt64).to(device_),
      torch::tensor(pos, torch::kInt64).to(device_),
      cache_,
      key_len);
  // The host reads the tokens every step: they stream to the clients.
  auto tokens = sampler_.sample(logits).to(torch::kCPU);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.tokens += B;
    stats_.max_rows = std::max(stats_.max_rows, B);
  }
  std::vector<std::pair<size_t, std::string>> done;
  for (int64_t b = 0; b < B; ++b) {
    Slot& s = *slots_[size_t(b)];
    BatchRequest& r = *s.request;
    s.length += 1;
    s.last = tokens[b].item<int64_t>();
    s.generated += 1;
    const auto& stops = r.options.stop_tokens;
    if (r.cancelled || (r.on_token && !r.on_token(s.last)))
      done.push_back({size_t(b), r.cancelled ? "cancelled" : "stop"});
    else if (std::find(stops.begin(), stops.end(), s.last) != stops.end())
      done.push_back({size_t(b), "stop"});
    else if (s.generated >= r.options.max_new_tokens || s.length + 1 >= Tmax)
      done.push_back({size_t(b), "length"});
  }
  for (auto it = done.rbegin(); it != done.rend(); ++it)
    finish(it->first, it->second);
}

} // namespace orchard::infer
