// The decoding step's ops (ops/rotary_cache.h, ops/attention.h's
// decode_attention, ops/silu_mul.h, ops/rms_norm.h's add_rms_norm,
// ops/nf4.h's nf4_linear, ops/linear.h): each plain definition against a hand
// computation on the CPU, and each CUDA kernel against the plain
// definition or a float64 computation (skipped where the kernels are not
// built or there is no GPU).
#include "ops/attention.h"
#include "ops/kernel_call.h"
#include "ops/linear.h"
#include "ops/mean_of.h"
#include "ops/nf4.h"
#include "ops/op_test_util.h"
#include "ops/rms_norm.h"
#include "ops/rotary_cache.h"
#include "ops/silu_mul.h"

#include <gtest/gtest.h>

#ifdef ORCHARD_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace orchard {
namespace {

using torch::indexing::Slice;

const std::vector<torch::ScalarType> kDtypes = {
    torch::kFloat32,
    torch::kBFloat16,
    torch::kFloat16};

using test::max_diff;

using test::relative_error;
using test::ulp;

// Rope tables as Hugging Face builds them (cos, sin of position * inverse
// frequency, each half repeated), and Orchard's sign-folded sin.
struct Tables {
  torch::Tensor cos, sin_hf, sin_folded;
};
Tables tables(int64_t positions, int64_t D) {
  auto inv = 1.0 /
      torch::pow(10000.0, torch::arange(0, D, 2, torch::kFloat64) / double(D));
  auto f = torch::outer(torch::arange(positions, torch::kFloat64), inv);
  Tables t;
  t.cos = torch::cat({f.cos(), f.cos()}, -1);
  t.sin_hf = torch::cat({f.sin(), f.sin()}, -1);
  t.sin_folded = torch::cat({-f.sin(), f.sin()}, -1);
  return t;
}

TEST(DecodeOps, RotaryCacheWriteIsTransformersRotationAtEachRowsPosition) {
  torch::manual_seed(11);
  const int64_t B = 3, H = 4, Hkv = 2, D = 8, cap = 10;
  const auto t = tables(16, D);
  const auto q = torch::randn({B, H * D}, torch::kFloat64);
  const auto k = torch::randn({B, Hkv * D}, torch::kFloat64);
  const auto v = torch::randn({B, Hkv * D}, torch::kFloat64);
  const std::vector<int64_t> pos = {0, 7, 3};
  auto ck = torch::full({B + 1, Hkv, cap, D}, 5.0, torch::kFloat64);
  auto cv = ck.clone();
  const auto got = ops::rotary_cache_write(
      q, k, v, t.cos, t.sin_folded, torch::tensor(pos), ck, cv);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{B, H, 1, D}));
  // transformers: x * cos + rotate_half(x) * sin, rotate_half(x) =
  // cat(-x2, x1).
  auto rotate_half = [&](const torch::Tensor& x) {
    return torch::cat(
        {-x.narrow(-1, D / 2, D / 2), x.narrow(-1, 0, D / 2)}, -1);
  };
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = pos[size_t(b)];
    auto c = t.cos[p], s = t.sin_hf[p];
    auto qb = q[b].view({H, D}), kb = k[b].view({Hkv, D});
    EXPECT_LT(
        max_diff(got[b].view({H, D}), qb * c + rotate_half(qb) * s), 1e-12);
    EXPECT_LT(
        max_diff(ck[b].select(1, p), kb * c + rotate_half(kb) * s), 1e-12);
    EXPECT_TRUE(torch::equal(cv[b].select(1, p), v[b].view({Hkv, D})));
  }
  // Nothing else written: every other position (and the spare row) keeps
  // its 5.
  auto written = torch::zeros({B + 1, cap}, torch::kBool);
  for (int64_t b = 0; b < B; ++b)
    written[b][pos[size_t(b)]] = true;
  auto untouched = written.logical_not().view({B + 1, 1, cap, 1}).expand_as(ck);
  EXPECT_TRUE((ck.masked_select(untouched) == 5).all().item<bool>());
  EXPECT_TRUE((cv.masked_select(untouched) == 5).all().item<bool>());
}

