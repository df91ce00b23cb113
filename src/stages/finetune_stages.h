// Fine-tuning a Hugging Face model folder: lora (adapters on a frozen base,
// saved in PEFT's format) and full (every weight, saved as a model
// folder). Their section is FinetuneConfig (train/finetune.h), keyed by
// transformers' TrainingArguments names; training is run_finetune.
#pragma once

#include "stages/stage.h"

namespace orchard::stages {

const Stage& lora_stage();
const Stage& full_stage();

} // namespace orchard::stages
