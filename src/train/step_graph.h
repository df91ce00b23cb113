// A training step's forward and backward as one CUDA graph: the Trainer
// captures them once the shapes are fixed and replays the graph each step,
// so the few thousand kernel launches of a GPT step cost one launch of the
// host's time and the GPU never waits between them (PyTorch's "whole
// network capture"). The optimizer stays outside: its step reads the
// gradients the graph wrote, as an eager step's does (with plain fused
// AdamW queued before the host reads the gradient norm, clipping and the
// finite check decided on the device: Optimizers::step_on_device).
//
// Capture records kernels, it runs none: the captured step is then
// replayed once to compute it. The graph reads its inputs from fixed
// buffers (the Trainer copies each micro-batch in) and writes the
// gradients and its outputs to fixed memory in a pool of its own, which
// it keeps while it lives.
//
// Built with a CUDA libtorch 2.x only; elsewhere built() is false and a
// StepGraph cannot be made.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

namespace orchard::train {

class StepGraph {
 public:
  static bool built();

  explicit StepGraph(const torch::Device& device);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs `fn` eagerly on the stream captures use (cuBLAS makes a
  // workspace per stream, kernels set themselves up on first use: a
  // warm-up before the capture), waiting for the device before and after.
  void warm_up(const std::function<void()>& fn);
  // Records `fn` on that stream as the graph; nothing runs. On an error
  // the capture is ended and the error rethrown; the StepGraph is then
  // unusable and should be dropped.
  void capture(const std::function<void()>& fn);
  bool captured() const {
    return captured_;
  }
  // Runs the captured step on the current stream.
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool captured_ = false;
};

// Copies `values` (a few scalars on the device) to the host, runs
// `launch` (work queued after the copy: the optimizer's step) and returns
// the copy as soon as it has arrived, while that work runs: the host goes
// on to the step's logging and the next batch with the GPU still busy.
// On the CPU, or without CUDA in the build: the copy, then `launch`.
torch::Tensor read_then_launch(
    const torch::Tensor& values,
    const std::function<void()>& launch);

} // namespace orchard::train
