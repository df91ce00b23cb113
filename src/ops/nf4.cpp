#include "ops/nf4.h"

#include "core/error.h"
#include "ops/kernel_call.h"
#include "ops/nf4_levels.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

#include <torch/csrc/autograd/custom_function.h>

namespace orchard::ops {

const std::vector<float>& nf4_levels() {
  static const std::vector<float> levels = {ORCHARD_NF4_LEVELS};
  return levels;
}

int64_t Nf4Weight::bytes() const {
  return codes.numel() + absmax.numel() * int64_t(absmax.element_size());
}

Nf4Weight quantize_nf4(const torch::Tensor& w) {
  if (w.dim() != 2 || w.numel() % kNf4Block != 0)
    throw UserError(
        "4-bit quantisation needs a matrix whose size is a multiple of " +
        std::to_string(kNf4Block) + "; got shape " + c10::str(w.sizes()) + ".");
  torch::NoGradGuard no_grad;
  const auto dtype = w.scalar_type();
  // MPS: the codes are computed on the CPU (bucketize and uint8 arithmetic
  // are not on every PyTorch's MPS backend) and moved over; one matrix at a
  // time, so the host copy stays small. docs/apple-silicon.md lists it.
  const torch::Device where = w.device().is_mps() ? torch::kCPU : w.device();
  auto levels = torch::tensor(nf4_levels()).to(where);
  auto blocks = w.to(where).reshape({-1, kNf4Block}).to(torch::kFloat32);
  auto absmax = blocks.abs().amax(1, /*keepdim=*/true);
  auto scaled = blocks / absmax.clamp_min(1e-12);
  // The nearest level: bucketize against the midpoints between levels.
  auto mid = (levels.narrow(0, 0, 15) + levels.narrow(0, 1, 15)) / 2;
  auto idx = torch::bucketize(scaled, mid).to(torch::kUInt8).reshape({-1, 2});
  Nf4Weight q;
  q.codes =
      (idx.select(1, 0) * 16 + idx.select(1, 1)).contiguous().to(w.device());
  q.absmax = absmax.reshape({-1}).to(w.device(), dtype);
  auto byte = torch::arange(256, torch::kInt64);
  q.pairs = torch::stack(
                {levels.cpu().index_select(0, byte.div(16, "floor")),
                 levels.cpu().index_select(0, byte.remainder(16))},
                1)
                .to(w.device(), dtype);
  q.out = w.size(0);
  q.in = w.size(1);
  return q;
}

torch::Tensor dequantize_nf4(const Nf4Weight& q) {
  auto values = q.pairs.index_select(0, q.codes.to(torch::kInt32)); // (n/2, 2)
  return (values.view({-1, kNf4Block}) * q.absmax.view({-1, 1}))
      .view({q.out, q.in});
}

namespace {

struct Nf4Linear : torch::autograd::Function<Nf4Linear> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& x,
      const torch::Tensor& codes,
      const torch::Tensor& absmax,
      const torch::Tensor& pairs,
      int64_t out,
      int64_t in) {
    ctx->save_for_backward({codes, absmax, pairs});
    ctx->saved_data["out"] = out;
    ctx->saved_data["in"] = in;
    Nf4Weight q{codes, absmax, pairs, out, in};
    return at::mm(x, dequantize_nf4(q).t());
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    Nf4Weight q{
        saved[0],
        saved[1],
        saved[2],
        ctx->saved_data["out"].toInt(),
        ctx->saved_data["in"].toInt()};
    return {
        at::mm(grads[0], dequantize_nf4(q)),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

} // namespace

bool nf4_matvec_is_fused(const torch::Tensor& x, const Nf4Weight& q) {
#ifdef ORCHARD_CUDA_KERNELS
  return q.defined() && kernel::usable({x, q.absmax}) && x.dim() == 2 &&
      x.size(0) <= cuda::kNf4MaxRows && x.size(1) == q.in &&
      x.is_contiguous() &&
      // 16-byte loads of x and of the codes
      reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(q.codes.data_ptr()) % 16 == 0 &&
      q.in % kNf4Block == 0 && q.codes.device() == x.device() &&
      q.codes.scalar_type() == torch::kUInt8 && q.codes.is_contiguous() &&
      q.absmax.is_contiguous();
#else
  (void)x, (void)q;
  return false;
#endif
}

torch::Tensor nf4_linear(const torch::Tensor& x, const Nf4Weight& q) {
  if (!nf4_matvec_is_fused(x, q))
    return Nf4Linear::apply(x, q.codes, q.absmax, q.pairs, q.out, q.in);
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(x.device());
  auto y = torch::empty({x.size(0), q.out}, x.options());
  kernel::check(
      cuda::nf4_matvec(
          kernel::dtype_of(x),
          x.data_ptr(),
          q.codes.data_ptr<uint8_t>(),
          q.absmax.data_ptr(),
          y.data_ptr(),
          x.size(0),
          q.out,
          q.in,
          kernel::stream_of(x)),
      "nf4_linear");
  return y;
#else
  return Nf4Linear::apply(x, q.codes, q.absmax, q.pairs, q.out, q.in);
#endif
}

} // namespace orchard::ops
