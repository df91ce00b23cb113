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
    train::add_training_options(
        s, train::Spelling::nanochat, train::training_part<C>);
    s.add(
        {.key = "total_batch_size",
         .access = field(&C::total_batch_size),
         .help = "tokens per optimizer step; gradient accumulation makes up "
                 "the difference (4096)",
         .env = "TOTAL_BATCH_SIZE",
         .min = 1});
    s.add(
        {.key = "batch_schedule",
         .access = field(&C::batch_schedule),
         .help = "tokens per step that grow during training, in place of "
                 "total_batch_size: one entry a stage, e.g. "
                 "[2*2048*8,4*2048*8,6*2048*8] (modded-nanogpt's "
                 "train_bs_schedule: thirds of training); [] = off"});
    s.add(
        {.key = "batch_schedule_steps",
         .access = field(&C::batch_schedule_steps),
         .help = "with batch_schedule: the steps after which each later "
                 "stage begins, e.g. [300,600] ([] = equal parts)"});
    s.add(
        {.key = "gradient_checkpointing",
         .access = field(&C::gradient_checkpointing),
         .help = "recompute each block in the backward to save memory (auto: "
                 "on only when nothing fits without it)",
         .choices = {"auto", "true", "false"}});
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
        {.key = "rl_iterations",
         .access = field(&C::rl_iterations),
         .help = "orchard pipeline: GRPO steps of an rl stage after sft, on "
                 "WordNet's questions (0: none)",
         .env = "RL_ITERATIONS",
         .min = 0});
    s.add(
        {.key = "optimizer",
         .access = field(&C::optimizer),
         .help = "muon for the transformer's matrices with AdamW for the "
                 "embedding and lm_head, or adamw for all (muon)",
         .choices = {"adamw", "muon"}});
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
        {.key = "cuda_graphs",
         .access = field(&C::cuda_graphs),
         .help = "on CUDA, capture the step's forward and backward as one "
                 "CUDA graph after the first step and replay it (true; "
                 "base and mid, one process, bfloat16 or float32)"});
    s.add(
        {.key = "tokenizer",
         .access = field(&C::tokenizer),
         .help =
             "tokenizer folder (\"\": train one on the data and cache it)"});
    s.add(
        {.key = "keep_best",
         .access = field(&C::keep_best),
         .help = "also keep the checkpoint with the best validation loss"});
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
