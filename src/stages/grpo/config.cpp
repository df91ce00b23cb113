#include "stages/grpo/config.h"

#include "core/error.h"

#include <numeric>
#include <set>

namespace orchard::grpo {
namespace {

// The fine-tuning options GRPO reads, with access through GrpoConfig (the
// pointer adjusted to its FinetuneConfig part).
void add_finetune_options(config::Schema& s) {
  // Keys GRPO has no use for, or means otherwise: rows come from prompts
  // and completions (no max_seq_length, packing or token budget), and
  // num_iterations is TRL's policy updates per generation, not the steps.
  static const std::set<std::string> skipped = {
      "stage",
      "max_seq_length",
      "total_batch_size",
      "pack",
      "num_train_epochs",
      "eval_tokens",
      "max_steps"};
  for (const config::Option& o : train::finetune_schema().options()) {
    if (skipped.count(o.key))
      continue;
    config::Option copy = o;
    copy.access = [inner = o.access](void* c) {
      auto* g = static_cast<GrpoConfig*>(c);
      return inner(static_cast<train::FinetuneConfig*>(g));
    };
    if (o.key == "learning_rate")
      copy.help = "peak learning rate (auto: 1e-5 LoRA, TRL's 1e-6 full)";
    if (o.key == "data")
      copy.help = "env=answers|prompts: a JSONL of prompt (or messages) "
                  "and answer records; every 20th is held out";
    s.add(std::move(copy));
  }
}

} // namespace

const config::Schema& grpo_schema() {
  using config::field;
  using C = GrpoConfig;
  static const config::Schema schema = [] {
    config::Schema s("GRPO");
    s.add(
        {.key = "stage",
         .access = field(&C::stage),
         .help = "grpo",
         .choices = {"grpo"}});
    add_finetune_options(s);
    s.add(
        {.key = "max_steps",
         .access =
             [](void* c) -> config::FieldRef {
               return &static_cast<C*>(c)->num_iterations;
             },
         .help = "optimizer steps (200)",
         .aliases = {"iters"},
         .min = 1});
    s.add(
        {.key = "checkpoint",
         .access = field(&C::checkpoint),
         .help = "instead of model=: an Orchard run or checkpoint folder "
                 "(stage=sft's chat model)"});
    s.add(
        {.key = "adapter",
         .access = field(&C::adapter),
         .help = "start from this LoRA adapter (a PEFT folder or a "
                 "stage=lora run)"});
    s.add(
        {.key = "finetune",
         .access = field(&C::finetune),
         .help = "lora (adapters on a frozen base, as the guide), full, or "
                 "auto (lora for model=, full for checkpoint=)",
         .choices = {"auto", "lora", "full"}});
    s.add(
        {.key = "env",
         .access = field(&C::env),
         .help = "prompts and rewards: wordle, answers (data=), wordnet, "
                 "letters (the CPU demonstration), prompts (data=, "
                 "reward_cmd only)",
         .choices = {"wordle", "answers", "wordnet", "letters", "prompts"}});
    s.add(
        {.key = "words",
         .access = field(&C::words),
         .help = "wordle/letters: the word list, one word a line (\"\": "
                 "/usr/share/dict/american-english or /usr/share/dict/words)"});
    s.add(
        {.key = "reward_cmd",
         .access = field(&C::reward_cmd),
         .help = "a command that reads one JSON object per completion on "
                 "stdin and writes one JSON line of named scores"});
    s.add(
        {.key = "reward_timeout",
         .access = field(&C::reward_timeout),
         .help = "seconds reward_cmd may take to answer one line (60)",
         .min = 0.01});
    s.add(
        {.key = "reward_weights",
         .access = field(&C::reward_weights),
         .help = "one weight per reward function, built-in ones first "
                 "(auto: all 1)"});
    s.add(
        {.key = "prompt_format",
         .access = field(&C::prompt_format),
         .help = "chat (the chat template), raw (the prompt text as is) or "
                 "auto (chat when the model has a template)",
         .choices = {"auto", "chat", "raw"}});
    s.add(
        {.key = "num_generations",
         .access = field(&C::num_generations),
         .help = "completions per prompt (8, at least 2)",
         .min = 2});
    s.add(
        {.key = "max_completion_length",
         .access = field(&C::max_completion_length),
         .help = "new tokens per completion (256, every TRL release's)",
         .min = 1});
    s.add(
        {.key = "max_prompt_length",
         .access = field(&C::max_prompt_length),
         .help = "prompt tokens kept, from the end (512)",
         .min = 1});
    s.add(
        {.key = "temperature",
         .access = field(&C::temperature),
         .help = "sampling temperature; log-probabilities use it too (1.0)",
         .min = 0.01,
         .max = 2});
    s.add(
        {.key = "top_p",
         .access = field(&C::top_p),
         .help = "nucleus sampling (1.0: off)",
         .min = 0.0001,
         .max = 1});
    s.add(
        {.key = "top_k",
         .access = field(&C::top_k),
         .help = "top-k sampling (0: off)",
         .min = 0});
    s.add(
        {.key = "min_p",
         .access = field(&C::min_p),
         .help = "drop tokens less likely than min_p x the likeliest (0: "
                 "off)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "repetition_penalty",
         .access = field(&C::repetition_penalty),
         .help = "CTRL's penalty on tokens already in the prompt or "
                 "completion (1.0: off)",
         .min = 0.01,
         .max = 10});
    s.add(
        {.key = "generation_batch_size",
         .access = field(&C::generation_batch_size),
         .help = "completions per generation, a multiple of "
                 "num_generations (auto: one optimizer step's)",
         .min = 1});
    s.add(
        {.key = "steps_per_generation",
         .access = field(&C::steps_per_generation),
         .help = "micro-steps each generation feeds (auto: "
                 "gradient_accumulation_steps)",
         .min = 1});
    s.add(
        {.key = "sampling_device",
         .access = field(&C::sampling_device),
         .help = "where rollouts sample: auto, cpu or device",
         .choices = {"auto", "cpu", "device"}});
    s.add(
        {.key = "beta",
         .access = field(&C::beta),
         .help = "KL coefficient against the reference (0: no reference)",
         .min = 0});
    s.add(
        {.key = "epsilon",
         .access = field(&C::epsilon),
         .help = "clipping range below (and above, unless epsilon_high) 1 "
                 "(0.2)",
         .min = 0});
    s.add(
        {.key = "epsilon_high",
         .access = field(&C::epsilon_high),
         .help = "clipping range above 1 (auto: epsilon)",
         .min = 0});
    s.add(
        {.key = "delta",
         .access = field(&C::delta),
         .help = "upper bound on the unclipped ratio (auto: none)",
         .min = 1});
    s.add(
        {.key = "num_iterations",
         .access = field(&C::policy_iterations),
         .help = "TRL's: optimizer passes over each generation (1)",
         .aliases = {"num_policy_iterations"},
         .min = 1});
    s.add(
        {.key = "importance_sampling_level",
         .access = field(&C::importance_sampling_level),
         .help = "token (GRPO) or sequence (GSPO) ratios",
         .choices = {"token", "sequence"}});
    s.add(
        {.key = "scale_rewards",
         .access = field(&C::scale_rewards),
         .help = "divide advantages by the group's std, the batch's, or "
                 "none",
         .choices = {"group", "batch", "none"}});
    s.add(
        {.key = "loss_type",
         .access = field(&C::loss_type),
         .help = "dapo (TRL's default), grpo, dr_grpo or bnpo",
         .choices = {"dapo", "grpo", "dr_grpo", "bnpo"}});
    s.add(
        {.key = "mask_truncated_completions",
         .access = field(&C::mask_truncated_completions),
         .help = "completions cut at max_completion_length count for "
                 "nothing in the loss (false)"});
    s.add(
        {.key = "logging_steps",
         .access = field(&C::logging_steps),
         .help = "write train.log's step line every N steps (1)",
         .min = 1});
    s.add(
        {.key = "sample_every",
         .access = field(&C::sample_every),
         .help = "print sample completions every N steps (0: off)",
         .min = 0});
    s.add(
        {.key = "eval_prompts",
         .access = field(&C::eval_prompts),
         .help = "held-out prompts per evaluation (16), num_generations "
                 "completions each",
         .min = 1});
    return s;
  }();
  return schema;
}

int64_t grpo_rows_per_step(const GrpoConfig& cfg) {
  return cfg.device_batch_size.value_or(train::kDefaultRowsPerDevice) *
      cfg.gradient_accumulation_steps;
}

int64_t grpo_generation_batch(const GrpoConfig& cfg) {
  const int64_t per_device =
      cfg.device_batch_size.value_or(train::kDefaultRowsPerDevice);
  if (cfg.generation_batch_size && cfg.steps_per_generation)
    throw UserError(
        "generation_batch_size and steps_per_generation both set; set one "
        "(generation_batch_size = per_device_train_batch_size x "
        "steps_per_generation).");
  if (cfg.generation_batch_size)
    return *cfg.generation_batch_size;
  return per_device *
      cfg.steps_per_generation.value_or(cfg.gradient_accumulation_steps);
}

GrpoShape grpo_shape(
    const GrpoConfig& cfg,
    int64_t micro_batch,
    int64_t world) {
  GrpoShape s;
  s.rows_per_step = grpo_rows_per_step(cfg);
  s.generation_batch = grpo_generation_batch(cfg);
  const int64_t G = cfg.num_generations;
  if (s.generation_batch * world % G != 0) {
    // The nearest valid values of the setting itself (per process).
    const int64_t step = G / std::gcd(G, world);
    const int64_t below = s.generation_batch / step * step;
    const int64_t above = below + step;
    throw UserError(
        "generation_batch_size=" + std::to_string(s.generation_batch) +
        (cfg.generation_batch_size
             ? std::string()
             : " (per_device_train_batch_size x steps_per_generation)") +
        (world > 1 ? " x " + std::to_string(world) + " processes = " +
                 std::to_string(s.generation_batch * world)
                   : std::string()) +
        " is not a multiple of num_generations=" + std::to_string(G) +
        ": each prompt's completions must be in one generation. Nearest "
        "valid values: " +
        (below > 0 ? std::to_string(below) + " or " : std::string()) +
        std::to_string(above) + ".");
  }
  s.prompts_per_generation = s.generation_batch * world / G;
  s.micro_batch = micro_batch;
  if (s.rows_per_step % micro_batch != 0 ||
      s.generation_batch % micro_batch != 0)
    throw UserError(
        "per_device_train_batch_size=" + std::to_string(micro_batch) +
        " does not divide both the " + std::to_string(s.rows_per_step) +
        " completions per optimizer step and the generation batch of " +
        std::to_string(s.generation_batch) + "; choose a divisor of " +
        std::to_string(std::gcd(s.rows_per_step, s.generation_batch)) + ".");
  s.accumulation = s.rows_per_step / micro_batch;
  return s;
}

} // namespace orchard::grpo
