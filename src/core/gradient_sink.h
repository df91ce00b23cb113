// Where a product's backward may make a weight's gradient: in the memory
// the gradient is sent from, not in a tensor of its own that is then
// copied there (DDP's gradient_as_bucket_view).
//
// dist's gradient averager (dist/world.h) is the sink while a step's last
// backward runs: it hands out the weight's part of its bucket. The
// product writes its gradient there and returns that view to autograd as
// usual, so autograd's sums, hooks and readiness are unchanged; the
// averager's hook sees its own memory come back and copies nothing. Where
// no sink is set, or it hands out nothing, the product makes its gradient
// as before.
//
// An embedding's gradient can also be made from every process's rows of
// its output's gradient, gathered (gathered_gradient): a few rows a
// process are fewer bytes than the weight's whole gradient.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace orchard {

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // A tensor of the weight's shape and dtype to write the gradient of the
  // weight `key` (weight_key below) into, or an undefined tensor: make
  // it as usual. Handed out at most once a backward for a weight, so two
  // uses of one weight never write over each other.
  virtual torch::Tensor destination(std::intptr_t key) = 0;

  // What an embedding's backward hands gathered_gradient to make the
  // weight's gradient with (ops/embedding.h's EmbeddingRowsSum). From
  // every process's ids, prepare() readies what the sum needs (on CUDA
  // the sorted ids and the zeroed gradient) while the rows are still on
  // their way; sum() then adds up every process's rows, times `scale`.
  // The same inputs must give the same bits on every process.
  class RowsSum {
   public:
    virtual ~RowsSum() = default;
    // Whether the sum of rows like `like` makes the same bits for the
    // same inputs here (else the sink must not gather: the processes'
    // weights would drift apart).
    virtual bool same_bits(const torch::Tensor& like) const = 0;
    // `like`: this process's rows (their width, dtype and device).
    virtual void prepare(
        const torch::Tensor& ids,
        int64_t num_rows,
        const torch::Tensor& like) = 0;
    virtual torch::Tensor sum(const torch::Tensor& rows, double scale) = 0;
  };

  // The gradient of an embedding weight `key` of num_rows rows from its
  // output's gradient `rows` (n, D) at `ids` (n), already the mean over
  // the processes: every process's rows and ids gathered and summed by
  // `sum`. Or an undefined tensor: make it from this process's rows as
  // usual. Once a backward for a weight, as destination().
  virtual torch::Tensor gathered_gradient(
      std::intptr_t key,
      const torch::Tensor& rows,
      const torch::Tensor& ids,
      int64_t num_rows,
      RowsSum& sum) {
    (void)key, (void)rows, (void)ids, (void)num_rows, (void)sum;
    return {};
  }
};

// The weight's identity for destination(): its TensorImpl, which a
// parameter keeps for its life.
inline std::intptr_t weight_key(const torch::Tensor& weight) {
  return reinterpret_cast<std::intptr_t>(weight.unsafeGetTensorImpl());
}

// The sink in force (nullptr: none). Set and cleared by the averager on
// the training thread; read by the backward on autograd's threads.
void set_gradient_sink(GradientSink* sink);
GradientSink* gradient_sink();

// The sink's destination for weight `key` with the gradient's sizes and
// dtype, or an undefined tensor (no sink, none handed out, or not of
// those sizes and dtype, or not contiguous).
torch::Tensor gradient_destination(
    std::intptr_t key,
    torch::IntArrayRef sizes,
    torch::ScalarType dtype);

} // namespace orchard