TEST(DecodeOps, RotaryCacheKernelEqualsThePlainOps) {
  torch::NoGradGuard no_grad;
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(12);
  // Llama 3.2 3B's heads, and Qwen2.5 0.5B's with a batch.
  for (auto [B, H, Hkv, D] :
       std::vector<std::array<int64_t, 4>>{{1, 24, 8, 128}, {5, 14, 2, 64}}) {
    const int64_t cap = 40;
    const auto t = tables(64, D);
    for (auto dtype : kDtypes) {
      const auto opt = torch::TensorOptions().device(cuda).dtype(dtype);
      // q, k, v as views of one fused product, as decoding has them.
      const auto qkv = torch::randn({B, (H + 2 * Hkv) * D}, opt);
      auto parts = qkv.split_with_sizes({H * D, Hkv * D, Hkv * D}, 1);
      auto pos = torch::randint(0, cap, {B}, opt.dtype(torch::kInt64));
      const auto cos = t.cos.to(opt), sin = t.sin_folded.to(opt);
      auto ck = torch::randn({B + 2, Hkv, cap, D}, opt),
           cv = torch::randn_like(ck);
      auto rk = ck.clone(), rv = cv.clone();
      ASSERT_TRUE(ops::rotary_cache_write_is_fused(
          parts[0], parts[1], parts[2], cos, sin, pos, ck, cv));
      auto got = ops::rotary_cache_write(
          parts[0], parts[1], parts[2], cos, sin, pos, ck, cv);
      auto want = ops::rotary_cache_write_reference(
          parts[0], parts[1], parts[2], cos, sin, pos, rk, rv);
      // The same roundings in the same order: equal but for a product's
      // last place at most.
      const double tol = 2 * ulp(dtype) * 8;
      EXPECT_LT(max_diff(got, want), tol) << dtype << " H " << H;
      EXPECT_LT(max_diff(ck, rk), tol) << dtype << " H " << H;
      EXPECT_TRUE(torch::equal(cv, rv)) << dtype << " H " << H;
    }
  }
}

// float64 attention of row b over its keys [lo, pos[b]] (grouped heads).
torch::Tensor exact_attention(
    const torch::Tensor& q,
    const torch::Tensor& ck,
    const torch::Tensor& cv,
    const std::vector<int64_t>& pos,
    int64_t window) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t G = H / ck.size(1);
  auto y = torch::zeros({B, H * D}, torch::kFloat64);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = pos[size_t(b)];
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    for (int64_t h = 0; h < H; ++h) {
      auto k = ck[b][h / G]
                   .narrow(0, lo, p - lo + 1)
                   .to(torch::kCPU, torch::kFloat64);
      auto v = cv[b][h / G]
                   .narrow(0, lo, p - lo + 1)
                   .to(torch::kCPU, torch::kFloat64);
      auto qq = q[b][h][0].to(torch::kCPU, torch::kFloat64);
      auto w = torch::softmax(k.matmul(qq) / std::sqrt(double(D)), 0);
      y[b].narrow(0, h * D, D).copy_(w.matmul(v));
    }
  }
  return y;
}

