// Differences between the libtorch versions Orchard builds against: Debian 12's
// 1.13 (CPU, what CI has) and PyTorch 2.x (CUDA; Homebrew on macOS). Every
// `#if` on the torch version lives here, so the rest of the code reads as if
// there were one libtorch.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <ATen/autocast_mode.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/mps.h>
#endif

// libtorch 2.4 replaced autocast's per-backend functions (set_enabled,
// set_cpu_enabled, set_autocast_gpu_dtype, ...) with ones taking a device type.
#define ORCHARD_AUTOCAST_BY_DEVICE_TYPE \
  (TORCH_VERSION_MAJOR > 2 ||           \
   (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

// libtorch 2.x's Kineto profiler: CPU ops and CUDA kernels of a stretch of
// the program in one Chrome trace (train/step_trace.h).
#define ORCHARD_KINETO_TRACE (TORCH_VERSION_MAJOR >= 2)

// Not a compile-time difference, but one of linking: PyTorch 2.x's
// libtorch.so exports std::filesystem::remove_all, which then replaces the
// system libstdc++'s at run time and crashes. core/files.h's remove_tree is
// the replacement; never call std::filesystem::remove_all.

namespace orchard::compat {

constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

inline std::string torch_version() {
  return TORCH_VERSION;
}

// MPS: 1.13 has no torch::mps namespace; the global context knows whether the
// MPS backend was compiled in and a Metal device exists.
inline bool mps_available() {
#if TORCH_VERSION_MAJOR >= 2
  return torch::mps::is_available();
#else
  return at::hasMPS();
#endif
}

// Whether this libtorch was compiled with the MPS backend at all (true on
// Homebrew's arm64 pytorch even when no Metal device is usable).
inline bool mps_built() {
  return at::hasMPS() || mps_available();
}

inline void mps_synchronize() {
#if TORCH_VERSION_MAJOR >= 2
  if (mps_available())
    torch::mps::synchronize();
#endif
}

// Waits for queued work on `device` so wall-clock timings mean something.
inline void synchronize(const torch::Device& device) {
  if (device.is_cuda())
    torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
  else if (device.is_mps())
    mps_synchronize();
}

// A host tensor onto `device` without the host waiting for the device's
// queue: on CUDA through pinned memory and an asynchronous copy (the
// caching host allocator keeps the pinned copy until the copy is done); a
// plain copy elsewhere.
inline torch::Tensor to_device_async(
    const torch::Tensor& t,
    const torch::Device& device) {
  if (!device.is_cuda() || !t.device().is_cpu())
    return t.to(device);
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

// PyTorch's fused scaled-dot-product attention (flash / cuDNN /
// memory-efficient on CUDA, Metal on MPS), which libtorch has from 2.0;
// callers check has_fused_attention() first (ops/attention.h does).
inline torch::Tensor fused_attention(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const c10::optional<torch::Tensor>& keep,
    bool is_causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, keep, 0.0, is_causal);
#else
  throw std::logic_error("[fused_attention] needs libtorch 2.x");
#endif
}

// libtorch 2.10 has products of 16-bit CUDA matrices that write float32
// (the out_dtype overloads of at::mm and at::addmm; cuBLAS accumulates in
// float32 either way): a float32 weight's gradient made by the product,
// with no 16-bit copy to cast.
#define ORCHARD_MM_OUT_DTYPE \
  (TORCH_VERSION_MAJOR > 2 || \
   (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10))

// acc += a b where acc is a float32 CUDA matrix and a, b are 16-bit ones of
// one dtype, the sum made by the product. false: not available or not
// these dtypes (nothing done; the caller adds).
inline bool add_product_float32(
    torch::Tensor& acc,
    const torch::Tensor& a,
    const torch::Tensor& b) {
#if ORCHARD_MM_OUT_DTYPE
  if (acc.is_cuda() && acc.scalar_type() == torch::kFloat32 &&
      (a.scalar_type() == torch::kBFloat16 ||
       a.scalar_type() == torch::kFloat16) &&
      b.scalar_type() == a.scalar_type()) {
    at::addmm_out(acc, acc, a, b, torch::kFloat32);
    return true;
  }
#endif
  (void)acc, (void)a, (void)b;
  return false;
}

// libtorch 2.9 has a fused RMSNorm on CUDA (one kernel forward, one
// backward, float32 accumulation) behind at::rms_norm.
#define ORCHARD_FUSED_RMS_NORM \
  (TORCH_VERSION_MAJOR > 2 ||  \
   (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9))

// RMSNorm over the last dimension without a scale, in float32 at least,
// the result in x's dtype: the fused kernel on CUDA where libtorch has it
// and the rows are contiguous with a width that is a multiple of 8 (its
// vectorized path; measured on an H100, 1.8 ms instead of 0.07 ms a call
// on 768 x 512 rows of 97 strided values). nullopt: use the plain ops.
inline std::optional<torch::Tensor> fused_rms_norm(
    const torch::Tensor& x,
    double eps) {
#if ORCHARD_FUSED_RMS_NORM
  if (x.is_cuda() && x.is_contiguous() && x.size(-1) % 8 == 0) {
    auto y = at::rms_norm(x, {x.size(-1)}, std::nullopt, eps);
    return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
  }
#endif
  (void)x;
  (void)eps;
  return std::nullopt;
}

// One AdamW step over lists of float32 CUDA tensors sharing a step count,
// with libtorch 2.x's fused multi-tensor kernel (at::_fused_adamw_, what
// torch.optim.AdamW(fused=True) calls): one pass that reads each weight,
// gradient and moment once, against the nine multi-tensor ops of the
// plain update. Decoupled weight decay, bias corrections from `step`
// (the count after this update), eps added after the corrected square
// root: PyTorch's AdamW. With `grad_scale` (a float32 device scalar) the
// kernel divides each gradient by it first; with `found_inf` it changes
// nothing where that scalar is 1 (what PyTorch's AMP passes; Orchard's
// clipping and finite check decided on the device). false: not available
// (libtorch 1.13, or tensors not on CUDA); nothing was changed.
constexpr bool has_fused_adamw() {
  return ORCHARD_AUTOCAST_BY_DEVICE_TYPE; // libtorch 2.4 or later
}
inline bool fused_adamw(
    const std::vector<torch::Tensor>& params,
    const std::vector<torch::Tensor>& grads,
    const std::vector<torch::Tensor>& exp_avg,
    const std::vector<torch::Tensor>& exp_avg_sq,
    int64_t step,
    double lr,
    double beta1,
    double beta2,
    double weight_decay,
    double eps,
    const c10::optional<torch::Tensor>& grad_scale = c10::nullopt,
    const c10::optional<torch::Tensor>& found_inf = c10::nullopt) {
#if ORCHARD_AUTOCAST_BY_DEVICE_TYPE // libtorch 2.4 or later
  if (params.empty() || !params.front().is_cuda())
    return false;
  // The kernel reads each tensor's step from a float32 device scalar; one
  // shared by the list (it does not advance them itself).
  auto steps = torch::scalar_tensor(
      double(step), params.front().options().dtype(torch::kFloat32));
  std::vector<torch::Tensor> step_list(params.size(), steps);
  at::_fused_adamw_(
      params,
      grads,
      exp_avg,
      exp_avg_sq,
      {},
      step_list,
      lr,
      beta1,
      beta2,
      weight_decay,
      eps,
      /*amsgrad=*/false,
      /*maximize=*/false,
      grad_scale,
      found_inf);
  return true;
#else
  (void)params, (void)grads, (void)exp_avg, (void)exp_avg_sq, (void)step;
  (void)lr, (void)beta1, (void)beta2, (void)weight_decay, (void)eps;
  (void)grad_scale, (void)found_inf;
  return false;
#endif
}

// Drops autocast's cached weight casts (no-op outside autocast): casts
// cached under torch::NoGradGuard carry no gradient, and reusing them later
// in the same autocast region detaches the weights (PyTorch issue 112583).
inline void clear_autocast_cache() {
  at::autocast::clear_cache();
}

// Autocast (mixed precision) for the tensors of one device type while the
// guard lives: matrix products run in `dtype`, reductions, norms and the
// loss in float32, weights stay float32 (PyTorch's torch.autocast). The
// cast weights are cached for the region and dropped when the outermost
// guard ends, as Python's context manager does. A float32 dtype is a no-op.
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType type, torch::ScalarType dtype) : type_(type) {
    if (dtype == torch::kFloat32)
      return;
    active_ = true;
#if ORCHARD_AUTOCAST_BY_DEVICE_TYPE
    was_enabled_ = at::autocast::is_autocast_enabled(type);
    was_dtype_ = at::autocast::get_autocast_dtype(type);
    at::autocast::set_autocast_dtype(type, dtype);
    at::autocast::set_autocast_enabled(type, true);
#else
    if (type == torch::kCUDA) {
      was_enabled_ = at::autocast::is_enabled();
      was_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_autocast_gpu_dtype(dtype);
      at::autocast::set_enabled(true);
    } else if (type == torch::kCPU) {
      was_enabled_ = at::autocast::is_cpu_enabled();
      was_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_autocast_cpu_dtype(dtype);
      at::autocast::set_cpu_enabled(true);
    } else {
      active_ = false; // 1.13 has no MPS autocast; callers check support
      return;
    }
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_)
      return;
    if (at::autocast::decrement_nesting() == 0)
      at::autocast::clear_cache();
#if ORCHARD_AUTOCAST_BY_DEVICE_TYPE
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, was_dtype_);
#else
    if (type_ == torch::kCUDA) {
      at::autocast::set_enabled(was_enabled_);
      at::autocast::set_autocast_gpu_dtype(was_dtype_);
    } else {
      at::autocast::set_cpu_enabled(was_enabled_);
      at::autocast::set_autocast_cpu_dtype(was_dtype_);
    }
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType type_;
  bool active_ = false, was_enabled_ = false;
  torch::ScalarType was_dtype_ = torch::kFloat32;
};

