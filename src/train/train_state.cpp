#include "train/train_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

namespace orchard::train {
namespace {

std::string cuda_key(const torch::Device& device) {
  return "rng.cuda." + std::to_string(device.index() < 0 ? 0 : device.index());
}

at::Generator cuda_generator(const torch::Device& device) {
  return at::globalContext().defaultGenerator(
      c10::Device(c10::kCUDA, device.index() < 0 ? 0 : device.index()));
}

} // namespace

runs::NamedTensors rng_state(const torch::Device& device) {
  runs::NamedTensors out;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  out.push_back({"rng.cpu", cpu.get_state()});
  if (device.is_cuda())
    out.push_back({cuda_key(device), cuda_generator(device).get_state()});
  return out;
}

void load_rng_state(
    const std::map<std::string, torch::Tensor>& saved,
    const torch::Device& device) {
  auto it = saved.find("rng.cpu");
  if (it != saved.end()) {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(it->second);
  }
  if (device.is_cuda()) {
    // A checkpoint from another device index or from the CPU has no state
    // for this GPU: its generator keeps the seed it was given.
    auto c = saved.find(cuda_key(device));
    if (c != saved.end())
      cuda_generator(device).set_state(c->second);
  }
}

} // namespace orchard::train
