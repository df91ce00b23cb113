#include "train/low_precision_state.h"

namespace orchard::train {
namespace {

constexpr double kTiny = 1e-30; // an all-zero block divides by this

} // namespace

Quantized8 zero_quantized(
    int64_t n,
    bool is_signed,
    const torch::TensorOptions& options) {
  const int64_t padded = whole_blocks(n);
  return {
      torch::zeros({padded}, options.dtype(is_signed ? torch::kChar : torch::kByte)),
      torch::zeros({padded / kBlock}, options.dtype(torch::kFloat32))};
}

torch::Tensor dequantize8(
    const Quantized8& q,
    bool is_signed,
    int64_t from,
    int64_t len) {
  const int64_t padded = whole_blocks(len), blocks = padded / kBlock;
  auto c = q.codes.narrow(0, from, padded).to(torch::kFloat32).view({blocks, kBlock});
  auto scale = q.absmax.narrow(0, from / kBlock, blocks).unsqueeze(1);
  if (is_signed)
    return (c.abs().div_(127).pow_(4).mul_(c.sign()).mul_(scale)).view({-1});
  auto root = c.div_(255).pow_(4).mul_(scale);
  return root.mul_(root).view({-1});
}

void quantize8(
    Quantized8& q,
    bool is_signed,
    int64_t from,
    const torch::Tensor& x) {
  const int64_t blocks = x.numel() / kBlock;
  auto xb = x.view({blocks, kBlock});
  torch::Tensor code, scale;
  if (is_signed) {
    scale = xb.abs().amax(1);
    auto r = xb / scale.clamp_min(kTiny).unsqueeze(1);
    code = r.abs().pow_(0.25).mul_(127).round_().mul_(r.sign());
  } else {
    auto root = xb.clamp_min(0).sqrt_();
    scale = root.amax(1);
    code = root.div_(scale.clamp_min(kTiny).unsqueeze(1)).pow_(0.25).mul_(255).round_();
  }
  q.codes.narrow(0, from, x.numel()).copy_(code.view({-1}));
  q.absmax.narrow(0, from / kBlock, blocks).copy_(scale);
}

void stochastic_round_into(
    torch::Tensor out,
    const torch::Tensor& x,
    c10::optional<at::Generator> gen) {
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16, "stochastic rounding is for bfloat16");
  auto y = x.to(torch::kFloat32).contiguous().clone();
  auto bits = y.view(torch::kInt32);
  bits.add_(torch::randint(0, 1 << 16, y.sizes(), gen, y.options().dtype(torch::kInt32)));
  bits.bitwise_and_(int32_t(-65536)); // 0xFFFF0000: the upper 16 bits
  out.copy_(y.view_as(out)); // exact: the lower bits are zero
}

} // namespace orchard::train
