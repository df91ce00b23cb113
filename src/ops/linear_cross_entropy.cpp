#include "ops/linear_cross_entropy.h"

#include "core/dtype.h"
#include "core/gradient_sink.h"
#include "core/torch_compat.h"
#include "ops/kernel_call.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace orchard::ops {
namespace {

// Whether the chunks go through the CUDA kernel (cuda::
// softcap_cross_entropy): h on a CUDA device in a dtype other than
// float64, the kernels built.
bool kernel_takes(const torch::Tensor& h, const torch::Tensor& targets) {
#ifdef ORCHARD_CUDA_KERNELS
  return h.is_cuda() && h.scalar_type() != torch::kFloat64 &&
      targets.device() == h.device() &&
      targets.scalar_type() == torch::kLong &&
      kernel::usable({h.detach()});
#else
  (void)h, (void)targets;
  return false;
#endif
}

// Rows of the padded head on the kernel path: the vocabulary rounded up to
// a multiple of 128, so that the products' leading dimensions are aligned
// (cuBLAS's bfloat16 kernels lose about a third of a GPT-2-sized step on
// 50,257 rows against 50,304).
constexpr int64_t kPadRows = 128;

// One chunk's summed loss over the first V of z's columns (z: (n, ld),
// contiguous), and with `grad` its gradient with respect to z written over
// those columns (the rest are left as they are), by one kernel.
torch::Tensor chunk_loss_by_kernel(
    torch::Tensor& z,
    const torch::Tensor& targets,
    int64_t V,
    double softcap,
    bool grad) {
#ifdef ORCHARD_CUDA_KERNELS
  const c10::cuda::CUDAGuard on_device(z.device());
  auto t = targets.contiguous();
  auto rows = torch::empty({z.size(0)}, z.options().dtype(torch::kFloat32));
  kernel::check(
      cuda::softcap_cross_entropy(
          kernel::dtype_of(z),
          z.data_ptr(),
          t.data_ptr<int64_t>(),
          rows.data_ptr<float>(),
          z.size(0),
          V,
          z.size(1),
          float(softcap),
          grad,
          kernel::stream_of(z)),
      "softcap_cross_entropy");
  return rows.sum();
#else
  (void)z, (void)targets, (void)V, (void)softcap, (void)grad;
  throw std::logic_error("softcap_cross_entropy: built without the kernels");
#endif
}

// The forward keeps dL/dh and dL/dW; the backward only scales them by the
// incoming gradient.
struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& h,
      const torch::Tensor& w,
      const torch::Tensor& targets,
      int64_t chunk,
      double softcap,
      bool grad_mode) {
    // The forward runs with gradients off: whether the caller's mode wants
    // them comes as grad_mode.
    const int64_t rows = h.size(0);
    const bool need_h = grad_mode && h.requires_grad(),
               need_w = grad_mode && w.requires_grad();
    ctx->saved_data["weight_key"] = int64_t(weight_key(w)); // for the sink
    torch::Tensor dh = need_h ? torch::empty_like(h) : torch::Tensor();
    // In the head's own dtype (float32 master weights): what its .grad
    // holds.
    // (The kernel path makes it with the padded rows, below.)
    const bool by_kernel = kernel_takes(h, targets);
    torch::Tensor dw =
        need_w && !by_kernel ? torch::zeros_like(w) : torch::Tensor();
    const auto acc = loss_arithmetic(h.scalar_type());
    auto total = torch::zeros({}, h.options().dtype(acc));
    if (by_kernel) {
      // The products in autocast's dtype (else the inputs' common one),
      // the head cast once and padded with zero rows: their logits are 0
      // and the kernel leaves them out of the softmax, their gradient
      // rows are 0 and dropped.
      auto dtype = compat::autocast_dtype(torch::kCUDA);
      if (dtype == torch::kFloat32)
        dtype = c10::promoteTypes(h.scalar_type(), w.scalar_type());
      const int64_t V = w.size(0),
                    padded = (V + kPadRows - 1) / kPadRows * kPadRows;
      auto wm = w.to(dtype);
      if (padded != V)
        wm = at::constant_pad_nd(wm, {0, 0, 0, padded - V});
      // The head's gradient summed with the padded rows too (theirs is 0):
      // a product of the padded height, which cuBLAS runs at full rate
      // (50,257 rows took a slower kernel: 3.0 against 1.7 ms a d12 step).
      if (need_w)
        dw = torch::zeros({padded, w.size(1)}, w.options());
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t n = std::min(chunk, rows - r0);
        auto hc = h.narrow(0, r0, n).to(dtype);
        auto z = at::mm(hc, wm.t()); // (n, padded)
        total.add_(chunk_loss_by_kernel(
            z, targets.narrow(0, r0, n), V, softcap, need_h || need_w));
        // z now holds the gradient (zero in the padded columns).
        if (need_h)
          dh.narrow(0, r0, n).copy_(at::mm(z, wm));
        // The head's gradient summed in float32 by the product itself
        // where libtorch can (no 16-bit copy added in a pass of its own:
        // 0.56 ms a d12 step on an H200).
        if (need_w && !compat::add_product_float32(dw, z.t(), hc))
          dw.add_(at::mm(z.t(), hc));
      }
      if (need_w && padded != V)
        dw = dw.narrow(0, 0, V);
      ctx->save_for_backward({dh, dw});
      return total;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      auto hc = h.narrow(0, r0, n);
      auto t = targets.narrow(0, r0, n);
      auto z = at::mm(hc, w.t()).to(acc); // (n, V)
      torch::Tensor tanh; // t = tanh(z / cap), kept for the gradient
      if (softcap > 0) {
        tanh = z.div_(softcap).tanh_();
        z = tanh.mul(softcap);
      }
      auto lse = z.logsumexp(-1, /*keepdim=*/true); // (n, 1)
      auto valid = t.ne(-1).unsqueeze(1);
      auto tc = t.clamp_min(0).unsqueeze(1);
      total.add_(((lse - z.gather(1, tc)) * valid).sum());
      if (!need_h && !need_w)
        continue;
      auto d = z.sub_(lse).exp_(); // softmax, in the logits' memory
      d.scatter_add_(1, tc, torch::full_like(lse, -1));
      d.mul_(valid);
      if (softcap > 0)
        d.mul_(1 - tanh.square_()); // d tanh(u) / du = 1 - tanh(u)^2
      if (need_h)
        dh.narrow(0, r0, n).copy_(at::mm(d.to(w.scalar_type()), w));
      if (need_w)
        dw.add_(at::mm(d.t(), hc.to(d.scalar_type())));
    }
    ctx->save_for_backward({dh, dw});
    return total;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto scaled = [&](const torch::Tensor& d) {
      return d.defined() ? d * grads[0].to(d.scalar_type()) : torch::Tensor();
    };
    // The head's gradient scaled straight into the gradient averager's
    // bucket where it hands one out (core/gradient_sink.h).
    torch::Tensor dw;
    if (saved[1].defined()) {
      dw = gradient_destination(
          std::intptr_t(ctx->saved_data["weight_key"].toInt()),
          saved[1].sizes(),
          saved[1].scalar_type());
      if (dw.defined())
        at::mul_out(dw, saved[1], grads[0].to(saved[1].scalar_type()));
      else
        dw = scaled(saved[1]);
    }
    return {
        scaled(saved[0]),
        dw,
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

} // namespace

