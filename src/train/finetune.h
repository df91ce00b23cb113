// Fine-tuning a Hugging Face model folder: `orchard train stage=lora` (the
// base frozen in bfloat16, float16 or float32; LoRA adapters trained in
// float32 and saved in PEFT's format) and `stage=full` (every weight
// trained, float32 master weights under autocast).
//
// The keys users know from transformers' TrainingArguments and the Apple
// Silicon guides are accepted under their names (per_device_train_batch_size,
// gradient_accumulation_steps, num_train_epochs, max_seq_length, fp16, bf16,
// gradient_checkpointing, optim, save_steps, save_total_limit, learning_rate,
// ...). Data: chat JSONL (OpenAI messages or ShareGPT) rendered with the
// model's chat template and trained on the assistant's tokens only;
// prompt/completion and text records too (data/chat_prep.h).
//
// The run folder is runs/<stage>/<run>: checkpoints (adapters or weights,
// optimizer, data position) resume exactly as base training does; at the end
// runs/lora/<run>/adapter/ holds the PEFT adapter and runs/full/<run>/model/
// a model folder transformers loads.
#pragma once

#include "core/config.h"
#include "core/device.h"
#include "models/hf/model.h"
#include "train/optimizer.h"
#include "train/pretrain.h"
#include "train/training_config.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace orchard::train {

// Tokens per row by default (fewer when the model has fewer positions).
constexpr int64_t kDefaultMaxSeqLength = 1024;

struct FinetuneConfig : TrainingConfig {
  // The shared knobs (train/training_config.h) at transformers' defaults:
  // rows of 1024 tokens (fewer when the model has fewer positions), one
  // epoch unless max_steps is set, a linear decay to zero, evaluation and a
  // checkpoint every 100 steps.
  FinetuneConfig() {
    max_seq_len = kDefaultMaxSeqLength;
    num_iterations.reset();
    warmdown_ratio = 1.0;
    eval_every = 100;
    save_every = 100;
  }

  std::string stage = "lora";    // lora | full
  std::string model;             // a Hugging Face model folder
  std::vector<std::string> data; // JSONL files or folders
  // auto: the model folder's own Jinja chat template; or a built-in family
  // (llama3, chatml, mistral, orchard) for a template Orchard cannot render.
  std::string chat_template = "auto";

  int64_t lora_r = 16;
  double lora_alpha = 32;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_target_modules = models::llama_projections();

  // The recipe is the effective batch, the same on every machine: rows per
  // optimizer step = device_batch_size x gradient_accumulation_steps as
  // written (kDefaultRowsPerDevice for an auto device_batch_size), or
  // total_batch_size / max_seq_len when that is set. With
  // device_batch_size=auto the machine picks the micro-batch (a divisor of
  // the rows that fits) and accumulation makes up the rest.
  int64_t gradient_accumulation_steps = 1;
  std::optional<int64_t> total_batch_size; // tokens per optimizer step
  bool pack = true; // whole conversations back to back in each row

  // lr (shared): auto = 2e-4 lora, 1e-5 full.
  // adamw_torch (float32 moments) or adamw_8bit (8-bit moments, a quarter
  // of the memory; train/low_precision_state.h); auto: see
  // resolve_auto_precision (stage=grpo's default).
  std::string optim = "adamw_torch";
  // full: float32 (a float32 copy of every weight, computing under
  // autocast) or bfloat16 (the weights themselves in bfloat16, updated
  // with stochastic rounding: half the weights' and gradients' memory);
  // auto: see resolve_auto_precision (stage=grpo's default).
  std::string weights_dtype = "float32";
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;

  // dtype (shared) -- lora: the base weights' dtype; full: autocast's
  // (weights stay float32). auto: bfloat16 on CUDA (compute capability 8+),
  // float32 on MPS, the CPU and older GPUs. fp16 / bf16 are transformers'
  // switches.
  bool fp16 = false, bf16 = false;
  bool gradient_checkpointing = true;
  // lora: hold the layers' projections in 4 bits (NF4, QLoRA), the name
  // transformers' BitsAndBytesConfig uses; the base's dtype above is then
  // the compute dtype and that of everything else (embeddings, norms).
  bool load_in_4bit = false;
};

const config::Schema& finetune_schema();

// transformers' per_device_train_batch_size default: the rows an auto
// device_batch_size stands for in the effective batch.
constexpr int64_t kDefaultRowsPerDevice = 8;

// Rows per optimizer step on this process (see FinetuneConfig): with
// several processes (src/dist) total_batch_size is shared among them, while
// device_batch_size x gradient_accumulation_steps is each one's, as in
// Hugging Face's Trainer. UserError when total_batch_size is not a whole
// number of rows or of rows per process, or a set device_batch_size does
// not divide them.
int64_t finetune_rows_per_step(const FinetuneConfig& cfg);

