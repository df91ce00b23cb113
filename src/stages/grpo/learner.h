// GRPO's step, whatever the model: rollouts from the batched engine
// (infer/engine.h: N prompts x G samples, sampled on the device), rewards
// from the environment and reward_cmd, group advantages, and the clipped
// policy loss of each micro-batch (objective.h), as TRL's GRPOTrainer
// computes them. The Trainer (train/trainer.h) owns the optimizer, the
// schedule, checkpoints and resume; the stage (grpo_stage.cpp) loads the
// model and hands a Learner's micro_step to it.
//
// Buffering follows TRL: a generation makes generation_batch completions
// (prompts_per_generation prompts x num_generations); micro-steps take
// them micro_batch at a time; after num_iterations passes over them the
// next micro-step generates again. The buffer is part of the data state,
// so a checkpoint taken mid-buffer resumes with the same completions.
#pragma once

#include "infer/engine.h"
#include "models/language_model.h"
#include "stages/grpo/environment.h"
#include "stages/grpo/objective.h"
#include "stages/grpo/reward_process.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace orchard::grpo {

// Prompts to token ids and completions to text for one model: through its
// chat template, or as raw text after the document-start token.
class Prompter {
 public:
  // `chat` null: raw prompts. Prompts keep their last `max_prompt_length`
  // tokens.
  Prompter(
      std::shared_ptr<const text::Tokenizer> tokenizer,
      std::shared_ptr<const text::ChatTemplate> chat,
      int64_t max_prompt_length);
  std::vector<int64_t> ids(const Example& example) const;
  // Tokens that end a completion.
  const std::vector<int64_t>& stops() const {
    return stops_;
  }
  // The text of a completion, its stop token left out.
  std::string text(const std::vector<int64_t>& completion) const;
  bool chat() const {
    return chat_ != nullptr;
  }

 private:
  std::shared_ptr<const text::Tokenizer> tok_;
  std::shared_ptr<const text::ChatTemplate> chat_;
  int64_t max_prompt_;
  std::vector<int64_t> stops_;
};

struct LearnerOptions {
  int64_t num_generations = 8;
  int64_t generation_batch = 16; // completions per generation
  int64_t max_completion_length = 256;
  int64_t policy_iterations = 1; // TRL's num_iterations
  // Whether the policy changes between a generation and the last
  // micro-step using it (more than one optimizer step per generation, or
  // num_iterations > 1): then the rollout's log-probabilities are kept as
  // the old ones (one extra forward pass per generation).
  bool keep_old_logps = false;
  double temperature = 1.0;
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  int64_t top_k = 0;
  std::string sampling_device = "auto";
  ScaleRewards scale = ScaleRewards::group;
  LossOptions loss;
  bool mask_truncated = false;
  // Completions per optimizer step: the Trainer's accumulation is this over
  // the micro-batch (dapo undoes its division).
  int64_t rows_per_step = 8;
  std::vector<double> weights; // per reward function (env's, then cmd's)
  uint64_t seed = 42;
  bool graphs = true; // CUDA graphs for rollouts where available
  // Several processes (dist): every rank walks the same prompt order and
  // takes the rank-th share of each generation's prompts (generation_batch
  // is its own share); rows are seeded by their place in the whole
  // generation and advantages taken over all of it, as one process would.
  int rank = 0, world = 1;
  // The control of the learning test: every advantage 0, so the loss
  // carries no signal from the rewards.
  bool zero_advantages = false;
};

// The policy and what it is scored against.
struct Policy {
  std::shared_ptr<models::LanguageModel> model; // trained in place
  torch::Device device{torch::kCPU};
  // beta > 0: runs `fn` with the reference model (the policy with its
  // adapters switched off, or a frozen copy).
  std::function<void(const std::function<void(models::LanguageModel&)>& fn)>
      with_reference;
};

// One held-out evaluation.
struct Evaluation {
  double reward = 0; // mean weighted total
  std::vector<std::pair<std::string, double>> per_function;
  int64_t completions = 0;
  // The share of completions the environment counts as right (0 when it
  // has no such notion: success_label() is "").
  double success = 0;
};

class Learner {
 public:
  Learner(
      LearnerOptions options,
      Policy policy,
      const Environment& env,
      std::shared_ptr<const Prompter> prompter,
      RewardProcess* rewards); // may be null
  ~Learner();

  // Every reward function's name: the environment's, then reward_cmd's
  // (known after its first answer; call after a generation).
  std::vector<std::string> reward_names() const;

  // The loss of the next `micro_batch` completions (generating first when
  // the buffer is used up), as the Trainer expects: it divides by the
  // accumulation steps, so dapo's loss is scaled up to undo that.
  torch::Tensor micro_step(int64_t micro_batch);

  // Per-token log-probabilities (B, C) of each row's completion tokens
  // under `model`, from logits / temperature as in the loss: rows of `ids`
  // (B, L) are right-padded, and row r's completion starts at column
  // starts[r]. Columns past a row's completion are padding.
  torch::Tensor logps(
      models::LanguageModel& model,
      const torch::Tensor& ids,
      const torch::Tensor& starts,
      int64_t completion_len);

  // Metrics since the last call: the latest generation's (rewards per
  // function, std, lengths, seconds) and the micro-steps' means (KL, clip
  // ratios).
  std::map<std::string, double> step_metrics();
  // One line for the progress output: "reward 0.42 (±0.31)".
  std::string progress_note() const;

  // Mean rewards over `prompts` held-out prompts x num_generations
  // completions, sampled with a fixed seed.
  Evaluation evaluate(int64_t prompts);
  // `count` held-out prompts' first completions, with their rewards.
  struct Sample {
    std::string prompt, completion;
    double reward = 0;
    std::string reference; // the example's "reference" column, if any
  };
  std::vector<Sample> samples(int count, uint64_t seed);

  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

  // Seconds spent since construction: generating, scoring.
  double generation_seconds() const {
    return gen_seconds_;
  }

 private:
  struct Buffer;
  // Rollouts of prompts [first, first + n) of `pool` (held-out or
  // training), `samples` each, with rewards.
  struct Scored {
    std::vector<std::vector<int64_t>> prompt_ids; // per prompt
    std::vector<std::vector<int64_t>> completions; // per row
    std::vector<char> truncated;
    std::vector<std::vector<double>> scores; // per row, per function
    std::vector<double> totals;
    double tokens_per_s = 0, gen_s = 0, score_s = 0;
  };
  Scored rollout(
      const std::vector<const Example*>& examples,
      int64_t samples,
      uint64_t seed);
  void generate();
  // Rows [row0, row0 + n) of the buffer as a right-padded batch.
  void batch_rows(
      int64_t row0,
      int64_t n,
      torch::Tensor& ids,
      torch::Tensor& starts,
      torch::Tensor& targets,
      torch::Tensor& mask,
      int64_t& width) const;

  LearnerOptions opt_;
  Policy policy_;
  const Environment& env_;
  std::shared_ptr<const Prompter> prompter_;
  RewardProcess* rewards_;
  std::unique_ptr<infer::Engine> engine_;
  std::unique_ptr<Buffer> buffer_;
  // Prompt order: a shuffled permutation of the training prompts per epoch.
  int64_t epoch_ = 0, cursor_ = 0, generations_ = 0;
  std::vector<int64_t> order_;
  void shuffle_epoch();
  // Metrics.
  std::map<std::string, double> gen_metrics_;
  std::map<std::string, double> loss_sums_;
  int64_t loss_count_ = 0;
  double gen_seconds_ = 0;
};

} // namespace orchard::grpo
