// dist/bucket_regions.h: ZeRO-1's regions of a bucket, against a layout
// worked out by hand.
#include "dist/bucket_regions.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

namespace orchard::dist::detail {
namespace {

std::vector<std::tuple<int64_t, int64_t, int64_t, int>> as_tuples(
    const std::vector<Segment>& segments) {
  std::vector<std::tuple<int64_t, int64_t, int64_t, int>> out;
  for (const auto& g : segments)
    out.emplace_back(g.begin, g.length, g.offset, g.owner);
  return out;
}

// Two ranks; A (10), B (6) and D (3) whole, C (7) not. Whole ones largest
// first to the least filled region: A to rank 0, B and then D to rank 1
// (10 / 9 filled). The region is max(10, ceil(26 / 2)) = 13; C fills rank
// 0's last 3 values and goes on in rank 1's last 4.
TEST(BucketRegions, WholeParametersStayInOneRegionAndTheRestFillsThem) {
  std::vector<int64_t> owned = {0, 0};
  const Regions r =
      lay_out_regions({{10, true}, {6, true}, {7, false}, {3, true}}, owned);
  EXPECT_EQ(r.region, 13);
  using T = std::tuple<int64_t, int64_t, int64_t, int>;
  EXPECT_EQ(as_tuples(r.segments[0]), (std::vector<T>{{0, 10, 0, 0}}));
  EXPECT_EQ(as_tuples(r.segments[1]), (std::vector<T>{{0, 6, 13, 1}}));
  EXPECT_EQ(
      as_tuples(r.segments[2]), (std::vector<T>{{0, 3, 10, 0}, {3, 4, 22, 1}}));
  EXPECT_EQ(as_tuples(r.segments[3]), (std::vector<T>{{0, 3, 19, 1}}));
  EXPECT_EQ(owned, (std::vector<int64_t>{13, 13}));

  // A tie between empty regions goes to the rank that owns least so far.
  owned = {20, 13};
  const Regions tie = lay_out_regions({{5, true}}, owned);
  EXPECT_EQ(tie.region, 5);
  EXPECT_EQ(as_tuples(tie.segments[0]), (std::vector<T>{{0, 5, 5, 1}}));
  EXPECT_EQ(owned, (std::vector<int64_t>{20, 18}));

  // A whole parameter larger than an even share sets the region: the
  // other ranks' regions are padding but for what else fits.
  owned = {0, 0, 0};
  const Regions big = lay_out_regions({{9, true}, {3, false}}, owned);
  EXPECT_EQ(big.region, 9);
  EXPECT_EQ(as_tuples(big.segments[1]), (std::vector<T>{{0, 3, 9, 1}}));
  EXPECT_EQ(owned, (std::vector<int64_t>{9, 3, 0}));

  // Aligned (the copy engines' shares: 64 values): 100 values over two
  // ranks make regions of 64, not 50; rank 0's is full, rank 1 has 36.
  owned = {0, 0};
  const Regions aligned = lay_out_regions({{100, false}}, owned, 64);
  EXPECT_EQ(aligned.region, 64);
  EXPECT_EQ(
      as_tuples(aligned.segments[0]),
      (std::vector<T>{{0, 64, 0, 0}, {64, 36, 64, 1}}));
  EXPECT_EQ(owned, (std::vector<int64_t>{64, 36}));
}

} // namespace
} // namespace orchard::dist::detail