TEST(DecodeOps, DecodeAttentionKernelIsExactAttentionOverTheFilledKeys) {
  torch::NoGradGuard no_grad;
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(13);
  struct Case {
    int64_t H, Hkv, D, cap, key_len, window;
    std::vector<int64_t> pos;
  };
  const std::vector<Case> cases = {
      {24, 8, 128, 512, 384, 0, {300}},        // 3B, several chunks
      {14, 2, 64, 256, 256, 0, {0, 70, 200}},  // 0.5B, a batch
      {8, 8, 32, 200, 130, 50, {129, 10, 64}}, // no grouping, a window
      {16, 2, 256, 64, 64, 0, {63, 1}},        // one chunk
      {6, 3, 96, 300, 300, 7, {299, 150}}};    // D = 96, window
  for (const auto& c : cases) {
    const int64_t B = int64_t(c.pos.size());
    for (auto dtype : kDtypes) {
      const auto opt = torch::TensorOptions().device(cuda).dtype(dtype);
      auto q = torch::randn({B, c.H, 1, c.D}, opt);
      auto ck = (torch::randn({B, c.Hkv, c.cap, c.D}, opt) * 2).to(dtype);
      auto cv = torch::randn({B, c.Hkv, c.cap, c.D}, opt);
      // Past each row's position the cache holds NaN: read, it would
      // poison the row (0 * NaN is NaN).
      for (int64_t b = 0; b < B; ++b) {
        ck[b]
            .narrow(1, c.pos[size_t(b)] + 1, c.cap - c.pos[size_t(b)] - 1)
            .fill_(std::nan(""));
        cv[b]
            .narrow(1, c.pos[size_t(b)] + 1, c.cap - c.pos[size_t(b)] - 1)
            .fill_(std::nan(""));
      }
      auto pos = torch::tensor(c.pos, opt.dtype(torch::kInt64));
      ASSERT_TRUE(ops::decode_attention_is_fused(q, ck, cv, pos));
      auto got = ops::decode_attention(q, ck, cv, pos, c.key_len, c.window);
      ASSERT_EQ(got.scalar_type(), dtype);
      ASSERT_TRUE(torch::isfinite(got).all().item<bool>())
          << dtype << " H " << c.H << " D " << c.D;
      auto want = exact_attention(q, ck, cv, c.pos, c.window);
      // float32 throughout, one rounding at the end: within a few units in
      // the last place of the output's dtype.
      const double tol = dtype == torch::kFloat32 ? 1e-5 : 4 * ulp(dtype);
      EXPECT_LT(relative_error(got, want), tol)
          << dtype << " H " << c.H << " D " << c.D << " window " << c.window;
      // And as close as the plain ops (which round the probabilities) on
      // a cache without NaN.
      if (c.window == 0) {
        auto clean_k = torch::nan_to_num(ck, 0),
             clean_v = torch::nan_to_num(cv, 0);
        auto plain = ops::decode_attention_reference(
            q, clean_k, clean_v, pos, c.key_len, c.window);
        EXPECT_LT(relative_error(got, plain), 2 * tol + 4 * ulp(dtype))
            << dtype << " H " << c.H;
      }
    }
  }
}

TEST(DecodeOps, SiluMulKernelEqualsThePlainOps) {
  torch::NoGradGuard no_grad;
  auto g = torch::randn({3, 10}, torch::kFloat64),
       u = torch::randn({3, 10}, torch::kFloat64);
  EXPECT_LT(max_diff(ops::silu_mul(g, u), g / (1 + torch::exp(-g)) * u), 1e-12);
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(14);
  for (auto dtype : kDtypes)
    for (int64_t B : {1, 7}) {
      // gate and up as the two halves of one product.
      auto gu =
          (torch::randn(
               {B, 2 * 8192 + 2 * 3}, torch::TensorOptions().device(cuda)) *
           4)
              .to(dtype);
      auto parts = gu.split(8192 + 3, 1);
      ASSERT_TRUE(ops::silu_mul_is_fused(parts[0], parts[1]));
      auto got = ops::silu_mul(parts[0], parts[1]);
      auto want = ops::silu_mul_reference(parts[0], parts[1]);
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LT(relative_error(got, want), 2 * ulp(dtype)) << dtype;
      EXPECT_LT(
          (got - want).abs().max().item<double>() /
              (want.abs().max().item<double>() + 1e-30),
          4 * ulp(dtype))
          << dtype;
    }
}

