// The stage registry: every command finds a stage by name and resolves its
// section from the same sources; an unknown stage names the ones there are.
#include "stages/stage.h"
#include "core/error.h"
#include "train/finetune.h"
#include "train/pretrain_config.h"

#include <gtest/gtest.h>

namespace orchard::stages {
namespace {

config::Sources with(
    std::vector<std::string> overrides,
    std::string preset = "") {
  config::Sources s;
  s.preset = std::move(preset);
  s.overrides = std::move(overrides);
  s.env = [](const std::string&) { return std::optional<std::string>(); };
  return s;
}

TEST(Stage, TheRegistryHoldsEveryStageOnce) {
  std::vector<std::string> names;
  for (const Stage* s : all_stages())
    names.push_back(s->name());
  EXPECT_EQ(
      names, (std::vector<std::string>{"base", "mid", "sft", "lora", "full"}));
  EXPECT_EQ(stage_list(), "base|mid|sft|lora|full");
  for (const Stage* s : all_stages()) {
    EXPECT_EQ(&stage_named(s->name()), s);
    EXPECT_FALSE(s->summary().empty()) << s->name();
    // Each stage's section accepts its own name under `stage`.
    auto d = s->defaults();
    EXPECT_EQ(d->stage, s);
    EXPECT_NE(d->stage->schema().find("stage"), nullptr) << s->name();
  }
}

TEST(Stage, ConfigurePicksTheStageTheSourcesName) {
  auto base = configure(with({}));
  EXPECT_EQ(base->stage->name(), "base");
  EXPECT_EQ(section<PretrainConfig>(*base).stage, "base");

  auto sft = configure(with({"stage=sft", "depth=2"}));
  EXPECT_EQ(sft->stage->name(), "sft");
  EXPECT_EQ(section<PretrainConfig>(*sft).depth, 2);
  EXPECT_EQ(sft->origins.at("depth"), "command line");

  // Fine-tuning keys go to the fine-tuning section (transformers' names).
  auto lora = configure(
      with({"stage=lora", "model=m", "per_device_train_batch_size=2"}));
  EXPECT_EQ(lora->stage->name(), "lora");
  const auto& f = section<train::FinetuneConfig>(*lora);
  EXPECT_EQ(f.model, "m");
  EXPECT_EQ(f.device_batch_size, 2);

  // A preset's stage, and a later key=value over it.
  auto preset = configure(with({"model=m"}, "lora-llama-3.2-3b"));
  EXPECT_EQ(preset->stage->name(), "lora");
  EXPECT_EQ(section<train::FinetuneConfig>(*preset).lora_r, 16);
  auto full = configure(with({"stage=full", "model=m"}, "lora-llama-3.2-3b"));
  EXPECT_EQ(full->stage->name(), "full");
}

// The same knob is spelled the same in every section: transformers' names
// work for the GPT stages too, nanochat's for fine-tuning.
TEST(Stage, EverySectionTakesBothSpellingsOfTheSharedKnobs) {
  auto base = configure(with(
      {"max_steps=7",
       "save_steps=3",
       "eval_steps=2",
       "per_device_train_batch_size=2",
       "max_seq_length=64",
       "max_grad_norm=0.5",
       "num_train_epochs=2"}));
  const auto& g = section<PretrainConfig>(*base);
  EXPECT_EQ(g.num_iterations, 7);
  EXPECT_EQ(g.save_every, 3);
  EXPECT_EQ(g.eval_every, 2);
  EXPECT_EQ(g.device_batch_size, 2);
  EXPECT_EQ(g.max_seq_len, 64);
  EXPECT_EQ(g.grad_clip, 0.5);
  EXPECT_EQ(g.epochs, 2.0);
  auto lora = configure(with(
      {"stage=lora",
       "num_iterations=7",
       "save_every=3",
       "eval_every=2",
       "device_batch_size=2",
       "max_seq_len=64",
       "grad_clip=0.5",
       "epochs=2"}));
  const auto& f = section<train::FinetuneConfig>(*lora);
  EXPECT_EQ(f.max_steps, 7);
  EXPECT_EQ(f.save_steps, 3);
  EXPECT_EQ(f.eval_steps, 2);
  EXPECT_EQ(f.device_batch_size, 2);
  EXPECT_EQ(f.max_seq_length, 64);
  EXPECT_EQ(f.max_grad_norm, 0.5);
  EXPECT_EQ(f.num_train_epochs, 2.0);
}

TEST(Stage, AnUnknownStageNamesTheStages) {
  try {
    configure(with({"stage=grpo"}));
    FAIL() << "expected a refusal";
  } catch (const UserError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "stage=grpo is not a stage; the stages are base|mid|sft|lora|full.");
  }
  // A key of another stage's section: the section's own message.
  EXPECT_THROW(configure(with({"stage=base", "lora.r=4"})), UserError);
}

} // namespace
} // namespace orchard::stages
