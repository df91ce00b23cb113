// The stage registry: every command finds a stage by name and resolves its
// section from the same sources; an unknown stage names the ones there are.
#include "stages/stage.h"
#include "core/error.h"
#include "train/finetune.h"
#include "train/pretrain_config.h"
#include "train/training_config.h"

#include <gtest/gtest.h>

#include <set>

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
      names,
      (std::vector<std::string>{
          "base", "mid", "sft", "lora", "full", "grpo", "trm"}));
  EXPECT_EQ(stage_list(), "base|mid|sft|lora|full|grpo|trm");
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
  EXPECT_EQ(f.num_iterations, 7);
  EXPECT_EQ(f.save_every, 3);
  EXPECT_EQ(f.eval_every, 2);
  EXPECT_EQ(f.device_batch_size, 2);
  EXPECT_EQ(f.max_seq_len, 64);
  EXPECT_EQ(f.grad_clip, 0.5);
  EXPECT_EQ(f.epochs, 2.0);
}

// The shared knobs are one declaration (train/training_config.h): every
// section takes the same keys with the same bounds and checks; a section
// chooses only its defaults and which spelling its config.yaml writes.
TEST(Stage, TheSharedKnobsAreDeclaredOnceWithEachStagesDefaults) {
  config::Schema nanochat("shared"), transformers("shared");
  train::add_training_options(
      nanochat,
      train::Spelling::nanochat,
      train::training_part<train::TrainingConfig>);
  train::add_training_options(
      transformers,
      train::Spelling::transformers,
      train::training_part<train::TrainingConfig>);
  ASSERT_GE(nanochat.options().size(), 20u);
  ASSERT_EQ(nanochat.options().size(), transformers.options().size());
  // GRPO (TRL's names) has no row length, epochs or token budget of
  // evaluation, and its num_iterations is TRL's updates per generation, so
  // max_steps does not take it as an alias.
  const std::set<std::string> not_grpo = {
      "max_seq_length", "num_train_epochs", "eval_tokens"};
  for (const Stage* s : all_stages()) {
    const bool grpo = s->name() == "grpo";
    // TRM (upstream's names) has no rows of tokens and calls the warmup
    // lr_warmup_steps (warmup_steps an alias).
    const bool trm = s->name() == "trm";
    // The spelling the section writes: its key for the row length.
    const config::Option* row = s->schema().find("max_seq_len");
    ASSERT_TRUE(grpo || trm || row != nullptr) << s->name();
    const config::Schema& shared = trm      ? nanochat
        : grpo || row->key != "max_seq_len" ? transformers
                                            : nanochat;
    for (const auto& o : shared.options()) {
      if (trm && (o.key == "max_seq_len" || o.key == "eval_tokens")) {
        EXPECT_EQ(s->schema().find(o.key), nullptr) << o.key;
        continue;
      }
      if (trm && o.key == "warmup_steps") {
        EXPECT_EQ(s->schema().find("warmup_steps")->key, "lr_warmup_steps");
        continue;
      }
      if (grpo && not_grpo.count(o.key)) {
        EXPECT_EQ(s->schema().find(o.key), nullptr) << o.key;
        continue;
      }
      if (grpo && o.key == "max_steps") {
        EXPECT_EQ(
            s->schema().find("max_steps")->aliases,
            std::vector<std::string>{"iters"});
        EXPECT_EQ(s->schema().find("num_iterations")->key, "num_iterations");
        continue;
      }
      // The same key, aliases, bounds, choices and variable.
      const config::Option* mine = s->schema().find(o.key);
      ASSERT_NE(mine, nullptr) << s->name() << " lacks " << o.key;
      EXPECT_EQ(mine->key, o.key) << s->name();
      EXPECT_EQ(mine->aliases, o.aliases) << s->name() << " " << o.key;
      EXPECT_EQ(mine->min, o.min) << s->name() << " " << o.key;
      EXPECT_EQ(mine->max, o.max) << s->name() << " " << o.key;
      EXPECT_EQ(mine->choices, o.choices) << s->name() << " " << o.key;
      EXPECT_EQ(mine->env, o.env) << s->name() << " " << o.key;
    }
  }
  // Per-stage defaults of one field.
  const PretrainConfig gpt;
  const train::FinetuneConfig ft;
  EXPECT_EQ(gpt.warmdown_ratio, 0.2);
  EXPECT_EQ(ft.warmdown_ratio, 1.0);
  EXPECT_EQ(gpt.max_seq_len, 256);
  EXPECT_EQ(ft.max_seq_len, 1024);
  EXPECT_EQ(gpt.num_iterations, 100);
  EXPECT_FALSE(ft.num_iterations.has_value());
  // Each section writes its own spelling; the value is the same field.
  auto base = configure(with({"max_seq_length=64", "save_steps=5"}));
  auto lora = configure(with({"stage=lora", "max_seq_len=64", "save_every=5"}));
  const std::string base_yaml =
      config::to_yaml(base->stage->schema(), base->fields(), base->origins);
  const std::string lora_yaml =
      config::to_yaml(lora->stage->schema(), lora->fields(), lora->origins);
  EXPECT_NE(base_yaml.find("\nmax_seq_len: 64"), std::string::npos)
      << base_yaml;
  EXPECT_NE(base_yaml.find("\nsave_every: 5"), std::string::npos);
  EXPECT_NE(lora_yaml.find("\nmax_seq_length: 64"), std::string::npos)
      << lora_yaml;
  EXPECT_NE(lora_yaml.find("\nsave_steps: 5"), std::string::npos);
  // A shared knob's bounds hold in every section.
  EXPECT_THROW(configure(with({"stage=lora", "warmdown_ratio=2"})), UserError);
  EXPECT_THROW(configure(with({"warmdown_ratio=2"})), UserError);
  EXPECT_THROW(configure(with({"stage=full", "dtype=int8"})), UserError);
}

TEST(Stage, AnUnknownStageNamesTheStages) {
  try {
    configure(with({"stage=tmr"}));
    FAIL() << "expected a refusal";
  } catch (const UserError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "stage=tmr is not a stage; the stages are "
        "base|mid|sft|lora|full|grpo|trm.");
  }
  // A key of another stage's section: the section's own message.
  EXPECT_THROW(configure(with({"stage=base", "lora.r=4"})), UserError);
}

} // namespace
} // namespace orchard::stages
