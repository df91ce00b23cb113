// The mean of float32 tensors of one size, summed in their order: the
// same bits whichever process makes it from the same parts
// (dist/copy_engine_mean.cpp: a share of a gradient bucket from every
// rank's values). One pass on CUDA (ops/cuda/mean_of.cu), where the sum
// and the division would otherwise be two passes over the bucket beside
// the backward.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace orchard::ops {

// The plain definition: (parts[0] + parts[1] + ...) * (1 / parts.size()).
torch::Tensor mean_of_reference(const std::vector<torch::Tensor>& parts);

// Writes the mean into out (which may be one of the parts); every tensor
// float32, contiguous, of out's size. With `squares`, also the sum of the
// squares of out's values, as a float32 tensor of one value on out's
// device (on CUDA from the same pass, the same bits every time).
void mean_of(
    torch::Tensor& out,
    const std::vector<torch::Tensor>& parts,
    torch::Tensor* squares = nullptr);

} // namespace orchard::ops
