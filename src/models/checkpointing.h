// Gradient (activation) checkpointing for one function of one tensor: the
// forward keeps only its input; the backward runs the forward again with
// gradients on and back-propagates through that recomputation. Memory for
// activations falls from every layer's intermediates to one tensor per
// layer, for about one extra forward per step (Chen et al. 2016, "Training
// Deep Nets with Sublinear Memory Cost", https://arxiv.org/abs/1604.06174).
//
// libtorch's C++ API has no checkpoint helper (PyTorch's is Python), so this
// is a custom autograd Function. Like PyTorch's reentrant checkpoint, the
// recomputation accumulates the parameters' gradients directly, and it runs
// under the autocast state that was active during the forward (autocast is
// off while backward runs).
#pragma once

#include <torch/torch.h>

#include <functional>

namespace orchard::models {

// y = fn(x), keeping only x for the backward. `fn` must be deterministic
// (no dropout) and must stay callable until backward has run.
torch::Tensor checkpointed(
    const std::function<torch::Tensor(const torch::Tensor&)>& fn,
    const torch::Tensor& x);

} // namespace orchard::models
