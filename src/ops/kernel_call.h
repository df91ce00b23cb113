// What the ops share when they call a CUDA kernel of src/ops/cuda: whether
// tensors can go to one (on a CUDA device, one dtype the kernels take;
// for the decoding kernels, which have no backward, nothing needing a
// gradient), the kernels' dtype, the current stream, and a launch failure
// turned into an error. Without -DORCHARD_CUDA=ON `usable` and
// `usable_with_grad` are always false and the ops keep their plain
// definitions.
#pragma once

#include <torch/torch.h>

#include <initializer_list>

#ifdef ORCHARD_CUDA_KERNELS
#include "ops/cuda/kernels.h"
#endif

namespace orchard::ops::kernel {

// Whether every tensor is on the first one's CUDA device, with its dtype
// (float32, float16 or bfloat16), and no gradient is wanted of any.
bool usable(std::initializer_list<torch::Tensor> tensors);

// The same, gradients allowed: for the kernels of src/ops/fused_train.h,
// which have a backward.
bool usable_with_grad(std::initializer_list<torch::Tensor> tensors);

// Whether the kernels start before the kernel ahead of them has ended
// (programmatic dependent launch; cuda::dependent_launch_active), on the
// current CUDA device. False without the kernels.
bool launches_early();

#ifdef ORCHARD_CUDA_KERNELS
cuda::Dtype dtype_of(const torch::Tensor& t);
// The current CUDA stream of t's device, as the kernels take it.
void* stream_of(const torch::Tensor& t);
// Throws std::runtime_error naming `op` where err (a cudaError_t) is not 0.
void check(int err, const char* op);
#endif

} // namespace orchard::ops::kernel