// Autocast off for one device type while the guard lives (generation inside
// a training step runs in the weights' own dtype), restored after.
class AutocastOff {
 public:
  explicit AutocastOff(torch::DeviceType type) : type_(type) {
#if ORCHARD_AUTOCAST_BY_DEVICE_TYPE
    was_enabled_ = at::autocast::is_autocast_enabled(type);
    at::autocast::set_autocast_enabled(type, false);
#else
    if (type == torch::kCUDA) {
      was_enabled_ = at::autocast::is_enabled();
      at::autocast::set_enabled(false);
    } else if (type == torch::kCPU) {
      was_enabled_ = at::autocast::is_cpu_enabled();
      at::autocast::set_cpu_enabled(false);
    }
#endif
  }
  ~AutocastOff() {
#if ORCHARD_AUTOCAST_BY_DEVICE_TYPE
    at::autocast::set_autocast_enabled(type_, was_enabled_);
#else
    if (type_ == torch::kCUDA)
      at::autocast::set_enabled(was_enabled_);
    else if (type_ == torch::kCPU)
      at::autocast::set_cpu_enabled(was_enabled_);
#endif
  }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  torch::DeviceType type_;
  bool was_enabled_ = false;
};

// The dtype autocast computes in for `type` right now: float32 when autocast
// is off (what AutocastGuard takes to mean "no autocast").
inline torch::ScalarType autocast_dtype(torch::DeviceType type) {
#if ORCHARD_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(type)
      ? at::autocast::get_autocast_dtype(type)
      : torch::kFloat32;
#else
  if (type == torch::kCUDA)
    return at::autocast::is_enabled() ? at::autocast::get_autocast_gpu_dtype()
                                      : torch::kFloat32;
  if (type == torch::kCPU)
    return at::autocast::is_cpu_enabled()
        ? at::autocast::get_autocast_cpu_dtype()
        : torch::kFloat32;
  return torch::kFloat32;
#endif
}

