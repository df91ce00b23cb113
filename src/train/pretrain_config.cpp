#include "train/pretrain_config.h"

namespace orchard {

const config::Schema& pretrain_schema() {
  using config::field;
  using C = PretrainConfig;
  using A = models::ArchConfig;
  static const config::Schema schema = [] {
    config::Schema s("training");
    s.add(
        {.key = "stage",
         .access = field(&C::stage),
         .help = "base (pretrain), mid (chats + text, from base) or sft "
                 "(chats, loss on answers only, from mid)",
         .choices = {"base", "mid", "sft"}});
    s.add(
        {.key = "init",
         .access = field(&C::init),
         .help = "mid/sft: the model to start from (auto: the previous "
                 "stage's run of the same name; or a run/checkpoint folder)"});
    s.add(
        {.key = "chat_data",
         .access = field(&C::chat_data),
         .help = "mid/sft: chat JSONL files or folders ([] : WordNet's "
                 "questions about words); every 20th conversation validates"});
    s.add(
        {.key = "mid_text_ratio",
         .access = field(&C::mid_text_ratio),
         .help = "mid: share of the tokens that are plain text (0.3)",
         .min = 0,
         .max = 0.95});
    s.add(
        {.key = "pack",
         .access = field(&C::pack),
         .help = "sft: pack whole conversations into each row (true) or one "
                 "padded conversation per row (false)"});
    s.add(
        {.key = "lr_scale",
         .access = field(&C::lr_scale),
         .help = "multiplies every learning rate (auto: 1; 0.2 for sft)",
         .min = 0});
    s.add(
        {.key = "depth",
         .access = field(&C::depth),
         .help = "number of transformer layers; sets width and heads too "
                 "(4 default and quick, 6 overnight, 20 GPT-2 class)",
         .env = "DEPTH",
         .min = 1,
         .max = 256});
    s.add(
        {.key = "arch.n_layer",
         .access = field(&C::arch, &A::n_layer),
         .help = "layers (auto: depth)",
         .aliases = {"arch.num_hidden_layers"},
         .min = 1});
    s.add(
        {.key = "arch.n_embd",
         .access = field(&C::arch, &A::n_embd),
         .help = "model width (auto: 64 x depth)",
         .aliases = {"arch.hidden_size"},
         .min = 1});
    s.add(
        {.key = "arch.n_head",
         .access = field(&C::arch, &A::n_head),
         .help = "attention heads (auto: width / 128)",
         .aliases = {"arch.num_attention_heads"},
         .min = 1});
    s.add(
        {.key = "arch.n_kv_head",
         .access = field(&C::arch, &A::n_kv_head),
         .help = "key/value heads for grouped-query attention (auto: n_head)",
         .aliases = {"arch.num_key_value_heads"},
         .min = 1});
    s.add(
        {.key = "arch.vocab_size",
         .access = field(&C::arch, &A::vocab_size),
         .help = "vocabulary size (auto: the tokenizer's)",
         .min = 2});
    s.add(
        {.key = "data_paths",
         .access = field(&C::data_paths),
         .help =
             "text files or folders to train on ([] : the default corpus)"});
    s.add(
        {.key = "val_fraction",
         .access = field(&C::val_fraction),
         .help = "share of data_paths' documents held out for validation "
                 "(0.005: one in 200)",
         .min = 0.0001,
         .max = 0.5});
    s.add(
        {.key = "data_dir",
         .access = field(&C::data_dir),
         .help =
             "cache for tokenizers and token shards (\"\": ~/.cache/orchard)",
         .env = "ORCHARD_HOME"});
    s.add(
        {.key = "max_seq_len",
         .access = field(&C::max_seq_len),
         .help = "tokens per sequence (256; 2048 for GPT-2 class)",
         .aliases = {"max_seq_length"},
         .min = 1});
    s.add(
        {.key = "device_batch_size",
         .access = field(&C::device_batch_size),
         .help = "sequences per micro-step (auto: the largest that fits)",
         .env = "DEVICE_BATCH_SIZE",
         .aliases = {"per_device_train_batch_size"},
         .min = 1});
    s.add(
        {.key = "total_batch_size",
         .access = field(&C::total_batch_size),
         .help = "tokens per optimizer step; gradient accumulation makes up "
                 "the difference (4096)",
         .env = "TOTAL_BATCH_SIZE",
         .min = 1});
    s.add(
        {.key = "gradient_checkpointing",
         .access = field(&C::gradient_checkpointing),
         .help = "recompute each block in the backward to save memory (auto: "
                 "on only when nothing fits without it)",
         .choices = {"auto", "true", "false"}});
    s.add(
        {.key = "memory_fraction",
         .access = field(&C::memory_fraction),
         .help = "share of usable memory the planner may fill (0.8)",
         .min = 0.05,
         .max = 1});
    s.add(
        {.key = "num_iterations",
         .access = field(&C::num_iterations),
         .help = "optimizer steps (100; auto: one pass over the data)",
         .env = "BASE_ITERATIONS",
         .aliases = {"max_steps"},
         .min = 1});
    s.add(
        {.key = "epochs",
         .access = field(&C::epochs),
         .help = "passes over the training data (auto; instead of "
                 "num_iterations)",
         .aliases = {"num_train_epochs"},
         .min = 0});
    s.add(
        {.key = "target_tokens",
         .access = field(&C::target_tokens),
         .help = "tokens to train on (auto; instead of num_iterations)",
         .min = 1});
    s.add(
        {.key = "mid_iterations",
         .access = field(&C::mid_iterations),
         .help = "orchard pipeline: steps of the mid stage (40)",
         .env = "MID_ITERATIONS",
         .min = 1});
    s.add(
        {.key = "sft_iterations",
         .access = field(&C::sft_iterations),
         .help = "orchard pipeline: steps of the sft stage (40)",
         .env = "SFT_ITERATIONS",
         .min = 1});
    s.add(
        {.key = "optimizer",
         .access = field(&C::optimizer),
         .help = "muon for the transformer's matrices with AdamW for the "
                 "embedding and lm_head, or adamw for all (muon)",
         .choices = {"adamw", "muon"}});
    s.add(
        {.key = "lr",
         .access = field(&C::lr),
         .help = "peak learning rate of the transformer's matrices (auto: "
                 "3e-3 with AdamW, 0.02 with Muon)",
         .aliases = {"matrix_lr", "learning_rate"},
         .min = 0});
    s.add(
        {.key = "embedding_lr",
         .access = field(&C::embedding_lr),
         .help = "peak learning rate of the token embedding (3e-2)",
         .min = 0});
    s.add(
        {.key = "unembedding_lr",
         .access = field(&C::unembedding_lr),
         .help = "peak learning rate of lm_head (3e-3)",
         .min = 0});
    s.add(
        {.key = "warmup_steps",
         .access = field(&C::warmup_steps),
         .help = "steps of linear warmup (0)",
         .min = 0});
    s.add(
        {.key = "warmdown_ratio",
         .access = field(&C::warmdown_ratio),
         .help =
             "share of the steps over which the learning rate falls to 0 (0.2)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "weight_decay",
         .access = field(&C::weight_decay),
         .help = "decoupled weight decay of the matrices (0.0)",
         .min = 0});
    s.add(
        {.key = "grad_clip",
         .access = field(&C::grad_clip),
         .help = "clip the gradient norm to this (1.0; 0 turns it off)",
         .aliases = {"max_grad_norm"},
         .min = 0});
    s.add(
        {.key = "dtype",
         .access = field(&C::dtype),
         .help = "compute precision (auto: bfloat16 on CUDA, float32 on "
                 "MPS and CPU)",
         .choices = {"auto", "float32", "bfloat16", "float16"}});
    s.add(
        {.key = "ema",
         .access = field(&C::ema),
         .help = "keep an exponential moving average of the weights for "
                 "eval and the final model"});
    s.add(
        {.key = "ema_rate",
         .access = field(&C::ema_rate),
         .help = "EMA decay per step (0.999)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "seed",
         .access = field(&C::seed),
         .help = "seed for initialisation, data order and sampling (42)"});
    s.add(
        {.key = "tokenizer",
         .access = field(&C::tokenizer),
         .help =
             "tokenizer folder (\"\": train one on the data and cache it)"});
    s.add(
        {.key = "resume",
         .access = field(&C::resume),
         .help = "auto: continue from the run's newest checkpoint; never; or a "
                 "checkpoint folder"});
    s.add(
        {.key = "keep_best",
         .access = field(&C::keep_best),
         .help = "also keep the checkpoint with the best validation loss"});
    s.add(
        {.key = "run",
         .access = field(&C::run),
         .help = "run name: the folder runs/<stage>/<run> (\"\": the model "
                 "tag, e.g. d6)"});
    s.add(
        {.key = "run_dir",
         .access = field(&C::run_dir),
         .help = "put the run folder here instead of runs/<stage>/<run>"});
    s.add(
        {.key = "eval_every",
         .access = field(&C::eval_every),
         .help = "steps between validation losses (50; 0: only at the end)",
         .aliases = {"eval_steps"},
         .min = 0});
    s.add(
        {.key = "eval_tokens",
         .access = field(&C::eval_tokens),
         .help = "validation tokens per evaluation (16384)",
         .env = "EVAL_TOKENS",
         .min = 1});
    s.add(
        {.key = "split_tokens",
         .access = field(&C::split_tokens),
         .help = "tokens of each split (train, val) in the final loss "
                 "(auto: eval_tokens)",
         .env = "SPLIT_TOKENS",
         .min = 1});
    s.add(
        {.key = "sample_every",
         .access = field(&C::sample_every),
         .help = "steps between printed samples (50; 0: never)",
         .min = 0});
    s.add(
        {.key = "save_every",
         .access = field(&C::save_every),
         .help = "steps between checkpoints (25; 0: only at the end)",
         .aliases = {"save_steps"},
         .min = 0});
    s.add(
        {.key = "save_total_limit",
         .access = field(&C::save_total_limit),
         .help = "checkpoints kept, newest first (3; 0 keeps all)",
         .min = 0});
    return s;
  }();
  return schema;
}

models::GptConfig resolve_gpt_config(
    const PretrainConfig& cfg,
    int64_t vocab_size) {
  return models::resolve_gpt_config(
      cfg.depth, cfg.arch, cfg.max_seq_len, vocab_size);
}

} // namespace orchard
