// Loaders: exact batches, rank splits, and resume = uninterrupted.
#include "data/loader.h"
#include "core/error.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <set>

namespace orchard::data {
namespace {

using test::TempDir;

// Shards holding 0, 1, 2, ... so every token says where it came from.
std::vector<std::string> counting_shards(
    const TempDir& dir,
    std::vector<size_t> sizes) {
  std::vector<std::string> paths;
  uint32_t next = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<uint32_t> t(sizes[s]);
    for (auto& v : t)
      v = next++;
    paths.push_back(dir.file("d_train_00000" + std::to_string(s) + ".bin"));
    write_shard(paths.back(), t, 70000);
  }
  return paths;
}

TEST(Loader, PermutationIsAPermutationAndSeeded) {
  auto p = permutation(1000, 7);
  std::set<uint64_t> seen(p.begin(), p.end());
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(*seen.rbegin(), 999u);
  EXPECT_EQ(p, permutation(1000, 7));
  EXPECT_NE(p, permutation(1000, 8));
}

TEST(Loader, SequentialBatchesAreConsecutiveWindows) {
  TempDir dir;
  TokenLoader loader(counting_shards(dir, {21, 11}), 2, 4, false, 0);
  // Shard 0 (21 tokens): windows start 0, 4, 8, 12, 16; shard 1 (ids 21..31):
  // starts 21, 25. Seven windows, 3 steps of 2 per epoch.
  EXPECT_EQ(loader.steps_per_epoch(), 3u);
  auto b = loader.next();
  EXPECT_TRUE(torch::equal(
      b.x, torch::tensor({{0, 1, 2, 3}, {4, 5, 6, 7}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(
      b.y, torch::tensor({{1, 2, 3, 4}, {5, 6, 7, 8}}, torch::kInt64)));
  loader.next();
  b = loader.next();
  EXPECT_TRUE(torch::equal(
      b.x, torch::tensor({{16, 17, 18, 19}, {21, 22, 23, 24}}, torch::kInt64)));
  b = loader.next(); // epoch 2 starts over
  EXPECT_EQ(loader.state(), (LoaderState{1, 1}));
  EXPECT_EQ(b.x[0][0].item<int64_t>(), 0);
}

TEST(Loader, RanksSeeDisjointWindows) {
  TempDir dir;
  auto paths = counting_shards(dir, {401});
  std::set<int64_t> starts;
  for (int rank = 0; rank < 2; ++rank) {
    TokenLoader loader(paths, 3, 8, true, 11, rank, 2);
    for (int s = 0; s < 8; ++s) {
      auto b = loader.next();
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(starts.insert(b.x[i][0].item<int64_t>()).second)
            << "window seen twice";
    }
  }
  EXPECT_EQ(starts.size(), 48u);
}

TEST(Loader, ResumeGivesTheSameBatchesAcrossEpochs) {
  TempDir dir;
  auto paths = counting_shards(dir, {300, 133});
  TokenLoader reference(paths, 2, 16, true, 42);
  std::vector<TokenBatch> want;
  for (int i = 0; i < 40; ++i) // several epochs (13 steps each)
    want.push_back(reference.next());
  for (int stop : {0, 1, 12, 13, 14, 27}) {
    TokenLoader first(paths, 2, 16, true, 42);
    for (int i = 0; i < stop; ++i)
      first.next();
    TokenLoader resumed(paths, 2, 16, true, 42);
    resumed.restore(first.state());
    for (int i = stop; i < 40; ++i)
      ASSERT_TRUE(torch::equal(resumed.next().x, want[i].x))
          << "stop " << stop << " step " << i;
  }
  // Epochs are shuffled differently.
  EXPECT_FALSE(torch::equal(want[0].x, want[13].x));
}

TEST(Loader, TooLittleDataIsAClearError) {
  TempDir dir;
  auto paths = counting_shards(dir, {10});
  EXPECT_THROW(TokenLoader(paths, 4, 8, false, 0), UserError);
  EXPECT_THROW(TokenLoader({}, 1, 8, false, 0), UserError);
  TokenLoader ok(paths, 1, 4, false, 0);
  EXPECT_THROW(ok.restore({0, 99}), UserError);
}

// Conversations of lengths 3, 5, 2, 6 with ids 100*c + position, and a mask
// of 1 on odd positions.
ChatFile chat_file(const TempDir& dir) {
  std::vector<Conversation> convs;
  int c = 0;
  for (int len : {3, 5, 2, 6}) {
    Conversation conv;
    for (int i = 0; i < len; ++i) {
      conv.ids.push_back(100 * c + i);
      conv.mask.push_back(i % 2);
    }
    convs.push_back(conv);
    ++c;
  }
  write_chat_file(dir.file("c.chat"), convs);
  return ChatFile::open(dir.file("c.chat"));
}

TEST(ChatBatcher, PaddingOneConversationPerRow) {
  TempDir dir;
  ChatFile f = chat_file(dir);
  ChatBatcher b(f, 2, 4, /*pack=*/false, /*pad=*/9999, false, 0);
  ChatBatch batch = b.next();
  EXPECT_TRUE(torch::equal(
      batch.x,
      torch::tensor(
          {{0, 1, 9999, 9999}, {100, 101, 102, 103}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(
      batch.y,
      torch::tensor(
          {{1, 2, 9999, 9999}, {101, 102, 103, 104}}, torch::kInt64)));
  // The mask belongs to the target token.
  EXPECT_TRUE(torch::equal(
      batch.loss_mask,
      torch::tensor({{1.f, 0.f, 0.f, 0.f}, {1.f, 0.f, 1.f, 0.f}})));
  EXPECT_TRUE(torch::equal(
      batch.doc, torch::tensor({{0, 0, -1, -1}, {0, 0, 0, 0}}, torch::kInt32)));
}

TEST(ChatBatcher, PackingFillsRowsWithWholeConversations) {
  TempDir dir;
  ChatFile f = chat_file(dir);
  ChatBatcher b(f, 1, 8, /*pack=*/true, 9999, false, 0);
  // Pairs: conv0 2, conv1 4, conv2 1 -> 7 of 8; conv3 (5 pairs) would not fit.
  ChatBatch batch = b.next();
  EXPECT_TRUE(torch::equal(
      batch.x,
      torch::tensor({{0, 1, 100, 101, 102, 103, 200, 9999}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(
      batch.doc, torch::tensor({{0, 0, 1, 1, 1, 1, 2, -1}}, torch::kInt32)));
  batch = b.next();
  EXPECT_EQ(batch.x[0][0].item<int64_t>(), 300);
}

// `n` conversations, the c-th of 2 + (c * step) % spread tokens with ids
// 1000 * c + position, all trained on.
ChatFile many_conversations(const TempDir& dir, int n, int step, int spread) {
  std::vector<Conversation> convs;
  for (int c = 0; c < n; ++c) {
    Conversation conv;
    for (int i = 0; i < 2 + (c * step) % spread; ++i) {
      conv.ids.push_back(1000 * c + i);
      conv.mask.push_back(1);
    }
    convs.push_back(conv);
  }
  write_chat_file(dir.file("many.chat"), convs);
  return ChatFile::open(dir.file("many.chat"));
}

TEST(ChatBatcher, ResumeReplaysPackingExactly) {
  TempDir dir;
  ChatFile f = many_conversations(dir, 37, 7, 11);
  ChatBatcher ref(f, 2, 16, true, 0, true, 5);
  std::vector<torch::Tensor> want;
  for (int i = 0; i < 30; ++i)
    want.push_back(ref.next().x);
  for (int stop : {1, 4, 9, 17}) {
    ChatBatcher first(f, 2, 16, true, 0, true, 5);
    for (int i = 0; i < stop; ++i)
      first.next();
    ChatBatcher resumed(f, 2, 16, true, 0, true, 5);
    resumed.restore(first.state());
    for (int i = stop; i < 30; ++i)
      ASSERT_TRUE(torch::equal(resumed.next().x, want[i]))
          << "stop " << stop << " step " << i;
  }
}

// After an out-of-memory error the Trainer halves the micro-batch: rows are
// filled one after another from the conversation cursor, so two steps of
// 2 rows are the one step of 4 they replace, and the state (with its cursor)
// restores to the same place whatever the batch size was. An older state
// without the cursor still replays.
TEST(ChatBatcher, SetBatchSizeServesTheSameRowsAndRestores) {
  TempDir dir;
  ChatFile f = many_conversations(dir, 40, 5, 9);
  ChatBatcher four(f, 4, 12, true, 0, true, 3);
  std::vector<torch::Tensor> rows; // 3 steps of 4 rows
  for (int i = 0; i < 3; ++i)
    rows.push_back(four.next().x);
  auto want = torch::cat(rows);
  ChatBatcher mixed(f, 4, 12, true, 0, true, 3);
  std::vector<torch::Tensor> got = {mixed.next().x};
  mixed.set_batch_size(2);
  EXPECT_EQ(mixed.batch_size(), 2);
  got.push_back(mixed.next().x);
  // Restored in a new loader of 2 rows from the state after 4 + 2 rows.
  ChatBatcher resumed(f, 2, 12, true, 0, true, 3);
  resumed.restore(nlohmann::json(mixed.state()).get<LoaderState>());
  for (int i = 0; i < 3; ++i)
    got.push_back(resumed.next().x);
  EXPECT_TRUE(torch::equal(torch::cat(got), want));
  // A state without the cursor (older checkpoints) replays by steps.
  LoaderState old = four.state();
  old.cursor.reset();
  ChatBatcher replayed(f, 4, 12, true, 0, true, 3);
  replayed.restore(old);
  EXPECT_TRUE(torch::equal(replayed.next().x, four.next().x));
  // A cursor past the data: the data changed since the checkpoint.
  LoaderState past = four.state();
  past.cursor = 41;
  EXPECT_THROW(replayed.restore(past), UserError);
}

} // namespace
} // namespace orchard::data

namespace orchard::data {
namespace {

// Halving the batch mid-epoch serves the same windows in the same order.
TEST(TokenLoader, SetBatchSizeKeepsTheWindowOrder) {
  test::TempDir dir;
  std::vector<uint32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = uint32_t(i % 1000);
  std::string path = dir.file("s.bin");
  write_shard(path, tokens, 1000);
  TokenLoader a({path}, 4, 16, true, 9), b({path}, 4, 16, true, 9);
  a.next();
  b.next();
  auto whole = a.next(); // rows 4..7 of the epoch
  b.set_batch_size(2);
  auto h1 = b.next(), h2 = b.next();
  EXPECT_TRUE(torch::equal(torch::cat({h1.x, h2.x}), whole.x));
  EXPECT_EQ(b.batch_size(), 2);
  EXPECT_EQ(b.state().step, 4u); // 8 windows in steps of 2
  TokenLoader c({path}, 4, 16, true, 9);
  c.next(); // 4 windows served: 3 does not divide them
  EXPECT_THROW(c.set_batch_size(3), UserError);
}

} // namespace
} // namespace orchard::data