// The adapters `cfg` asks for (lora.r, lora.alpha, lora.dropout, its
// target modules normalized).
models::LoraSpec lora_spec(const FinetuneConfig& cfg);

// A LoRA or full fine-tuning run's memory (finetune_memory.cpp), in bytes (base
// weights, trainable weights, gradients, AdamW state, activations of B x T
// tokens with or without checkpointing, the loss's logits chunks (for LoRA only
// what they need beyond the activations, as the loss is done before the
// backward starts), a workspace margin). Measured against `orchard plan
// --probe` in bench/RESULTS.md.
struct FinetuneMemory {
  double weights = 0, trainable = 0, gradients = 0, optimizer = 0;
  double activations = 0, logits = 0, workspace = 0;
  double total() const {
    return weights + trainable + gradients + optimizer + activations + logits +
        workspace;
  }
};
// On `device`: where its attention keeps the scores for the backward
// (attention_keeps_no_scores), they count. With `processes` ranks
// (dist::size() by default) each plans its own: the gradient averager's
// buckets beside the gradients, and with zero_stage=1 its share of the
// optimizer state.
FinetuneMemory finetune_memory(
    const models::HfModelConfig& model,
    const FinetuneConfig& cfg,
    torch::ScalarType base_dtype,
    int64_t micro_batch,
    c10::DeviceType device,
    int processes = 0);

// Micro-batches 1, 2, 4, 8, 16 with their estimates against the budget; the
// choice is device_batch_size when set, else the largest that fits and
// divides the rows per step (1 when none fits, with fits = false).
struct FinetunePlan {
  struct Row {
    int64_t batch = 0;
    FinetuneMemory memory;
    bool fits = false;
  };
  std::vector<Row> rows;
  Row choice;
  uint64_t budget = 0;
  std::string budget_why, why;
};
FinetunePlan plan_finetune(
    const models::HfModelConfig& model,
    const FinetuneConfig& cfg,
    torch::ScalarType base_dtype,
    const DeviceInfo& device);
// The plan as `orchard plan` prints it.
std::string finetune_plan_table(const FinetunePlan& plan);

// weights_dtype=auto and optim=auto, made concrete for `device` and the
// dtype the model's weights are stored in (`stored`; nullopt for an Orchard
// GPT, stored in float32). A full fine-tune of a bfloat16 checkpoint on a
// GPU that computes bfloat16 holds its weights in bfloat16, as TRL and
// transformers train such a model, and AdamW's moments in 8 bits (TRL's
// torch AdamW keeps them in the weights' bfloat16: twice that); anything
// else (LoRA, a float32 checkpoint, the CPU, MPS, older GPUs) trains float32
// weights with float32 moments. Settings that are not auto are kept.
// Returns why auto chose what it did ("" when nothing was auto).
std::string resolve_auto_precision(
    FinetuneConfig& cfg,
    const DeviceInfo& device,
    std::optional<torch::ScalarType> stored);

// The dtype stage=full holds its weights in (FinetuneConfig::weights_dtype,
// resolved); UserError for weights_dtype=bfloat16 with LoRA, whose base is
// `dtype`'s.
torch::ScalarType full_weights_dtype(const FinetuneConfig& cfg);

// stage=full's precision: autocast as dtype / fp16 / bf16 say, named for
// the weights' dtype.
Precision full_precision(const FinetuneConfig& cfg, const DeviceInfo& device);

// AdamW's settings from `cfg`: betas, epsilon, 8-bit moments for
// optim=adamw_8bit, the seed of bfloat16 weights' stochastic rounding.
OptimizerOptions finetune_optimizer_options(const FinetuneConfig& cfg);

// The base weights' dtype for `cfg` on `device` (see FinetuneConfig::dtype).
torch::ScalarType finetune_dtype(
    const FinetuneConfig& cfg,
    const DeviceInfo& device);

// Measuring what plan_finetune predicts: loads the model as a run would
// (dtype, 4 bits, LoRA, checkpointing), takes two optimizer steps of
// `batch` rows of max_seq_length random tokens (times
// gradient_accumulation_steps), and reads the peak of the second above
// what was in use before the model was loaded (core/memory_stats.h says
// what is read on each device). An out-of-memory error propagates as
// c10::Error for the caller to report.
struct FinetuneProbe {
  double measured = 0; // bytes
  FinetuneMemory predicted;
};
FinetuneProbe measure_finetune_peak(
    const FinetuneConfig& cfg,
    const DeviceInfo& device,
    int64_t batch);

// Trains stage=lora|full; `result.output_dir` is the adapter or model
// folder, `chat_val` the held-out records and `tokenizer_dir` the model
// folder.
TrainResult run_finetune(
    const FinetuneConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device);

} // namespace orchard::train
