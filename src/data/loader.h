// Batches for training, resumable to the exact position.
//
// TokenLoader reads token shards. The data is cut into windows of T+1
// tokens starting every T tokens inside each shard (a window never crosses
// shards), x = window[:-1], y = window[1:]. An epoch visits the windows in
// shard order, or, with `shuffle`, in a permutation drawn from the seed and
// the epoch number. Each step takes world * B windows; rank r uses the r-th
// group of B, so ranks never see the same window in a step.
//
// ChatBatcher reads a .chat file. `pack` fills each row with whole
// conversations back to back (doc ids mark where each one starts);
// otherwise each row is one conversation, padded. Targets are masked with
// the conversation's loss mask: only assistant tokens are trained on.
//
// The position is a LoaderState {epoch, step} (ChatBatcher adds its
// conversation cursor); a loader restored from it yields exactly the
// batches an uninterrupted one would have. Permutations
// use Orchard's own generator (splitmix64 + Fisher-Yates), not std::shuffle,
// whose results differ between standard libraries.
#pragma once

#include "data/chat_file.h"
#include "data/shards.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard::data {

struct LoaderState {
  uint64_t epoch = 0;
  uint64_t step = 0; // steps done within the epoch
  // ChatBatcher: conversations served this epoch, its exact position
  // whatever the batch size (unset in checkpoints older than that).
  std::optional<uint64_t> cursor;
  bool operator==(const LoaderState&) const = default;
};

// {"epoch": E, "step": S[, "cursor": C]}, as checkpoints' state.json holds
// it.
inline void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"step", s.step}};
  if (s.cursor)
    j["cursor"] = *s.cursor;
}
inline void from_json(const nlohmann::json& j, LoaderState& s) {
  s.epoch = j.at("epoch").get<uint64_t>();
  s.step = j.at("step").get<uint64_t>();
  s.cursor.reset();
  if (j.contains("cursor"))
    s.cursor = j.at("cursor").get<uint64_t>();
}

// A permutation of 0..n-1 from `seed` (same on every platform).
std::vector<uint64_t> permutation(uint64_t n, uint64_t seed);

struct TokenBatch {
  torch::Tensor x, y; // (B, T) int64
};

class TokenLoader {
 public:
  TokenLoader(
      const std::vector<std::string>& shard_paths,
      int64_t batch_size,
      int64_t seq_len,
      bool shuffle,
      uint64_t seed,
      int rank = 0,
      int world_size = 1);

  TokenBatch next();
  LoaderState state() const {
    return state_;
  }
  void restore(const LoaderState& s);
  uint64_t steps_per_epoch() const;
  int64_t batch_size() const {
    return B_;
  }
  // Serves `batch_size` rows per step from here on, the same windows in the
  // same order (the position is kept in windows). UserError when the
  // windows served so far are not a whole number of new batches.
  void set_batch_size(int64_t batch_size);

  // How many (T+1)-token windows these shards hold.
  static uint64_t count_windows(
      const std::vector<std::string>& shard_paths,
      int64_t seq_len);

 private:
  void start_epoch();
  std::vector<Shard> shards_;
  std::vector<std::pair<uint32_t, uint64_t>> windows_; // (shard, start)
  std::vector<uint64_t> order_;
  int64_t B_, T_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_;
  LoaderState state_;
  uint64_t order_epoch_ = UINT64_MAX;
};

struct ChatBatch {
  torch::Tensor x, y;      // (B, T) int64; padding uses pad_id
  torch::Tensor loss_mask; // (B, T) float: 1 where y is trained on
  torch::Tensor
      doc; // (B, T) int32: conversation index within the row, -1 on padding
};

class ChatBatcher {
 public:
  ChatBatcher(
      const ChatFile& file,
      int64_t batch_size,
      int64_t seq_len,
      bool pack,
      uint32_t pad_id,
      bool shuffle,
      uint64_t seed,
      int rank = 0,
      int world_size = 1);

  ChatBatch next();
  LoaderState state() const;
  void restore(const LoaderState& s);
  int64_t batch_size() const {
    return B_;
  }
  // Serves `batch_size` rows per step from here on. Rows are filled one
  // after another from the conversation cursor, so they are the same rows
  // in the same order; only an epoch's last, short step pads differently.
  void set_batch_size(int64_t batch_size);

 private:
  // Fills one row from the conversation cursor; returns false at epoch end.
  bool fill_row(int64_t row, ChatBatch& b, uint64_t& cursor);
  void ensure_order();
  const ChatFile& file_;
  int64_t B_, T_;
  bool pack_;
  uint32_t pad_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_;
  LoaderState state_;
  std::vector<uint64_t> order_;
  uint64_t order_epoch_ = UINT64_MAX;
  // The conversation cursor at the start of each step of this epoch, so a
  // restore can replay the packing from the beginning of the epoch.
  std::vector<uint64_t> step_cursor_;
};

} // namespace orchard::data
