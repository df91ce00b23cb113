#include "train/training_config.h"

#include <utility>
#include <vector>

namespace orchard::train {

void add_training_options(
    config::Schema& s,
    Spelling spelling,
    TrainingConfig* (*base)(void*)) {
  using T = TrainingConfig;
  const bool hf = spelling == Spelling::transformers;
  // The field `m` of the section's TrainingConfig.
  auto at = [base](auto T::*m) -> config::FieldAccess {
    return [base, m](void* c) -> config::FieldRef { return &(base(c)->*m); };
  };
  // The key in this spelling, the other spelling and `more` as aliases.
  struct Names {
    std::string key;
    std::vector<std::string> aliases;
  };
  auto spelt = [hf](
                   std::string nanochat,
                   std::string transformers,
                   std::vector<std::string> more = {}) {
    Names n{hf ? transformers : nanochat, {hf ? nanochat : transformers}};
    for (auto& a : more)
      if (a != n.key)
        n.aliases.push_back(std::move(a));
    return n;
  };

  s.add(
      {.key = "data_dir",
       .access = at(&T::data_dir),
       .help = "cache for tokenizers, token shards and tokenized chats "
               "(\"\": $ORCHARD_HOME or ~/.cache/orchard)",
       .env = "ORCHARD_HOME"});
  {
    Names n = spelt("max_seq_len", "max_seq_length", {"max_length"});
    s.add(
        {.key = n.key,
         .access = at(&T::max_seq_len),
         .help = hf ? "tokens per row; longer conversations are truncated "
                      "(auto: 1024 or the model's positions if fewer)"
                    : "tokens per sequence (256; 2048 for GPT-2 class)",
         .aliases = n.aliases,
         .min = hf ? 8 : 1});
  }
  s.add(
      {.key = "device_batch_size",
       .access = at(&T::device_batch_size),
       .help = "rows per micro-step (auto: the largest the memory plan fits; "
               "accumulation makes up the step)",
       .env = "DEVICE_BATCH_SIZE",
       .aliases = {"per_device_train_batch_size", "batch_size"},
       .min = 1});
  s.add(
      {.key = "memory_fraction",
       .access = at(&T::memory_fraction),
       .help = "share of usable memory the memory plan may fill (0.8)",
       .min = 0.05,
       .max = 1});
  {
    Names n = spelt("num_iterations", "max_steps", {"iters"});
    s.add(
        {.key = n.key,
         .access = at(&T::num_iterations),
         .help = hf ? "optimizer steps (auto: num_train_epochs' worth)"
                    : "optimizer steps (100; auto: one pass over the data)",
         // The quickstart's variable; a fine-tune does not read it.
         .env = hf ? "" : "BASE_ITERATIONS",
         .aliases = n.aliases,
         .min = 1});
  }
  {
    Names n = spelt("epochs", "num_train_epochs");
    s.add(
        {.key = n.key,
         .access = at(&T::epochs),
         .help = hf ? "passes over the training data (1 when max_steps is "
                      "unset; a fraction works)"
                    : "passes over the training data (auto; instead of "
                      "num_iterations)",
         .aliases = n.aliases,
         .min = hf ? 0.0001 : 0});
  }
  {
    Names n = spelt("lr", "learning_rate", {"matrix_lr"});
    s.add(
        {.key = n.key,
         .access = at(&T::lr),
         .help = hf ? "peak learning rate (auto: 2e-4 lora, 1e-5 full)"
                    : "peak learning rate of the transformer's matrices "
                      "(auto: 3e-3 with AdamW, 0.02 with Muon)",
         .aliases = n.aliases,
         .min = 0});
  }
  s.add(
      {.key = "warmup_steps",
       .access = at(&T::warmup_steps),
       .help = "steps of linear warmup (0)",
       .min = 0});
  s.add(
      {.key = "warmdown_ratio",
       .access = at(&T::warmdown_ratio),
       .help = hf ? "share of the run over which the rate decays linearly to "
                    "zero (1: transformers' linear schedule; 0: constant)"
                  : "share of the steps over which the learning rate falls "
                    "to 0 (0.2)",
       .min = 0,
       .max = 1});
  s.add(
      {.key = "weight_decay",
       .access = at(&T::weight_decay),
       .help = hf ? "AdamW weight decay (0)"
                  : "decoupled weight decay of the matrices (0.0)",
       .min = 0});
  {
    Names n = spelt("grad_clip", "max_grad_norm");
    s.add(
        {.key = n.key,
         .access = at(&T::grad_clip),
         .help = "clip the gradient norm to this (1.0; 0 turns it off)",
         .aliases = n.aliases,
         .min = 0});
  }
  s.add(
      {.key = "zero_stage",
       .access = at(&T::zero_stage),
       .help = "with several processes, 1 shards the optimizer state over "
               "them (ZeRO-1: gradients reduce-scattered, weights "
               "all-gathered; each rank keeps 1/N of the state, a GPT's "
               "embedding whole); 0 keeps all of it on every rank (0)",
       .min = 0,
       .max = 1});
  s.add(
      {.key = "grad_reduce_dtype",
       .access = at(&T::grad_reduce_dtype),
       .help = "with several processes, the dtype gradients are averaged "
               "in: float32 (as PyTorch DDP), or bfloat16 (half the bytes "
               "sent, as DDP's bf16_compress_hook; each rank's gradient is "
               "rounded to bfloat16 first) (float32)",
       .choices = {"float32", "bfloat16"}});
  s.add(
      {.key = "bucket_cap_mb",
       .access = at(&T::bucket_cap_mb),
       .help =
           "with several processes, the most MB of gradients sent in "
           "one collective while the backward runs (as PyTorch DDP's "
           "bucket_cap_mb, whose default is 25; with zero_stage=1, a rank's "
           "share) (100)",
       .min = 1,
       .max = 4096});
  s.add(
      {.key = "grad_average",
       .access = at(&T::grad_average),
       .help = "with several processes on CUDA, what moves the gradients: "
               "copy_engines (the GPUs' copy engines through PyTorch's "
               "symmetric memory, no SMs held while the backward runs; "
               "every process on one host), nccl (NCCL's kernels), or auto "
               "(copy engines where they can, else NCCL) (auto)",
       .choices = {"auto", "nccl", "copy_engines"}});
  s.add(
      {.key = "dtype",
       .access = at(&T::dtype),
       .help = hf ? "lora: the frozen base's dtype; full: autocast's (auto: "
                    "bfloat16 on CUDA 8.0+, else float32)"
                  : "compute precision (auto: bfloat16 on CUDA, float32 on "
                    "MPS and CPU)",
       .choices = {"auto", "float32", "bfloat16", "float16"}});
  s.add(
      {.key = "seed",
       .access = at(&T::seed),
       .help = "seed for initialisation, data order and sampling (42)"});
  s.add(
      {.key = "run",
       .access = at(&T::run),
       .help = hf ? "run name (\"\": the model folder's name); the run "
                    "folder is runs/<stage>/<run>"
                  : "run name: the folder runs/<stage>/<run> (\"\": the "
                    "model tag, e.g. d6)"});
  s.add(
      {.key = "run_dir",
       .access = at(&T::run_dir),
       .help = "put the run folder here instead of runs/<stage>/<run>",
       .aliases = {"output_dir"}});
  s.add(
      {.key = "resume",
       .access = at(&T::resume),
       .help = "auto: continue from the run's newest checkpoint; never; or a "
               "checkpoint folder"});
  {
    Names n = spelt("eval_every", "eval_steps");
    s.add(
        {.key = n.key,
         .access = at(&T::eval_every),
         .help = "steps between validation losses (0: only at the end)",
         .aliases = n.aliases,
         .min = 0});
  }
  s.add(
      {.key = "eval_tokens",
       .access = at(&T::eval_tokens),
       .help = "validation tokens per evaluation (16384)",
       .env = "EVAL_TOKENS",
       .min = 1});
  {
    Names n = spelt("save_every", "save_steps");
    s.add(
        {.key = n.key,
         .access = at(&T::save_every),
         .help = "steps between checkpoints (0: only at the end)",
         .aliases = n.aliases,
         .min = 0});
  }
  s.add(
      {.key = "save_total_limit",
       .access = at(&T::save_total_limit),
       .help = "checkpoints kept, newest first (3; 0 keeps all)",
       .min = 0});
}

} // namespace orchard::train