// Whether this libtorch can autocast tensors of `type` to `dtype`: CUDA
// (bf16, fp16) everywhere, CPU bf16 everywhere (fp16 from 2.x), MPS from
// 2.5 (Apple's autocast landed then).
inline bool autocast_supported(
    torch::DeviceType type,
    torch::ScalarType dtype) {
  if (dtype == torch::kFloat32 || type == torch::kCUDA)
    return true;
  if (type == torch::kCPU)
    return dtype == torch::kBFloat16 || kTorch2;
  if (type == torch::kMPS)
    return TORCH_VERSION_MAJOR > 2 ||
        (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5);
  return false;
}

inline bool has_fused_attention() {
  return TORCH_VERSION_MAJOR >= 2;
}

} // namespace orchard::compat

// c10d's collective groups (src/dist/world.cpp defines
// ORCHARD_C10D_COMPAT before its includes and skips the precompiled header):
// 2.x's Gloo and NCCL classes derive from c10d::Backend; 1.13's from
// c10d::ProcessGroup. Both have allreduce and broadcast with the same
// signatures.
#if defined(ORCHARD_C10D_COMPAT)
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace orchard::compat {
using CollectiveGroup = c10d::Backend;
} // namespace orchard::compat
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace orchard::compat {
using CollectiveGroup = c10d::ProcessGroup;
} // namespace orchard::compat
#endif
#endif