TEST(DecodeOps, AddRmsNormIsTheSumThenTheNorm) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 1, 48}, torch::kFloat64);
  auto r = torch::randn({2, 1, 48}, torch::kFloat64);
  auto w = torch::randn({48}, torch::kFloat64);
  auto [s, y] = ops::add_rms_norm(x, r, w, 1e-5);
  EXPECT_TRUE(torch::equal(s, x + r));
  EXPECT_TRUE(torch::equal(y, ops::rms_norm(x + r, w, 1e-5)));
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(15);
  for (auto dtype : kDtypes)
    for (auto shape :
         std::vector<std::vector<int64_t>>{{1, 1, 3072}, {8, 1, 896}, {3, 5}}) {
      const auto opt = torch::TensorOptions().device(cuda);
      auto xc = (torch::randn(shape, opt) * 3).to(dtype);
      auto rc = torch::randn(shape, opt).to(dtype);
      auto wc = (torch::randn({shape.back()}, opt) + 1).to(dtype);
      auto [sum, normed] = ops::add_rms_norm(xc, rc, wc, 1e-6);
      // The sum is one rounding of x + r: exactly PyTorch's.
      EXPECT_TRUE(torch::equal(sum, xc + rc)) << dtype;
      auto want = ops::rms_norm_reference(xc + rc, wc, 1e-6);
      EXPECT_LT(
          relative_error(normed, want), dtype == torch::kFloat32 ? 1e-6 : 4e-3)
          << dtype;
    }
}

TEST(DecodeOps, Nf4KernelEqualsTheExpandedMatrixProduct) {
  torch::NoGradGuard no_grad;
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(16);
  for (auto dtype : {torch::kBFloat16, torch::kFloat16, torch::kFloat32})
    for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{
             {96, 256}, {5120, 3072}, {33, 64 * 9}}) {
      const auto opt = torch::TensorOptions().device(cuda).dtype(dtype);
      auto q = ops::quantize_nf4(torch::randn({out, in}, opt) * 0.02);
      auto w = ops::dequantize_nf4(q).to(torch::kFloat64);
      for (int64_t N : {1, 3, 8, 9}) {
        auto x = torch::randn({N, in}, opt);
        EXPECT_EQ(ops::nf4_matvec_is_fused(x, q), N <= 8);
        auto got = ops::nf4_linear(x, q);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{N, out}));
        ASSERT_EQ(got.scalar_type(), dtype);
        // Against the same expanded matrix in float64: sums in float32,
        // one rounding at the end.
        auto want = x.to(torch::kFloat64).matmul(w.t());
        const double tol = dtype == torch::kFloat32 ? 1e-5 : 2 * ulp(dtype);
        EXPECT_LT(relative_error(got, want), tol)
            << dtype << " " << out << "x" << in << " N " << N;
      }
    }
}

TEST(DecodeOps, MatvecKernelIsTheMatrixProduct) {
  torch::NoGradGuard no_grad;
  {
    auto x = torch::randn({3, 16}, torch::kFloat64);
    auto w = torch::randn({5, 16}, torch::kFloat64);
    auto b = torch::randn({5}, torch::kFloat64);
    EXPECT_LT(max_diff(ops::linear(x, w, b), x.matmul(w.t()) + b), 1e-12);
    EXPECT_LT(max_diff(ops::linear(x, w), x.matmul(w.t())), 1e-12);
  }
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(17);
  // Llama 3.2 3B's qkv and down (two and four warps a row), Qwen2.5
  // 0.5B's qkv (with its bias), a width that is not a multiple of the
  // warp's stride, and a few long rows split in 4 (bf16) or 8 (float32)
  // warps whose last block has rows past the end.
  for (auto [out, in, with_bias] :
       std::vector<std::tuple<int64_t, int64_t, bool>>{
           {5120, 3072, false},
           {3072, 8192, false},
           {1152, 896, true},
           {37, 40, true},
           {37, 4096, true}})
    for (auto dtype : kDtypes)
      for (int64_t N : {1, 3, 8, 9}) {
        const auto opt = torch::TensorOptions().device(cuda).dtype(dtype);
        auto x = torch::randn({N, in}, opt);
        auto w = (torch::randn({out, in}, opt) * 0.05).to(dtype);
        auto b = with_bias ? torch::randn({out}, opt) : torch::Tensor();
        EXPECT_EQ(
            ops::linear_is_matvec(x, w, b),
            N == 1 && in % (16 / x.element_size()) == 0)
            << dtype << " " << out << "x" << in;
        auto got = ops::linear(x, w, b);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{N, out}));
        auto want = x.to(torch::kFloat64).matmul(w.to(torch::kFloat64).t());
        if (with_bias)
          want = want + b.to(torch::kFloat64);
        const double tol = dtype == torch::kFloat32 ? 1e-5 : 2 * ulp(dtype);
        EXPECT_LT(relative_error(got, want), tol)
            << dtype << " " << out << "x" << in << " N " << N;
      }
}

