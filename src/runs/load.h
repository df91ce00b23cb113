// The one loader: whatever a command names as its model — a run of
// `orchard train` (its newest good checkpoint), a checkpoint folder, or a
// Hugging Face model folder with an optional LoRA adapter — comes back as
// the model, its tokenizer and the chat template conversations are
// rendered with. generate, chat, serve, the pipeline and the stages'
// samples load through here; mid and sft start from load_gpt.
#pragma once

#include "core/device.h"
#include "models/gpt.h"
#include "models/language_model.h"
#include "runs/checkpoint.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace orchard::runs {

// Which model: `-i STAGE [--run NAME]` (the stage's run, the newest when no
// name is given), `--checkpoint DIR` (a run or checkpoint folder), or
// `--model DIR [--adapter DIR]` (a Hugging Face folder, with a PEFT adapter
// folder or an `orchard train stage=lora` run folder).
struct ModelSource {
  std::string stage, run, checkpoint;
  std::string model_dir, adapter;
  std::string chat_template; // "": the folder's own; or a built-in family
  // With model_dir: the weights' dtype, auto (core/dtype.h's choice for the
  // device) | float32 | bfloat16 | float16; "" is auto.
  std::string dtype;
};

// The run or checkpoint folder (or the HF folder); UserError when the
// source names none, or two kinds at once.
std::string model_path(const ModelSource& source);
// An adapter folder: `path` itself, or <path>/adapter (a LoRA run folder).
std::string adapter_folder(const std::string& path);

struct LoadedModel {
  std::shared_ptr<models::LanguageModel> model;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::string tokenizer_dir;  // where the tokenizer and template are read
  std::string chat_template;  // "": the folder's own template; or a family
  std::string checkpoint_dir; // or the HF folder
  int64_t step = 0;           // the checkpoint's; 0 for an HF folder
  std::string description;    // "runs/sft/d4/checkpoints/step_000040 (step 40)"
  std::string name; // "sft/d4", "Llama-3.2-3B+adapter" (serve's model id)
};

// source.dtype as a type (nullopt: auto); UserError for a wrong name, a
// dtype for an Orchard checkpoint, or float16 on the CPU. load_model checks
// it first; a caller that looks at the source earlier can too.
std::optional<c10::ScalarType> asked_dtype(
    const ModelSource& source,
    const DeviceInfo& device);

// Loads what `source` names onto `device`: a GPT from its checkpoint (the
// EMA weights when it has them), a Hugging Face model in source.dtype (the
// automatic one by default, core/dtype.h) with its adapter added.
LoadedModel load_model(const ModelSource& source, const DeviceInfo& device);

// The same for a model already in memory (samples while training).
LoadedModel loaded_from(
    std::shared_ptr<models::LanguageModel> model,
    const std::string& tokenizer_dir,
    const std::string& chat_template = "");

// The chat template of a loaded model (its folder's own, or the family
// asked for). UserError when the tokenizer supports none.
text::ChatTemplate chat_template(const LoadedModel& loaded);

// The checkpoint `path` names: a checkpoint folder, or a run folder's
// newest good checkpoint (a damaged newer one is warned about on stderr).
// UserError when there is none; `train_hint` says how to make one.
Checkpoint checkpoint_at(
    const std::string& path,
    const std::string& train_hint);

// Orchard's GPT from a run folder (its newest good checkpoint) or a
// checkpoint folder; the EMA weights when the checkpoint has them and
// `prefer_ema`. On the CPU.
struct TrainedGpt {
  models::Gpt model{nullptr};
  models::GptConfig config;
  std::string tokenizer_dir;
  std::string checkpoint_dir;
  int64_t step = 0;
  nlohmann::json state; // the checkpoint's state.json
};
TrainedGpt load_gpt(
    const std::string& run_or_checkpoint,
    bool prefer_ema = true);

} // namespace orchard::runs
