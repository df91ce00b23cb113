// Choosing the next token from logits: greedy, temperature, top-k, top-p,
// min-p and a repetition penalty, from a generator seeded per sequence.
// The order is transformers': the repetition penalty on the raw logits
// (CTRL's: a logit of a token already in the sequence, prompt included, is
// divided by the penalty when positive and multiplied by it when
// negative), then temperature, top-k, top-p, and min-p (tokens whose
// probability is below min_p times the likeliest one's are dropped).
//
// Two samplers with the same distribution:
// - on the CPU (sample_token): the logits are copied to the host and drawn
//   with torch::multinomial from a CPU generator, so a seed gives the same
//   text on every device; one host synchronisation per token.
// - on the logits' device (Sampler in "device" mode): every row at once,
//   with no host synchronisation; the draw is argmax(p / E), E ~ Exp(1)
//   drawn from the row's own generator (the exponential form of the
//   Gumbel-max trick: P(argmax = i) = p_i), so a row's tokens do not depend
//   on which other rows share the batch.
// `sampling_device=auto` is the CPU sampler when the model is on the CPU
// and the device sampler on CUDA and MPS (docs/generation.md).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::infer {

struct SamplingOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.8; // 0: greedy
  int64_t top_k = 50;       // 0: off
  double top_p = 1.0;       // 1: off
  double min_p = 0.0;       // 0: off
  double repetition_penalty = 1.0; // 1: off
  uint64_t seed = 42;
  std::vector<int64_t> stop_tokens;     // generation ends after one of these
  std::string sampling_device = "auto"; // auto | cpu | device
};

// The ranges every caller accepts (generate, chat, serve): temperature in
// [0, kMaxTemperature] (OpenAI's), top_p in (0, 1], top_k >= 0 (0: off), at
// least one new token.
constexpr double kMaxTemperature = 2.0;
constexpr int64_t kMaxTopK = int64_t(1) << 20;
constexpr double kMaxPenalty = 10.0;
// Temperatures below this sample greedily. At 1e-6 two logits 1e-4 apart
// already differ in probability by e^-100, under float32's smallest
// normal number, so sampling is the argmax anyway; and far below it
// logits / temperature overflows float32 (1e-300 did: NaN probabilities,
// found by fuzzing orchard serve).
constexpr double kGreedyTemperature = 1e-6;
inline bool is_greedy(const SamplingOptions& o) {
  return o.temperature < kGreedyTemperature;
}

// "" when `opt` is within those ranges, else what is wrong, in the
// command line's flag names (the server reports its own field names).
std::string sampling_problem(const SamplingOptions& opt);

// Whether `opt` samples on `device` itself (else on the CPU).
bool samples_on_device(const SamplingOptions& opt, const torch::Device& device);

// Index of the next token from float logits (V,), per the options, on the
// CPU; `seen` holds the sequence so far for the repetition penalty.
int64_t sample_token(
    const torch::Tensor& logits,
    const SamplingOptions& opt,
    torch::Generator& gen,
    const std::vector<int64_t>& seen = {});

// CTRL's repetition penalty on logits (n, V) for the tokens marked in
// `seen` (n, V, bool), with each row's penalty in `penalty` (n, 1).
torch::Tensor penalize_repetition(
    const torch::Tensor& logits,
    const torch::Tensor& seen,
    const torch::Tensor& penalty);

// A generator for `device` (CUDA's own; the CPU's elsewhere) seeded with
// `seed`.
torch::Generator make_generator(const torch::Device& device, uint64_t seed);

// The sampling state of a batch of rows (one per sequence): each row's
// options and generator. Rows are added at the end and removed by moving
// the last row into the freed place, as the batch's KV cache rows are.
class Sampler {
 public:
  explicit Sampler(torch::Device device) : device_(device) {}
  // A new last row; its generator is seeded with opt.seed. All rows share
  // one mode: the first row's samples_on_device(). `context` is the
  // prompt, which the repetition penalty counts as seen.
  void add_row(
      const SamplingOptions& opt,
      const std::vector<int64_t>& context = {});
  void remove_row(int64_t row);
  int64_t rows() const {
    return int64_t(rows_.size());
  }
  const SamplingOptions& options(int64_t row) const {
    return rows_[size_t(row)].opt;
  }

  // Next tokens (n) on the logits' device for logits (n, V) of rows
  // first_row .. first_row + n - 1; with `logprobs`, each token's
  // log-probability under the model (log_softmax of the logits, before
  // temperature and truncation). The device mode does not synchronise with
  // the host.
  torch::Tensor sample(
      const torch::Tensor& logits,
      int64_t first_row = 0,
      torch::Tensor* logprobs = nullptr);

 private:
  struct Row {
    SamplingOptions opt;
    torch::Generator gen;
    std::vector<int64_t> context; // until the seen mask is made
  };
  // The repetition penalty's mask (rows, V) on the logits' device: made at
  // the first sample with a penalty, then updated with each drawn token
  // (no host synchronisation).
  void mark_seen(const torch::Tensor& logits);
  bool any_penalty_ = false;
  torch::Tensor seen_;
  torch::Tensor sample_on_device(const torch::Tensor& logits, int64_t first);
  void refresh_columns();
  torch::Device device_;
  std::vector<Row> rows_;
  bool on_device_ = false;
  // Every row's options as device columns (n, 1): temperature (1 for
  // greedy rows), top_k, top_p (2 when off), min_p (0 when off), the
  // repetition penalty, and whether the row is greedy.
  torch::Tensor temps_, ks_, ps_, min_ps_, penalties_, greedy_;
  int64_t columns_rows_ = 0;
  bool dirty_ = true;
};

} // namespace orchard::infer
