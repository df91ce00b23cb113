// The generators' states saved in a checkpoint restore the same random
// numbers: the CPU's always, the GPU's on a CUDA machine.
#include "train/train_state.h"

#include <gtest/gtest.h>

namespace orchard::train {
namespace {

std::map<std::string, torch::Tensor> as_map(const runs::NamedTensors& t) {
  std::map<std::string, torch::Tensor> m;
  for (const auto& [k, v] : t)
    m[k] = v.clone();
  return m;
}

TEST(RngState, CpuGeneratorRestores) {
  torch::manual_seed(5);
  torch::rand({3});
  auto saved = as_map(rng_state(torch::kCPU));
  EXPECT_EQ(saved.count("rng.cpu"), 1u);
  EXPECT_EQ(saved.count("rng.cuda.0"), 0u);
  auto first = torch::rand({16});
  load_rng_state(saved, torch::kCPU);
  EXPECT_TRUE(torch::equal(torch::rand({16}), first));
}

TEST(RngState, CudaGeneratorRestores) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device";
  torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(6);
  torch::rand({3}, dev);
  auto saved = as_map(rng_state(dev));
  ASSERT_EQ(saved.count("rng.cuda.0"), 1u);
  auto first = torch::rand({1024}, dev).cpu();
  torch::rand({7}, dev); // move on
  load_rng_state(saved, dev);
  EXPECT_TRUE(torch::equal(torch::rand({1024}, dev).cpu(), first));
}

} // namespace
} // namespace orchard::train
