#include "ops/copy_pieces.h"

#include "ops/kernel_call.h"

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <memory>

namespace orchard::ops {

std::function<void()> prepare_copies(
    std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs) {
  for (const auto& [from, to] : pairs)
    TORCH_CHECK(
        from.is_contiguous() && to.is_contiguous() &&
            from.numel() == to.numel() && from.device() == to.device(),
        "[prepare_copies] every pair must be contiguous, of one size and on "
        "one device");
  for (auto& [from, to] : pairs) { // the same memory; no autograd in a copy
    from = from.detach();
    to = to.detach();
  }
  auto held = std::make_shared<decltype(pairs)>(std::move(pairs));
  auto one_by_one = [held] {
    torch::NoGradGuard no_grad;
    for (auto& [from, to] : *held)
      to.copy_(from);
  };
#ifdef ORCHARD_CUDA_KERNELS
  if (held->empty() || !held->front().first.is_cuda())
    return one_by_one;
  const auto from_dtype = held->front().first.scalar_type();
  const auto to_dtype = held->front().second.scalar_type();
  bool one_kernel = true;
  auto kernels_take = [](torch::ScalarType t) {
    return t == torch::kFloat32 || t == torch::kFloat16 ||
        t == torch::kBFloat16;
  };
  one_kernel = kernels_take(from_dtype) && kernels_take(to_dtype);
  for (const auto& [from, to] : *held)
    one_kernel = one_kernel && from.scalar_type() == from_dtype &&
        to.scalar_type() == to_dtype &&
        from.device() == held->front().first.device();
  if (!one_kernel)
    return one_by_one;
  // The table: a chunk of at most kCopyChunk values a row: (from, to,
  // count).
  std::vector<int64_t> table;
  for (const auto& [from, to] : *held)
    for (int64_t at = 0; at < from.numel(); at += cuda::kCopyChunk) {
      const int64_t n = std::min<int64_t>(cuda::kCopyChunk, from.numel() - at);
      table.push_back(reinterpret_cast<int64_t>(
          static_cast<const char*>(from.data_ptr()) +
          at * from.element_size()));
      table.push_back(reinterpret_cast<int64_t>(
          static_cast<char*>(to.data_ptr()) + at * to.element_size()));
      table.push_back(n);
    }
  const int64_t chunks = int64_t(table.size()) / 3;
  const torch::Device device = held->front().first.device();
  torch::Tensor on_device =
      torch::tensor(table, torch::TensorOptions().dtype(torch::kInt64))
          .to(device);
  const cuda::Dtype from_kind = kernel::dtype_of(held->front().first);
  const cuda::Dtype to_kind = kernel::dtype_of(held->front().second);
  return [held, on_device, chunks, from_kind, to_kind, device] {
    if (chunks == 0)
      return;
    const c10::cuda::CUDAGuard on(device);
    kernel::check(
        cuda::copy_pieces(
            on_device.data_ptr<int64_t>(),
            chunks,
            from_kind,
            to_kind,
            kernel::stream_of(on_device)),
        "copy_pieces");
  };
#else
  return one_by_one;
#endif
}

} // namespace orchard::ops
