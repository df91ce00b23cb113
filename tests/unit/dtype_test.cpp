// Dtype names and `auto`: one answer per device for every command that
// asks (training's autocast, a LoRA run's frozen base, a model loaded for
// generation), as ARCHITECTURE.md's table says.
#include "core/dtype.h"
#include "core/error.h"
#include "train/finetune.h"
#include "train/precision.h"

#include "test_util.h"

#include <gtest/gtest.h>

namespace orchard {
namespace {

using test::device_of;

TEST(Dtype, NamesRoundTrip) {
  for (const char* name : {"float32", "bfloat16", "float16"}) {
    auto t = parse_dtype(name, "dtype");
    ASSERT_TRUE(t.has_value()) << name;
    EXPECT_EQ(dtype_name(*t), name);
  }
  EXPECT_FALSE(parse_dtype("auto", "dtype").has_value());
  EXPECT_EQ(dtype_name(c10::ScalarType::Double), "float64");
  EXPECT_EQ(dtype_bytes(c10::ScalarType::BFloat16), 2);
  EXPECT_EQ(dtype_bytes(c10::ScalarType::Float), 4);
  try {
    parse_dtype("fp16", "--dtype");
    FAIL() << "fp16 is not a dtype name";
  } catch (const UserError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "--dtype fp16: expected auto, float32, bfloat16 or float16.");
  }
}

// Before 2026-11-23 a LoRA base and a model loaded for chat were bfloat16
// on MPS while training's autocast said float32 there (the documented
// default): two answers on one device.
TEST(Dtype, AutoHasOneAnswerPerDevice) {
  const std::vector<std::pair<DeviceInfo, c10::ScalarType>> cases = {
      {device_of("cuda", 90), c10::ScalarType::BFloat16},
      {device_of("cuda", 80), c10::ScalarType::BFloat16},
      {device_of("cuda", 0), c10::ScalarType::BFloat16}, // unknown: modern
      {device_of("cuda", 70), c10::ScalarType::Float},
      {device_of("mps"), c10::ScalarType::Float},
      {device_of("cpu"), c10::ScalarType::Float}};
  for (const auto& [device, want] : cases) {
    const std::string where =
        device.kind + " cc " + std::to_string(device.compute_capability);
    EXPECT_EQ(auto_dtype(device), want) << where;
    EXPECT_EQ(train::resolve_precision("auto", device).compute, want) << where;
    EXPECT_EQ(train::finetune_dtype(train::FinetuneConfig{}, device), want)
        << where;
  }
  // The opt-in on a Mac.
  train::FinetuneConfig bf16;
  bf16.bf16 = true;
  EXPECT_EQ(
      train::finetune_dtype(bf16, device_of("mps")), c10::ScalarType::BFloat16);
  EXPECT_NE(
      auto_dtype_reason(device_of("mps")).find("bf16=true"), std::string::npos);
}

} // namespace
} // namespace orchard
