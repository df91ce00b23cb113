#include "models/checkpointing.h"

#include "core/torch_compat.h"

#include <mutex>

namespace orchard::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Fn = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor rng_state(const torch::Device& device) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const torch::Device& device, const torch::Tensor& state) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(
      AutogradContext* ctx,
      torch::Tensor x,
      const Fn* fn) {
    // A pointer through an integer: saved_data holds IValues only. The
    // caller keeps `fn` alive until backward (see the header).
    ctx->saved_data["fn"] = int64_t(reinterpret_cast<intptr_t>(fn));
    ctx->saved_data["autocast"] =
        int64_t(compat::autocast_dtype(x.device().type()));
    ctx->save_for_backward({x});
    // The random state `fn` starts from, so dropout inside it draws the
    // same mask when the backward recomputes it (as PyTorch's checkpoint
    // preserves it).
    ctx->saved_data["rng"] = rng_state(x.device());
    torch::NoGradGuard no_grad;
    return (*fn)(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Fn* fn =
        reinterpret_cast<const Fn*>(intptr_t(ctx->saved_data["fn"].toInt()));
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor y;
    {
      const torch::Tensor now = rng_state(x.device());
      set_rng_state(x.device(), ctx->saved_data["rng"].toTensor());
      struct Restore {
        torch::Device device;
        torch::Tensor state;
        ~Restore() {
          set_rng_state(device, state);
        }
      } restore{x.device(), now};
      torch::AutoGradMode grad_on(true);
      compat::AutocastGuard autocast(
          x.device().type(),
          static_cast<torch::ScalarType>(ctx->saved_data["autocast"].toInt()));
      y = (*fn)(x);
    }
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor checkpointed(const Fn& fn, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled())
    return fn(x);
  return CheckpointFunction::apply(x, &fn);
}

} // namespace orchard::models
