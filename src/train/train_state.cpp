#include "train/train_state.h"

#include "core/error.h"
#include "core/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>

namespace orchard::train {

NamedTensors adamw_state(
    const torch::optim::AdamW& opt,
    const torch::nn::Module& model) {
  NamedTensors out;
  const auto& state = opt.state();
  for (const auto& named : model.named_parameters()) {
    auto it = state.find(compat::optimizer_state_key(state, named.value()));
    if (it == state.end())
      continue; // no step taken yet
    const auto& s =
        static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out.push_back({named.key() + ".exp_avg", s.exp_avg()});
    out.push_back({named.key() + ".exp_avg_sq", s.exp_avg_sq()});
    out.push_back({named.key() + ".step", torch::tensor(int64_t(s.step()))});
  }
  return out;
}

void load_adamw_state(
    torch::optim::AdamW& opt,
    const torch::nn::Module& model,
    const std::map<std::string, torch::Tensor>& saved) {
  for (const auto& named : model.named_parameters()) {
    const std::string& n = named.key();
    auto avg = saved.find(n + ".exp_avg");
    if (avg == saved.end())
      continue;
    auto sq = saved.find(n + ".exp_avg_sq");
    auto step = saved.find(n + ".step");
    const auto& p = named.value();
    if (sq == saved.end() || step == saved.end() ||
        avg->second.sizes() != p.sizes())
      throw UserError(
          "the checkpoint's optimizer state for '" + n +
          "' does not match the model (was the architecture changed?).");
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step->second.item<int64_t>());
    s->exp_avg(avg->second.to(p.device(), p.scalar_type()).clone());
    s->exp_avg_sq(sq->second.to(p.device(), p.scalar_type()).clone());
    opt.state()[compat::optimizer_state_key(opt.state(), p)] = std::move(s);
  }
}

NamedTensors rng_state() {
  NamedTensors out;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  out.push_back({"rng.cpu", cpu.get_state()});
  return out;
}

void load_rng_state(const std::map<std::string, torch::Tensor>& saved) {
  auto it = saved.find("rng.cpu");
  if (it != saved.end()) {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(it->second);
  }
}

} // namespace orchard::train