int64_t default_chunk_rows(c10::DeviceType device, int64_t vocab) {
  constexpr int64_t kCpuLogits = int64_t(1) << 20,
                    kGpuLogits = int64_t(1) << 24,
                    kCudaLogits = int64_t(1) << 28;
  const int64_t logits = device == c10::DeviceType::CPU ? kCpuLogits
      : device == c10::DeviceType::CUDA                 ? kCudaLogits
                                                        : kGpuLogits;
  return std::max<int64_t>(1, logits / std::max<int64_t>(1, vocab));
}

torch::Tensor linear_cross_entropy(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    int64_t chunk,
    double softcap) {
  TORCH_CHECK(softcap >= 0, "[linear_cross_entropy] softcap must be >= 0");
  if (chunk <= 0) {
    // The default: as many chunks as the budget needs, of equal rows (a
    // multiple of 64 where that stays in the budget), not full ones and a
    // short last one (d12's 16,384 rows: 4 x 4,096, not 3 x 5,336 + 376,
    // whose thin product ran at a fraction of the GPU's rate).
    const int64_t most = default_chunk_rows(h.device().type(), w.size(0));
    const int64_t rows = std::max<int64_t>(1, h.size(0));
    const int64_t pieces = (rows + most - 1) / most;
    chunk = (rows + pieces - 1) / pieces;
    if ((chunk + 63) / 64 * 64 <= most)
      chunk = (chunk + 63) / 64 * 64;
  }
  return LinearCrossEntropy::apply(
      h,
      w,
      targets,
      chunk,
      softcap,
      torch::GradMode::is_enabled());
}

torch::Tensor linear_cross_entropy_reference(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    double softcap) {
  const auto compute = loss_arithmetic(h.scalar_type());
  auto logits = torch::matmul(h.to(compute), w.to(compute).t()); // (N, V)
  if (softcap > 0)
    logits = softcap * torch::tanh(logits / softcap);
  return torch::nn::functional::cross_entropy(
      logits,
      targets,
      torch::nn::functional::CrossEntropyFuncOptions()
          .ignore_index(-1)
          .reduction(torch::kSum));
}

} // namespace orchard::ops
