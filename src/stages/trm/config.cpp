#include "stages/trm/config.h"

#include <set>

namespace orchard::trm {

const config::Schema& trm_schema() {
  using config::field;
  using C = TrmStageConfig;
  using models::TrmConfig;
  static const config::Schema schema = [] {
    config::Schema s("TRM");
    s.add(
        {.key = "stage",
         .access = field(&C::stage),
         .help = "trm",
         .choices = {"trm"}});
    s.add(
        {.key = "data",
         .access = field(&C::data),
         .help = "a folder from `orchard data sudoku` (train.csv, test.csv), "
                 "a Sudoku-Extreme CSV or an ARC-style grid JSONL (every "
                 "10th held out), or `orchard data maze`'s folder; \"\": "
                 "generate puzzles (generate.*)"});
    s.add(
        {.key = "tokenizer",
         .access = field(&C::tokenizer),
         .help = "chat data (.chat): the tokenizer folder `orchard data chat "
                 "--tokenizer` used (its default: gpt2, built in)"});
    s.add(
        {.key = "chat_template",
         .access = field(&C::chat_template),
         .help = "chat data: the template family it was rendered with, as "
                 "--chat-template (\"\": the tokenizer folder's own)"});
    s.add(
        {.key = "generate.task",
         .access = field(&C::generate_task),
         .help = "data= empty: what to generate, sudoku or maze (one "
                 "shortest path of 110+ steps at side 30)",
         .choices = {"sudoku", "maze"}});
    s.add(
        {.key = "generate.size",
         .access = field(&C::generate_size),
         .help = "data= empty: the side (Sudoku 4, 6 or 9; mazes 5-60)",
         .choices = {}});
    s.add(
        {.key = "generate.count",
         .access = field(&C::generate_count),
         .help = "data= empty: puzzles generated (1000), a tenth held out",
         .min = 2});
    s.add(
        {.key = "generate.difficulty",
         .access = field(&C::generate_difficulty),
         .help = "data= empty, Sudoku: auto (easy for 9x9, minimal for 4x4 "
                 "and 6x6), easy, hard, extreme, minimal or any",
         .choices = {"auto", "easy", "hard", "extreme", "minimal", "any"}});
    s.add(
        {.key = "generate.augment",
         .access = field(&C::generate_augment),
         .help = "data= empty: symmetric copies per training puzzle (0; "
                 "mazes at most 7)",
         .min = 0});

    // The shared knobs, in upstream's spelling where it has one.
    static const std::set<std::string> skipped = {"max_seq_len", "eval_tokens"};
    config::Schema shared("shared");
    train::add_training_options(
        shared, train::Spelling::nanochat, train::training_part<C>);
    for (const config::Option& o : shared.options()) {
      if (skipped.count(o.key))
        continue;
      config::Option copy = o;
      if (o.key == "warmup_steps") {
        copy.key = "lr_warmup_steps";
        copy.aliases = {"warmup_steps"};
        copy.help = "steps of linear warmup (2000)";
      }
      if (o.key == "lr")
        copy.help = "peak learning rate of the network (1e-4)";
      if (o.key == "weight_decay")
        copy.help =
            "decoupled weight decay of the network (0.1; the paper's "
            "Sudoku 1.0)";
      if (o.key == "warmdown_ratio")
        copy.help =
            "share of the steps decaying linearly to 0 (0: constant "
            "after warmup, as upstream)";
      if (o.key == "device_batch_size")
        copy.help =
            "puzzles per micro-step (auto: the memory plan's divisor "
            "of global_batch_size)";
      if (o.key == "epochs")
        copy.help =
            "passes over the training rows (1000) when "
            "num_iterations is not set";
      if (o.key == "eval_every")
        copy.help =
            "steps between evaluations (0: from eval_interval, else "
            "only at the end)";
      if (o.key == "grad_clip")
        copy.help = "clip the gradient norm to this (0: off, as upstream)";
      s.add(std::move(copy));
    }
    s.add(
        {.key = "global_batch_size",
         .access = field(&C::global_batch_size),
         .help = "puzzles in flight per step (768)",
         .min = 1});
    s.add(
        {.key = "eval_interval",
         .access = field(&C::eval_interval),
         .help = "epochs between evaluations (auto: eval_every)",
         .min = 0});
    s.add(
        {.key = "eval_size",
         .access = field(&C::eval_size),
         .help = "held-out puzzles per evaluation (1000)",
         .min = 1});
    s.add(
        {.key = "beta1",
         .access = field(&C::beta1),
         .help = "first-moment decay (0.9)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "beta2",
         .access = field(&C::beta2),
         .help = "second-moment decay (0.95)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "puzzle_emb_lr",
         .access = field(&C::puzzle_emb_lr),
         .help = "SignSGD rate of the puzzle embeddings (1e-2)",
         .min = 0});
    s.add(
        {.key = "puzzle_emb_weight_decay",
         .access = field(&C::puzzle_emb_weight_decay),
         .help = "decay of the puzzle embeddings a batch uses (0.1)",
         .min = 0});
    s.add(
        {.key = "ema",
         .access = field(&C::ema),
         .help = "evaluate and save an exponential moving average of the "
                 "weights (false; the paper: true)"});
    s.add(
        {.key = "ema_rate",
         .access = field(&C::ema_rate),
         .help = "EMA decay per step (0.999)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "optimizer",
         .access = field(&C::optimizer),
         .help = "adam_atan2 (the paper's) or adamw (eps 1e-8)",
         .choices = {"adam_atan2", "adamw"}});

    // arch.*: upstream's names.
    auto arch = [](auto TrmConfig::*m) { return field(&C::arch, m); };
    s.add(
        {.key = "arch.H_cycles",
         .access = arch(&TrmConfig::H_cycles),
         .help = "outer recursions per supervision step, all but the last "
                 "without gradients (3)",
         .min = 1});
    s.add(
        {.key = "arch.L_cycles",
         .access = arch(&TrmConfig::L_cycles),
         .help = "z_L updates per outer recursion (6)",
         .min = 1});
    s.add(
        {.key = "arch.L_layers",
         .access = arch(&TrmConfig::L_layers),
         .help = "blocks in the one network (2)",
         .min = 1});
    s.add(
        {.key = "arch.H_layers",
         .access = [](void*) -> config::FieldRef {
           static int64_t ignored = 0;
           return &ignored;
         },
         .help = "accepted and ignored, as upstream TRM ignores it"});
    s.add(
        {.key = "arch.hidden_size",
         .access = arch(&TrmConfig::hidden_size),
         .help = "width D (512)",
         .min = 1});
    s.add(
        {.key = "arch.num_heads",
         .access = arch(&TrmConfig::num_heads),
         .help = "attention heads (8)",
         .min = 1});
    s.add(
        {.key = "arch.expansion",
         .access = arch(&TrmConfig::expansion),
         .help = "SwiGLU width factor (4)",
         .min = 0.1});
    s.add(
        {.key = "arch.mlp_t",
         .access = arch(&TrmConfig::mlp_t),
         .help = "an MLP across positions instead of attention (the "
                 "paper's Sudoku model)"});
    s.add(
        {.key = "arch.pos_encodings",
         .access = arch(&TrmConfig::pos_encodings),
         .help = "rope, learned or none",
         .choices = {"rope", "learned", "none"}});
    s.add(
        {.key = "arch.halt_max_steps",
         .access = arch(&TrmConfig::halt_max_steps),
         .help = "supervision steps at most (16)",
         .min = 1});
    s.add(
        {.key = "arch.halt_exploration_prob",
         .access = arch(&TrmConfig::halt_exploration_prob),
         .help = "share of puzzles made to run a random minimum of steps "
                 "(0.1)",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "arch.no_ACT_continue",
         .access = arch(&TrmConfig::no_ACT_continue),
         .help = "halt on sigmoid(q_halt) > 0.5 alone (true); false also "
                 "learns a continue value"});
    s.add(
        {.key = "arch.puzzle_emb_ndim",
         .access = field(&C::puzzle_emb_ndim),
         .help = "width of the learned per-puzzle embedding (auto: "
                 "hidden_size; 0: none)",
         .min = 0});
    s.add(
        {.key = "arch.puzzle_emb_len",
         .access = arch(&TrmConfig::puzzle_emb_len),
         .help = "positions the puzzle embedding fills (16; 0: as many as "
                 "it needs)",
         .min = 0});
    s.add(
        {.key = "arch.rope_theta",
         .access = arch(&TrmConfig::rope_theta),
         .help = "rotary base (10000)",
         .min = 1});
    return s;
  }();
  return schema;
}

} // namespace orchard::trm
