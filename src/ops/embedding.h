// An embedding lookup, weight[ids], whose backward can be made from every
// process's rows of the output's gradient instead of from this process's
// alone (several processes; dist's gradient averager decides, through the
// gradient sink of core/gradient_sink.h). Where no sink gathers it, the
// backward is PyTorch's, as torch::nn::Embedding's.
//
// embedding_rows_gradient is the gradient of a weight of num_rows rows
// from the output's gradient `rows` (n, D) at `ids` (n), times `scale`,
// the same bits every time for the same inputs: the sink makes it from the
// rows of every process, and every process must make the same sum. On
// CUDA (with -DORCHARD_CUDA=ON) a stable sort of the ids and two kernels
// of src/ops/cuda/embedding_rows.cu; elsewhere PyTorch's
// embedding_dense_backward, which on the CPU adds the rows in order.
// EmbeddingRowsSum is the same in two parts (core/gradient_sink.h).
#pragma once

#include "core/gradient_sink.h"

#include <torch/torch.h>

namespace orchard::ops {

torch::Tensor embedding(const torch::Tensor& weight, const torch::Tensor& ids);

class EmbeddingRowsSum final : public GradientSink::RowsSum {
 public:
  // On the CPU, and on CUDA with the kernels (PyTorch's CUDA backward may
  // add with atomics).
  bool same_bits(const torch::Tensor& like) const override;
  void prepare(
      const torch::Tensor& ids,
      int64_t num_rows,
      const torch::Tensor& like) override;
  torch::Tensor sum(const torch::Tensor& rows, double scale) override;

 private:
  torch::Tensor ids_, sorted_, order_, out_;
  int64_t num_rows_ = 0;
};

torch::Tensor embedding_rows_gradient(
    const torch::Tensor& rows,
    const torch::Tensor& ids,
    int64_t num_rows,
    double scale = 1.0);

} // namespace orchard::ops
