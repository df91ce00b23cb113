// ops/embedding: the lookup and its backward are torch::nn::Embedding's
// where no sink gathers rows; embedding_rows_gradient (what every process
// makes from the gathered rows) is the sum of each id's rows, checked in
// float64, and on CUDA the same bits every time, whatever the ids'
// repetitions (one id filling many of the kernel's chunks, ids across a
// chunk's edge, a count of rows that is not a whole number of chunks).
#include "ops/embedding.h"

#include "core/gradient_sink.h"
#include "ops/op_test_util.h"

#include <gtest/gtest.h>

namespace orchard::ops {
namespace {

// Rows' ids with one id a third of them, runs of a few, and the rest
// spread over the vocabulary.
torch::Tensor skewed_ids(int64_t n, int64_t vocabulary) {
  auto ids = torch::randint(vocabulary, {n}, torch::kInt64);
  auto hot = torch::rand({n}) < 0.33;
  ids.masked_fill_(hot, 7);
  ids.narrow(0, 0, std::min<int64_t>(n, 150)).fill_(vocabulary - 1);
  return ids;
}

// sum over j with ids[j] == v of rows[j], in float64 on the CPU.
torch::Tensor sum_of_rows(
    const torch::Tensor& rows,
    const torch::Tensor& ids,
    int64_t vocabulary) {
  auto out = torch::zeros({vocabulary, rows.size(1)}, torch::kFloat64);
  out.index_add_(0, ids.cpu(), rows.to(torch::kCPU, torch::kFloat64));
  return out;
}

TEST(Embedding, LookupAndGradientAreTorchsEmbeddings) {
  torch::manual_seed(1);
  auto w = torch::randn({50, 8}, torch::requires_grad());
  auto w2 = w.detach().clone().requires_grad_(true);
  auto ids = torch::randint(50, {3, 11}, torch::kInt64);
  auto dy = torch::randn({3, 11, 8});
  auto y = ops::embedding(w, ids);
  auto y2 = torch::nn::functional::embedding(ids, w2);
  EXPECT_TRUE(torch::equal(y, y2));
  (y * dy).sum().backward();
  (y2 * dy).sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), w2.grad()));
}

// A sink that gathers: its gradient is what the backward returns.
struct GatheringSink final : GradientSink {
  std::intptr_t key = 0;
  int64_t rows_seen = 0;
  torch::Tensor destination(std::intptr_t) override {
    return {};
  }
  torch::Tensor gathered_gradient(
      std::intptr_t k,
      const torch::Tensor& rows,
      const torch::Tensor& ids,
      int64_t num_rows,
      RowsSum& sum) override {
    if (k != key || !sum.same_bits(rows))
      return {};
    rows_seen = rows.size(0);
    // "Two processes" with the same rows: twice the rows, the mean.
    sum.prepare(torch::cat({ids, ids}), num_rows, rows);
    return sum.sum(torch::cat({rows, rows}), 0.5);
  }
};

TEST(Embedding, TheSinksGatheredGradientIsTheWeights) {
  torch::manual_seed(2);
  auto w = torch::randn({40, 6}, torch::requires_grad());
  auto ids = torch::randint(40, {2, 9}, torch::kInt64);
  auto dy = torch::randn({2, 9, 6});
  GatheringSink sink;
  sink.key = weight_key(w);
  set_gradient_sink(&sink);
  (ops::embedding(w, ids) * dy).sum().backward();
  set_gradient_sink(nullptr);
  EXPECT_EQ(sink.rows_seen, 18);
  EXPECT_LT(
      test::max_diff(
          w.grad(), sum_of_rows(dy.reshape({-1, 6}), ids.reshape({-1}), 40)),
      1e-5);
}

// What the gradient averager asks before it gathers: the CPU's sum, and
// CUDA's with the kernels, give the same bits every time.
TEST(Embedding, RowsSumSaysWhereItMakesTheSameBits) {
  EXPECT_TRUE(EmbeddingRowsSum().same_bits(torch::zeros({2, 3})));
  if (const auto cuda = test::kernel_device())
    EXPECT_TRUE(EmbeddingRowsSum().same_bits(torch::zeros({2, 3}, *cuda)));
}

TEST(Embedding, RowsGradientIsEachIdsSumOfRows) {
  torch::manual_seed(3);
  for (int64_t n : {1, 64, 1000}) {
    auto rows = torch::randn({n, 12});
    auto ids = skewed_ids(n, 30);
    EXPECT_LT(
        test::max_diff(
            embedding_rows_gradient(rows, ids, 30, 0.25),
            sum_of_rows(rows, ids, 30) * 0.25),
        1e-4)
        << n << " rows";
  }
}

TEST(Embedding, RowsGradientKernelIsTheSumAndTheSameBitsEveryTime) {
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(4);
  // Counts around the kernels' chunk of 64 sorted ids, and a GPT step's.
  for (int64_t n : {1, 63, 64, 65, 4099, 32768}) {
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const int64_t V = n > 1000 ? 5000 : 97, D = n > 1000 ? 768 : 40;
      auto rows = torch::randn({n, D}).to(cuda, dtype);
      auto ids = skewed_ids(n, V).to(cuda);
      const auto got = embedding_rows_gradient(rows, ids, V, 0.5);
      ASSERT_EQ(got.scalar_type(), dtype);
      const auto want = sum_of_rows(rows, ids, V) * 0.5;
      // float32 sums of up to a third of n rows, rounded once to the dtype.
      EXPECT_LT(
          test::relative_error(got, want),
          dtype == torch::kFloat32 ? 1e-5 : test::ulp(dtype))
          << n << " rows, " << dtype;
      for (int k = 0; k < 3; ++k)
        EXPECT_TRUE(
            torch::equal(embedding_rows_gradient(rows, ids, V, 0.5), got))
            << n << " rows, " << dtype << ", run " << k;
    }
  }
}

} // namespace
} // namespace orchard::ops
