// The settings of `orchard train stage=grpo`, in TRL's GRPOConfig names
// (trl 1.9 / main 1.10.0.dev0) on top of the fine-tuning ones (model,
// lora.*, load_in_4bit, dtype, gradient_checkpointing, learning_rate, ...:
// train/finetune.h), and how they turn into batch sizes.
//
// Differences from TRL, on purpose:
// - max_completion_length defaults to 256, every TRL release's value (main
//   has 512).
// - max_prompt_length (gone from TRL since 0.29) is kept: prompts longer
//   than it lose their start.
// - per_device_train_batch_size may be auto (the memory plan's micro-batch);
//   the effective batch then counts it as transformers' default 8, so the
//   recipe is the same on every machine.
// - learning_rate auto is TRL's 1e-6 for finetune=full and 1e-5 for LoRA
//   (an adapter starts at zero; 1e-6 barely moves it in a short run).
// - weights_dtype and optim default to auto: a full fine-tune of a
//   bfloat16 checkpoint on a GPU holds its weights in bfloat16, as TRL
//   does, but AdamW's moments in 8 bits rather than TRL's bfloat16.
#pragma once

#include "core/config.h"
#include "train/finetune.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard::grpo {

struct GrpoConfig : train::FinetuneConfig {
  GrpoConfig() {
    stage = "lora";
    lr.reset();
    num_iterations = 200; // max_steps
    eval_every = 50;
    save_every = 50;
    device_batch_size.reset();
    // A full fine-tune of a bfloat16 checkpoint on a GPU: bfloat16 weights
    // and 8-bit AdamW moments (train::resolve_auto_precision).
    weights_dtype = "auto";
    optim = "auto";
  }

  // The policy: a Hugging Face folder (model=, from FinetuneConfig) or an
  // Orchard run or checkpoint (stage=sft's), trained with LoRA or fully.
  std::string checkpoint;
  std::string adapter;          // start from this PEFT adapter
  std::string finetune = "auto"; // lora | full | auto (lora for model=, full for checkpoint=)

  // The environment: prompts and built-in rewards.
  std::string env = "wordle"; // wordle | answers | wordnet | letters | prompts
  std::string words;          // wordle/letters: the word list ("": the system's)
  std::string reward_cmd;     // a child process scoring completions
  double reward_timeout = 60; // seconds the process may take per batch
  std::vector<std::string> reward_weights; // one number per reward function
  // How prompts reach the model: chat (the chat template), raw (the text
  // itself), auto (chat when the model has a template).
  std::string prompt_format = "auto";

  // Generation (TRL's names).
  int64_t num_generations = 8;
  int64_t max_completion_length = 256;
  int64_t max_prompt_length = 512;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  std::optional<int64_t> generation_batch_size;
  std::optional<int64_t> steps_per_generation;
  std::string sampling_device = "auto";

  // The objective (TRL's names and defaults).
  double beta = 0.0;
  double epsilon = 0.2;
  std::optional<double> epsilon_high; // auto: epsilon
  std::optional<double> delta;
  int64_t policy_iterations = 1; // TRL's num_iterations
  std::string importance_sampling_level = "token";
  std::string scale_rewards = "group";
  std::string loss_type = "dapo";
  bool mask_truncated_completions = false;

  // Logging and evaluation.
  int64_t logging_steps = 1;
  int64_t sample_every = 0;   // print sample completions every N steps
  int64_t eval_prompts = 16;  // held-out prompts per evaluation
};

const config::Schema& grpo_schema();

// The batch arithmetic of a run.
struct GrpoShape {
  int64_t rows_per_step = 0;    // completions per optimizer step
  int64_t generation_batch = 0; // completions per generation
  int64_t prompts_per_generation = 0; // over all processes
  int64_t micro_batch = 0;      // completions per micro-step (as set or planned)
  int64_t accumulation = 0;     // micro-steps per optimizer step
};

// Checks the settings that do not need the model and works out the batch;
// `micro_batch`: the one chosen (device_batch_size or the plan's). UserError
// naming the key and the nearest valid values for a batch that does not
// divide (generation_batch_size by num_generations, ...). With `world`
// processes the generation is theirs together (TRL's): its completions,
// generation_batch x world, must be whole prompts' groups, while one
// prompt's group may be split between two processes.
GrpoShape grpo_shape(
    const GrpoConfig& cfg,
    int64_t micro_batch,
    int64_t world = 1);

// The rows per optimizer step before a micro-batch is chosen, and the
// micro-batches that divide both it and the generation batch.
int64_t grpo_rows_per_step(const GrpoConfig& cfg);
int64_t grpo_generation_batch(const GrpoConfig& cfg);

} // namespace orchard::grpo
