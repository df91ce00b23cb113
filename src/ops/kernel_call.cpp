#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>
#endif

#include <stdexcept>
#include <string>

namespace orchard::ops::kernel {

namespace {
bool same_kernel_inputs(
    std::initializer_list<torch::Tensor> tensors,
    bool allow_grad) {
#ifdef ORCHARD_CUDA_KERNELS
  if (tensors.size() == 0)
    return false;
  const auto& first = *tensors.begin();
  const auto t = first.scalar_type();
  if (!first.is_cuda() ||
      !(t == torch::kFloat32 || t == torch::kFloat16 || t == torch::kBFloat16))
    return false;
  const bool grad = !allow_grad && torch::GradMode::is_enabled();
  for (const auto& x : tensors)
    if (!x.defined() || x.device() != first.device() || x.scalar_type() != t ||
        (grad && x.requires_grad()))
      return false;
  return true;
#else
  (void)tensors;
  (void)allow_grad;
  return false;
#endif
}
} // namespace

bool usable(std::initializer_list<torch::Tensor> tensors) {
  return same_kernel_inputs(tensors, /*allow_grad=*/false);
}

bool usable_with_grad(std::initializer_list<torch::Tensor> tensors) {
  return same_kernel_inputs(tensors, /*allow_grad=*/true);
}

bool launches_early() {
#ifdef ORCHARD_CUDA_KERNELS
  return torch::cuda::is_available() && cuda::dependent_launch_active();
#else
  return false;
#endif
}

#ifdef ORCHARD_CUDA_KERNELS
cuda::Dtype dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat16:
      return cuda::Dtype::float16;
    case torch::kBFloat16:
      return cuda::Dtype::bfloat16;
    default:
      return cuda::Dtype::float32;
  }
}

void* stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check(int err, const char* op) {
  if (err != 0)
    throw std::runtime_error(
        std::string("[") + op +
        "] the CUDA kernel failed to launch (cudaError " + std::to_string(err) +
        ")");
}
#endif

} // namespace orchard::ops::kernel