// SwiGLU's product with its activation in the kernel: the numbers of the
// product's two halves then silu_mul, bit for bit where the kernel splits
// the rows as the plain product does, and float64's up to rounding.
TEST(DecodeOps, MatvecSiluMulIsTheProductThenTheActivation) {
  torch::NoGradGuard no_grad;
  {
    auto x = torch::randn({3, 16}, torch::kFloat64);
    auto w = torch::randn({10, 16}, torch::kFloat64);
    auto b = torch::randn({10}, torch::kFloat64);
    auto gu = x.matmul(w.t()) + b;
    auto g = gu.narrow(1, 0, 5), u = gu.narrow(1, 5, 5);
    EXPECT_LT(
        max_diff(ops::linear_silu_mul(x, w, b), g / (1 + torch::exp(-g)) * u),
        1e-12);
    EXPECT_THROW(
        ops::linear_silu_mul(x, torch::randn({9, 16}, torch::kFloat64)),
        c10::Error);
  }
  REQUIRE_KERNELS(cuda);
  torch::manual_seed(19);
  // Llama 3.2 3B's gate/up (one warp a row), Qwen2.5 0.5B's, a small one
  // with a bias and a last block past the end, and few long rows (the
  // plain product splits them in 8 warps, the gated kernel in 4: the same
  // numbers only up to the order of the sums).
  for (auto [half, in, with_bias, same_split] :
       std::vector<std::tuple<int64_t, int64_t, bool, bool>>{
           {8192, 3072, false, true},
           {4864, 896, false, true},
           {37, 40, true, true},
           {5, 8192, true, false}})
    for (auto dtype : kDtypes)
      for (int64_t N : {1, 3}) {
        const auto opt = torch::TensorOptions().device(cuda).dtype(dtype);
        auto x = torch::randn({N, in}, opt);
        auto w = (torch::randn({2 * half, in}, opt) * 0.1).to(dtype);
        auto b = with_bias ? torch::randn({2 * half}, opt) : torch::Tensor();
        auto got = ops::linear_silu_mul(x, w, b);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{N, half}));
        ASSERT_EQ(got.scalar_type(), dtype);
        auto gu = ops::linear(x, w, b);
        auto unfused =
            ops::silu_mul(gu.narrow(1, 0, half), gu.narrow(1, half, half));
        if (same_split)
          EXPECT_TRUE(torch::equal(got, unfused))
              << dtype << " " << half << "x" << in << " N " << N;
        auto gu64 = x.to(torch::kFloat64).matmul(w.to(torch::kFloat64).t());
        if (with_bias)
          gu64 = gu64 + b.to(torch::kFloat64);
        auto g = gu64.narrow(1, 0, half), u = gu64.narrow(1, half, half);
        auto want = g / (1 + torch::exp(-g)) * u;
        const double tol = dtype == torch::kFloat32 ? 1e-5 : 6 * ulp(dtype);
        EXPECT_LT(relative_error(got, want), tol)
            << dtype << " " << half << "x" << in << " N " << N;
      }
}

