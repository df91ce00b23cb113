#include "core/gradient_sink.h"

#include <atomic>

namespace orchard {
namespace {

std::atomic<GradientSink*> g_sink{nullptr};

} // namespace

void set_gradient_sink(GradientSink* sink) {
  g_sink.store(sink);
}

GradientSink* gradient_sink() {
  return g_sink.load();
}

torch::Tensor gradient_destination(
    std::intptr_t key,
    torch::IntArrayRef sizes,
    torch::ScalarType dtype) {
  GradientSink* sink = gradient_sink();
  if (!sink)
    return {};
  torch::Tensor dst = sink->destination(key);
  if (!dst.defined() || dst.sizes() != sizes || dst.scalar_type() != dtype ||
      !dst.is_contiguous())
    return {};
  return dst;
}

} // namespace orchard
