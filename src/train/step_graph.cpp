#include "train/step_graph.h"

#include <stdexcept>

#if defined(ORCHARD_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define ORCHARD_STEP_GRAPHS 1
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#else
#define ORCHARD_STEP_GRAPHS 0
#endif

namespace orchard::train {

#if ORCHARD_STEP_GRAPHS
struct StepGraph::Impl {
  explicit Impl(const torch::Device& d)
      : device(d.index() < 0 ? 0 : d.index()),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {}
  int device;
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAGraph graph;
};
#else
struct StepGraph::Impl {};
#endif

bool StepGraph::built() {
  return ORCHARD_STEP_GRAPHS;
}

StepGraph::StepGraph(const torch::Device& device) {
#if ORCHARD_STEP_GRAPHS
  if (!device.is_cuda())
    throw std::logic_error("[StepGraph] needs a CUDA device");
  impl_ = std::make_unique<Impl>(device);
#else
  (void)device;
  throw std::logic_error("[StepGraph] built without CUDA graphs");
#endif
}

StepGraph::~StepGraph() = default;

void StepGraph::warm_up(const std::function<void()>& fn) {
#if ORCHARD_STEP_GRAPHS
  torch::cuda::synchronize(impl_->device);
  {
    c10::cuda::CUDAStreamGuard on_side_stream(impl_->stream);
    fn();
  }
  torch::cuda::synchronize(impl_->device);
#else
  (void)fn;
#endif
}

void StepGraph::capture(const std::function<void()>& fn) {
#if ORCHARD_STEP_GRAPHS
  torch::cuda::synchronize(impl_->device);
  // The eager steps' cached blocks go back to the device: the graph's pool
  // holds the step's memory from now on, and both together would hold it
  // twice.
  c10::cuda::CUDACachingAllocator::emptyCache();
  {
    c10::cuda::CUDAStreamGuard on_side_stream(impl_->stream);
    // Thread-local: the backward's kernels come from autograd's device
    // thread into the captured stream, which is allowed; only this
    // thread's calls are held to the capture's rules.
    impl_->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      fn();
    } catch (...) {
      try {
        impl_->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
  }
  torch::cuda::synchronize(impl_->device);
  captured_ = true;
#else
  (void)fn;
#endif
}

void StepGraph::replay() {
#if ORCHARD_STEP_GRAPHS
  if (!captured_)
    throw std::logic_error("[StepGraph] replay before capture");
  impl_->graph.replay();
#endif
}

torch::Tensor read_then_launch(
    const torch::Tensor& values,
    const std::function<void()>& launch) {
#if ORCHARD_STEP_GRAPHS
  if (values.is_cuda()) {
    auto host = torch::empty(
        values.sizes(),
        values.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(values, /*non_blocking=*/true);
    at::cuda::CUDAEvent arrived;
    arrived.record(c10::cuda::getCurrentCUDAStream(values.device().index()));
    launch();
    arrived.synchronize();
    return host;
  }
#endif
  auto host = values.to(torch::kCPU);
  launch();
  return host;
}

} // namespace orchard::train