// The decoding kernels start before the kernel ahead of them has ended
// (programmatic dependent launch, compute capability 9.0+). Each must
// still read its inputs only after that kernel's writes: a chain where
// each op consumes the one before gives the same bits as the same chain
// with the device synchronised between the ops (no overlap at all).
TEST(DecodeOps, KernelsStartedEarlyReadTheResultsOfTheKernelsBefore) {
  torch::NoGradGuard no_grad;
  REQUIRE_KERNELS(cuda);
#ifdef ORCHARD_CUDA_KERNELS
  const char* pdl = std::getenv("ORCHARD_PDL");
  const bool wanted = !(pdl && std::strcmp(pdl, "0") == 0);
  if (wanted && at::cuda::getCurrentDeviceProperties()->major >= 9)
    EXPECT_TRUE(ops::kernel::launches_early())
        << "a compute capability 9.0 device, but the kernels launch plainly";
#endif
  torch::manual_seed(18);
  const auto opt = torch::TensorOptions().device(cuda).dtype(torch::kBFloat16);
  const int64_t C = 2048, F = 5632;
  auto w_norm = torch::randn({C}, opt) * 0.1 + 1;
  auto w_up = torch::randn({2 * F, C}, opt) * 0.03;
  auto w_down = torch::randn({C, F}, opt) * 0.02;
  auto x0 = torch::randn({1, C}, opt);
  auto chain = [&](bool synchronise) {
    auto sync = [&] {
      if (synchronise)
        torch::cuda::synchronize();
    };
    auto h = x0.clone(), pending = torch::zeros_like(x0);
    for (int layer = 0; layer < 24; ++layer) {
      auto [sum, normed] = ops::add_rms_norm(h, pending, w_norm, 1e-6);
      sync();
      auto act = ops::linear_silu_mul(normed.view({1, C}), w_up);
      h = sum;
      sync();
      pending = ops::linear(act, w_down);
      sync();
    }
    return (h + pending).cpu();
  };
  const auto plain = chain(true);
  for (int run = 0; run < 3; ++run)
    EXPECT_TRUE(torch::equal(chain(false), plain)) << "run " << run;
}

// dist/copy_engine_mean.cpp's sum of a bucket's share: the parts summed in
// order and scaled once, the kernel's bits those of the plain ops (float32
// sums in the same order), out one of the parts or not; and the sum of the
// squares of the mean (the gradient norm's part) against float64, the same
// bits every time.
TEST(DecodeOps, MeanOfIsThePartsSummedInOrder) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(21);
  auto a = torch::randn({1000}), b = torch::randn({1000}),
       c = torch::randn({1000});
  auto want =
      (a.to(torch::kFloat64) + b.to(torch::kFloat64) + c.to(torch::kFloat64)) /
      3;
  torch::Tensor out = torch::empty({1000}), squares;
  ops::mean_of(out, {a, b, c}, &squares);
  EXPECT_LT(max_diff(out.to(torch::kFloat64), want), 1e-6);
  ASSERT_EQ(squares.numel(), 1);
  const double want_squares = want.square().sum().item<double>();
  EXPECT_NEAR(squares.item<double>(), want_squares, 1e-5 * want_squares);
  EXPECT_THROW(ops::mean_of(out, {a, torch::randn({999})}), c10::Error);
  torch::Tensor none = torch::empty({0}), no_squares;
  ops::mean_of(none, {torch::empty({0}), torch::empty({0})}, &no_squares);
  EXPECT_EQ(no_squares.item<double>(), 0.0); // an empty share adds nothing
  REQUIRE_KERNELS(cuda);
  for (int n : {1, 2, 3, 8})
    for (int64_t count : {int64_t(4), int64_t(1) << 22, int64_t(262148)}) {
      std::vector<torch::Tensor> parts;
      for (int k = 0; k < n; ++k)
        parts.push_back(
            torch::randn({count}, torch::TensorOptions().device(cuda)));
      auto expected = ops::mean_of_reference(parts);
      torch::Tensor into = torch::empty_like(parts[0]);
      ops::mean_of(into, parts);
      EXPECT_TRUE(torch::equal(into, expected)) << n << " parts of " << count;
      const double want_sq =
          expected.to(torch::kFloat64).square().sum().item<double>();
      torch::Tensor sq, again;
      ops::mean_of(into, parts, &sq);
      EXPECT_TRUE(torch::equal(into, expected)) << n << " with the squares";
      EXPECT_EQ(sq.device(), into.device());
      EXPECT_NEAR(sq.item<double>(), want_sq, 1e-5 * want_sq + 1e-12)
          << n << " parts of " << count;
      ops::mean_of(into, parts, &again);
      EXPECT_TRUE(torch::equal(sq, again)) << "the squares' bits, " << n;
      ops::mean_of(parts[0], parts); // in place, as the averager's share
      EXPECT_TRUE(torch::equal(parts[0], expected)) << n << " in place";
    }
}

} // namespace
} // namespace orchard
