#include "data/loader.h"

#include "core/error.h"

namespace orchard::data {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t epoch_seed(uint64_t seed, uint64_t epoch) {
  uint64_t s = seed ^ (epoch * 0xD1B54A32D192ED03ull);
  return splitmix64(s);
}

} // namespace

std::vector<uint64_t> permutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i)
    p[i] = i;
  uint64_t state = seed;
  for (uint64_t i = n; i > 1; --i)
    std::swap(p[i - 1], p[splitmix64(state) % i]);
  return p;
}

namespace {
// The visiting order of epoch `epoch`: 0..n-1, or a seeded permutation.
std::vector<uint64_t> epoch_order(
    uint64_t n,
    bool shuffle,
    uint64_t seed,
    uint64_t epoch) {
  if (shuffle)
    return permutation(n, epoch_seed(seed, epoch));
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i)
    order[i] = i;
  return order;
}
} // namespace

TokenLoader::TokenLoader(
    const std::vector<std::string>& paths,
    int64_t batch_size,
    int64_t seq_len,
    bool shuffle,
    uint64_t seed,
    int rank,
    int world_size)
    : B_(batch_size),
      T_(seq_len),
      shuffle_(shuffle),
      seed_(seed),
      rank_(rank),
      world_(world_size) {
  if (paths.empty())
    throw UserError("no token shards to load (is the data folder right?).");
  if (B_ < 1 || T_ < 1 || world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw std::invalid_argument(
        "[TokenLoader] bad batch, length, rank or world size");
  for (const auto& p : paths)
    shards_.push_back(Shard::open(p));
  for (uint32_t s = 0; s < shards_.size(); ++s)
    for (uint64_t start = 0; start + T_ + 1 <= shards_[s].size(); start += T_)
      windows_.push_back({s, start});
  if (windows_.size() < uint64_t(B_) * world_)
    throw UserError(
        "the shards hold " + std::to_string(windows_.size()) +
        " sequences of " + std::to_string(T_ + 1) +
        " tokens, fewer than one step needs (" + std::to_string(B_ * world_) +
        "); use more data, a smaller device_batch_size or a shorter "
        "max_seq_len.");
}

uint64_t TokenLoader::count_windows(
    const std::vector<std::string>& paths,
    int64_t seq_len) {
  uint64_t n = 0;
  for (const auto& p : paths) {
    uint64_t size = Shard::open(p).size();
    if (size > uint64_t(seq_len))
      n += (size - 1) / uint64_t(seq_len);
  }
  return n;
}

uint64_t TokenLoader::steps_per_epoch() const {
  return windows_.size() / (uint64_t(B_) * world_);
}

void TokenLoader::start_epoch() {
  if (order_epoch_ == state_.epoch)
    return;
  order_ = epoch_order(windows_.size(), shuffle_, seed_, state_.epoch);
  order_epoch_ = state_.epoch;
}

void TokenLoader::restore(const LoaderState& s) {
  state_ = s;
  if (state_.step > steps_per_epoch())
    throw UserError(
        "the saved data position (epoch " + std::to_string(s.epoch) +
        ", step " + std::to_string(s.step) +
        ") is past the end of this data (" + std::to_string(steps_per_epoch()) +
        " steps per epoch): the data changed since the checkpoint.");
}

void TokenLoader::set_batch_size(int64_t b) {
  const uint64_t done = state_.step * uint64_t(B_);
  if (b < 1 || done % uint64_t(b) != 0)
    throw UserError(
        "cannot continue this epoch with " + std::to_string(b) +
        " sequences per micro-step: " + std::to_string(done) +
        " have been served, not a multiple of it. Use device_batch_size=" +
        std::to_string(B_) + " (or a divisor of it).");
  state_.step = done / uint64_t(b);
  B_ = b;
}

TokenBatch TokenLoader::next() {
  if (state_.step >= steps_per_epoch()) {
    ++state_.epoch;
    state_.step = 0;
  }
  start_epoch();
  auto x = torch::empty({B_, T_}, torch::kInt64);
  auto y = torch::empty({B_, T_}, torch::kInt64);
  auto xa = x.accessor<int64_t, 2>();
  auto ya = y.accessor<int64_t, 2>();
  std::vector<uint32_t> buf(T_ + 1);
  uint64_t first = (state_.step * world_ + rank_) * B_;
  for (int64_t b = 0; b < B_; ++b) {
    auto [shard, start] = windows_[order_[first + b]];
    shards_[shard].read(start, T_ + 1, buf.data());
    for (int64_t t = 0; t < T_; ++t) {
      xa[b][t] = buf[t];
      ya[b][t] = buf[t + 1];
    }
  }
  ++state_.step;
  return {x, y};
}

ChatBatcher::ChatBatcher(
    const ChatFile& file,
    int64_t batch_size,
    int64_t seq_len,
    bool pack,
    uint32_t pad_id,
    bool shuffle,
    uint64_t seed,
    int rank,
    int world_size)
    : file_(file),
      B_(batch_size),
      T_(seq_len),
      pack_(pack),
      pad_(pad_id),
      shuffle_(shuffle),
      seed_(seed),
      rank_(rank),
      world_(world_size) {
  if (B_ < 1 || T_ < 1 || world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw std::invalid_argument(
        "[ChatBatcher] bad batch, length, rank or world size");
  if (file_.size() == 0)
    throw UserError(
        "chat data file '" + file_.path() + "' holds no conversations.");
}

void ChatBatcher::ensure_order() {
  if (order_epoch_ == state_.epoch)
    return;
  order_ = epoch_order(file_.size(), shuffle_, seed_, state_.epoch);
  order_epoch_ = state_.epoch;
  step_cursor_ = {0};
}

bool ChatBatcher::fill_row(int64_t row, ChatBatch& b, uint64_t& cursor) {
  if (cursor >= order_.size())
    return false;
  auto xa = b.x.accessor<int64_t, 2>();
  auto ya = b.y.accessor<int64_t, 2>();
  auto ma = b.loss_mask.accessor<float, 2>();
  auto da = b.doc.accessor<int32_t, 2>();
  int64_t pos = 0; // tokens of x placed in this row
  int32_t doc = 0;
  while (cursor < order_.size()) {
    uint64_t c = order_[cursor];
    // A conversation of n tokens gives n - 1 (input, target) pairs.
    int64_t n = std::min<int64_t>(file_.length(c), T_ + 1);
    int64_t pairs = n - 1;
    if (pos > 0 && (!pack_ || pos + pairs > T_))
      break; // does not fit: next row
    const uint32_t* ids = file_.ids(c);
    const uint8_t* mask = file_.mask(c);
    for (int64_t t = 0; t < pairs; ++t) {
      xa[row][pos + t] = ids[t];
      ya[row][pos + t] = ids[t + 1];
      ma[row][pos + t] = mask[t + 1];
      da[row][pos + t] = doc;
    }
    pos += pairs;
    ++doc;
    ++cursor;
    if (!pack_)
      break;
  }
  return true;
}

LoaderState ChatBatcher::state() const {
  LoaderState s = state_;
  s.cursor = step_cursor_.empty() ? 0 : step_cursor_.back();
  return s;
}

void ChatBatcher::set_batch_size(int64_t b) {
  if (b < 1)
    throw std::invalid_argument("[ChatBatcher] batch size below 1");
  B_ = b;
}

void ChatBatcher::restore(const LoaderState& s) {
  state_ = {s.epoch, 0};
  order_epoch_ = UINT64_MAX;
  ensure_order();
  if (s.cursor) {
    if (*s.cursor > order_.size())
      throw UserError(
          "the saved data position (epoch " + std::to_string(s.epoch) +
          ", conversation " + std::to_string(*s.cursor) +
          ") is past the end of this data (" + std::to_string(order_.size()) +
          " conversations): the data changed since the checkpoint.");
    state_.step = s.step;
    step_cursor_ = {*s.cursor};
    return;
  }
  // An older checkpoint without the cursor: replay it from the start of the
  // epoch (packing makes the position depend on every row before it).
  while (state_.step < s.step) {
    ChatBatch scratch = {
        torch::empty({B_, T_}, torch::kInt64),
        torch::empty({B_, T_}, torch::kInt64),
        torch::zeros({B_, T_}, torch::kFloat32),
        torch::full({B_, T_}, -1, torch::kInt32)};
    uint64_t cursor = step_cursor_.back();
    for (int64_t r = 0; r < B_ * world_; ++r)
      fill_row(r % B_, scratch, cursor);
    step_cursor_.push_back(cursor);
    ++state_.step;
  }
}

ChatBatch ChatBatcher::next() {
  ensure_order();
  ChatBatch b = {
      torch::full({B_, T_}, int64_t(pad_), torch::kInt64),
      torch::full({B_, T_}, int64_t(pad_), torch::kInt64),
      torch::zeros({B_, T_}, torch::kFloat32),
      torch::full({B_, T_}, -1, torch::kInt32)};
  uint64_t cursor = step_cursor_.back();
  if (cursor >= order_.size()) { // epoch done: wrap
    ++state_.epoch;
    state_.step = 0;
    ensure_order();
    cursor = 0;
  }
  // All ranks walk the same rows; each keeps its own B of the world * B.
  ChatBatch other = b;
  for (int64_t r = 0; r < B_ * world_; ++r) {
    bool mine = r / B_ == rank_;
    ChatBatch& target = mine ? b : other;
    if (!mine)
      target = {
          torch::full({B_, T_}, int64_t(pad_), torch::kInt64),
          torch::full({B_, T_}, int64_t(pad_), torch::kInt64),
          torch::zeros({B_, T_}, torch::kFloat32),
          torch::full({B_, T_}, -1, torch::kInt32)};
    if (!fill_row(r % B_, target, cursor))
      break; // the epoch's last step may be short; its rows stay padding
  }
  step_cursor_.push_back(cursor);
  ++state_.step;
  return b;
}

} // namespace orchard::data
