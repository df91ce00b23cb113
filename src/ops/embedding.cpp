#include "ops/embedding.h"

#include "core/gradient_sink.h"
#include "ops/kernel_call.h"

#include <tuple>

#ifdef ORCHARD_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace orchard::ops {
namespace {

// PyTorch's backward of weight[ids] (torch::nn::Embedding's).
torch::Tensor dense_backward(
    const torch::Tensor& rows,
    const torch::Tensor& ids,
    int64_t num_rows) {
  return at::embedding_dense_backward(
      rows, ids, num_rows, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
}

struct Embedding : torch::autograd::Function<Embedding> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& weight,
      const torch::Tensor& ids) {
    ctx->save_for_backward({ids});
    ctx->saved_data["num_rows"] = weight.size(0);
    ctx->saved_data["weight_key"] = int64_t(weight_key(weight));
    return at::embedding(weight, ids);
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const torch::Tensor ids = ctx->get_saved_variables()[0].reshape({-1});
    const int64_t num_rows = ctx->saved_data["num_rows"].toInt();
    const torch::Tensor& dy = grads[0];
    const torch::Tensor rows = dy.reshape({-1, dy.size(-1)});
    torch::Tensor dw;
    if (GradientSink* sink = gradient_sink()) {
      EmbeddingRowsSum sum;
      dw = sink->gathered_gradient(
          std::intptr_t(ctx->saved_data["weight_key"].toInt()),
          rows,
          ids,
          num_rows,
          sum);
    }
    if (!dw.defined())
      dw = dense_backward(rows, ids, num_rows);
    return {dw, torch::Tensor()};
  }
};

} // namespace

torch::Tensor embedding(const torch::Tensor& weight, const torch::Tensor& ids) {
  if (!weight.requires_grad() || !torch::GradMode::is_enabled())
    return at::embedding(weight, ids);
  return Embedding::apply(weight, ids);
}

bool EmbeddingRowsSum::same_bits(const torch::Tensor& like) const {
  if (like.device().is_cpu())
    return true;
#ifdef ORCHARD_CUDA_KERNELS
  return kernel::usable({like});
#else
  return false;
#endif
}

void EmbeddingRowsSum::prepare(
    const torch::Tensor& ids,
    int64_t num_rows,
    const torch::Tensor& like) {
  TORCH_CHECK(
      like.dim() == 2 && ids.dim() == 1,
      "EmbeddingRowsSum: rows (n, D) and ids (n)");
  ids_ = ids;
  num_rows_ = num_rows;
#ifdef ORCHARD_CUDA_KERNELS
  if (kernel::usable({like}) && ids.device() == like.device() &&
      ids.scalar_type() == torch::kInt64) {
    const c10::cuda::CUDAGuard on_device(like.device());
    // A stable sort: equal ids keep their rows' order (every process's,
    // in rank order), so the order of each sum is fixed.
    std::tie(sorted_, order_) =
        torch::sort(ids, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    out_ = torch::zeros({num_rows, like.size(1)}, like.options());
  }
#endif
}

torch::Tensor EmbeddingRowsSum::sum(const torch::Tensor& rows, double scale) {
  TORCH_CHECK(
      rows.dim() == 2 && rows.size(0) == ids_.size(0),
      "EmbeddingRowsSum: ",
      rows.size(0),
      " rows for ",
      ids_.size(0),
      " ids");
#ifdef ORCHARD_CUDA_KERNELS
  if (out_.defined() && rows.scalar_type() == out_.scalar_type() &&
      rows.size(1) == out_.size(1) && rows.device() == out_.device()) {
    const c10::cuda::CUDAGuard on_device(rows.device());
    const torch::Tensor x = rows.contiguous();
    const int64_t n = x.size(0), D = x.size(1);
    auto partials = torch::empty(
        {2 * ((n + cuda::kRowsChunk - 1) / cuda::kRowsChunk), D},
        x.options().dtype(torch::kFloat32));
    kernel::check(
        cuda::embedding_rows_backward(
            kernel::dtype_of(x),
            x.data_ptr(),
            sorted_.data_ptr<int64_t>(),
            order_.data_ptr<int64_t>(),
            partials.data_ptr<float>(),
            out_.data_ptr(),
            n,
            D,
            num_rows_,
            float(scale),
            kernel::stream_of(x)),
        "embedding_rows_backward");
    return out_;
  }
#endif
  auto out = dense_backward(rows, ids_, num_rows_);
  return scale == 1.0 ? out : out.mul_(scale);
}

torch::Tensor embedding_rows_gradient(
    const torch::Tensor& rows,
    const torch::Tensor& ids,
    int64_t num_rows,
    double scale) {
  EmbeddingRowsSum s;
  s.prepare(ids, num_rows, rows);
  return s.sum(rows, scale);
}

} // namespace orchard::ops
