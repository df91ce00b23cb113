// Many copies between contiguous tensors, each cast to its destination's
// dtype, prepared once and then run as one CUDA kernel: ZeRO-1's
// all-gather (dist/sharded_gather.cpp) writes some thirty pieces of the
// updated weights into a bucket in bfloat16 and copies the other ranks'
// pieces back into the float32 weights every step. One launch each way in
// place of one a piece (bench/RESULTS.md, 2026-11-30: ~45 copies of 2.5-5
// µs each, launched 4 µs apart, at a step's end on an H200).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>
#include <vector>

namespace orchard::ops {

// Checks the pairs (from, to): both contiguous, of one number of values,
// on one device; then returns what copies every `from` into its `to` (on
// the current stream), casting as Tensor::copy_ does. On CUDA with
// Orchard's kernels, where every `from` has one dtype and every `to` one
// (float32, bfloat16 or float16), one kernel over a table of the pairs'
// addresses made now: the tensors must keep their memory while the
// returned function is used (it holds them). Elsewhere a copy_ a pair.
std::function<void()> prepare_copies(
    std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs);

} // namespace orchard::ops
