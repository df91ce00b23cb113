// `orchard train stage=trm`: the tiny recursive model on puzzles. Loads
// (or generates) the puzzles, builds the model from arch.*, plans the
// micro-batch, and hands ActTrainer's supervision steps to the shared
// Trainer (EMA, checkpoints with the ACT carry, exact resume, evaluation
// of EMA and raw weights).
#include "stages/trm/trm_stage.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/files.h"
#include "core/progress.h"
#include "core/version.h"
#include "dist/world.h"
#include "infer/engine.h"
#include "models/trm_language_model.h"
#include "runs/run_folder.h"
#include "stages/samples.h"
#include "stages/trm/config.h"
#include "stages/trm/recursion.h"
#include "text/chat_template.h"
#include "text/tokenizer_io.h"
#include "train/memory_plan.h"
#include "train/report.h"
#include "train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace orchard::stages {
namespace {

namespace fs = std::filesystem;
using trm::TrmStageConfig;

// AdamW's epsilon when optimizer=adamw (upstream's AdamW baseline).
constexpr double kAdamWEpsilon = 1e-8;

// The puzzles of a run: data=, or puzzles generated once into data_dir.
data::PuzzleSplits load_data(const TrmStageConfig& cfg, std::string& path) {
  path = cfg.data;
  if (!path.empty())
    return data::load_puzzle_splits(path);
  const bool maze = cfg.generate_task == "maze";
  if (!maze && cfg.generate_size != 4 && cfg.generate_size != 6 &&
      cfg.generate_size != 9)
    throw UserError(
        "generate.size=" + std::to_string(cfg.generate_size) +
        ": Orchard generates 4x4, 6x6 and 9x9 Sudoku (mazes: "
        "generate.task=maze).");
  if (maze &&
      (cfg.generate_size < data::maze::kMinSide ||
       cfg.generate_size > data::maze::kMaxSide))
    throw UserError(
        "generate.size=" + std::to_string(cfg.generate_size) +
        ": Orchard generates mazes of side " +
        std::to_string(data::maze::kMinSide) + " to " +
        std::to_string(data::maze::kMaxSide) + " (Maze-Hard's is 30).");
  const std::string home =
      cfg.data_dir.empty() ? default_data_dir() : cfg.data_dir;
  const std::string size = std::to_string(cfg.generate_size);
  path = home + "/puzzles/" + cfg.generate_task + size + "-" +
      (maze ? std::string("hard") : cfg.generate_difficulty) + "-" +
      std::to_string(cfg.generate_count) + "-aug" +
      std::to_string(cfg.generate_augment) + "-seed" +
      std::to_string(cfg.seed) +
      // Sets an older generator made are not reused.
      (maze ? "" : "-v" + std::to_string(data::sudoku::kGeneratorVersion));
  if (fs::exists(path + "/dataset.json"))
    return data::load_puzzle_splits(path);
  std::printf(
      "Generating %lld %sx%s %s into %s ...\n",
      (long long)cfg.generate_count,
      size.c_str(),
      size.c_str(),
      maze ? "mazes" : "Sudoku",
      path.c_str());
  std::fflush(stdout);
  auto common = [&](data::PuzzleDataOptions& o) {
    o.count = cfg.generate_count;
    o.out = path;
    o.augment = cfg.generate_augment;
    o.seed = cfg.seed;
  };
  data::PuzzleDataSummary s;
  if (maze) {
    data::MazeDataOptions o;
    common(o);
    o.side = int(cfg.generate_size);
    s = data::write_maze_dataset(o);
  } else {
    data::SudokuDataOptions o;
    common(o);
    o.n = int(cfg.generate_size);
    o.difficulty = cfg.generate_difficulty;
    s = data::write_sudoku_dataset(o);
  }
  std::printf(
      "  %lld train (%lld rows), %lld held out; %s\n",
      (long long)s.train,
      (long long)s.train_rows,
      (long long)s.test,
      s.difficulty_text.c_str());
  return data::load_puzzle_splits(path);
}

// Chat data's tokenizer (its vocabulary sizes the model) and template,
// checked against the data; nullopt for puzzles.
struct ChatSide {
  std::string tokenizer_dir, template_name;
  int64_t vocab = 0;
};
std::optional<ChatSide> chat_side(
    const TrmStageConfig& cfg,
    const data::PuzzleSplits& d) {
  if (d.train.kind != "chat") {
    if (!cfg.tokenizer.empty() && cfg.data.empty())
      throw UserError(
          "tokenizer= is for chat data: give data=FILE.chat, made by "
          "`orchard data chat --input CHATS.jsonl --out DIR` (without data= "
          "the stage generates puzzles, which need no tokenizer).");
    if (!cfg.tokenizer.empty())
      throw UserError(
          "tokenizer= is for chat data (.chat files); data=" + cfg.data +
          " holds " + d.train.kind + " puzzles. Drop tokenizer=.");
    return std::nullopt;
  }
  if (cfg.tokenizer.empty())
    throw UserError(
        "data=" + cfg.data +
        " holds conversations as token ids: give tokenizer=DIR, the "
        "folder `orchard data chat --tokenizer` read (its default, "
        "GPT-2's: tokenizer=gpt2).");
  const text::Tokenizer tok = text::load_tokenizer(cfg.tokenizer);
  // Opened now so that a family the tokenizer cannot render fails here,
  // not when the trained model is first asked to chat.
  text::open_chat_template(cfg.tokenizer, tok, cfg.chat_template);
  ChatSide c;
  c.tokenizer_dir = text::tokenizer_reference(cfg.tokenizer);
  c.template_name = cfg.chat_template;
  c.vocab = int64_t(tok.vocab_size());
  if (d.train.vocab > c.vocab)
    throw UserError(
        "data=" + cfg.data + " holds token id " +
        std::to_string(d.train.vocab - 1) + ", beyond the " +
        std::to_string(c.vocab) + " of tokenizer=" + cfg.tokenizer +
        ": another tokenizer made it. Give that one, or rebuild the data "
        "with `orchard data chat --tokenizer " +
        cfg.tokenizer + "`.");
  return c;
}

// Greedy replies of a chat model to the first `n` held-out conversations
// (their text up to the first trained token), beside the true replies.
std::vector<train::Sample> chat_samples(
    models::Trm& model,
    const ChatSide& chat,
    const data::PuzzleSet& test,
    int64_t n,
    torch::Device device) {
  const text::Tokenizer tok = text::load_tokenizer(chat.tokenizer_dir);
  infer::SamplingOptions greedy;
  greedy.max_new_tokens = 48;
  greedy.temperature = 0;
  for (text::TokenId id :
       text::open_chat_template(chat.tokenizer_dir, tok, chat.template_name)
           .stop_tokens())
    greedy.stop_tokens.push_back(id);
  infer::Engine engine(
      std::make_shared<models::TrmLanguageModel>(model), device);
  // Drops the turn's end token from a reply.
  auto text_of = [&](std::vector<int64_t> ids) {
    const auto& stops = greedy.stop_tokens;
    if (!ids.empty() &&
        std::find(stops.begin(), stops.end(), ids.back()) != stops.end())
      ids.pop_back();
    return tok.decode(std::vector<text::TokenId>(ids.begin(), ids.end()));
  };
  std::vector<train::Sample> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto in = test.inputs[i].contiguous(),
               labels = test.labels[i].contiguous();
    const int64_t* ids = in.data_ptr<int64_t>();
    const int64_t* lab = labels.data_ptr<int64_t>();
    int64_t start = 0; // the first trained token is predicted here
    while (start < test.length && lab[start] == data::kIgnoreLabel)
      ++start;
    if (start == test.length)
      continue;
    const std::vector<int64_t> prompt(ids, ids + start + 1);
    std::vector<int64_t> truth;
    for (int64_t k = start; k < test.length && lab[k] != data::kIgnoreLabel;
         ++k)
      truth.push_back(lab[k]);
    out.push_back(
        {text_of(prompt),
         text_of(engine.generate(prompt, greedy)),
         text_of(truth)});
  }
  return out;
}

models::TrmConfig model_config(
    const TrmStageConfig& cfg,
    const data::PuzzleSet& train,
    const std::optional<ChatSide>& chat = std::nullopt) {
  models::TrmConfig c = cfg.arch;
  c.seq_len = train.seq_len();
  c.vocab_size = chat ? chat->vocab : train.vocab;
  // Conversations train next-token prediction: attention is causal.
  c.causal = train.kind == "chat";
  c.num_puzzle_identifiers = train.num_puzzle_ids;
  c.puzzle_emb_ndim = cfg.puzzle_emb_ndim.value_or(c.hidden_size);
  c.validate();
  return c;
}

// Every parameter of a model of this shape (built on the CPU to count).
int64_t count_parameters(const models::TrmConfig& c) {
  int64_t n = 0;
  for (const auto& p : models::Trm(c)->parameters())
    n += p.numel();
  return n;
}

struct TrmMemory {
  double state = 0, carry = 0, activations = 0;
  double total() const {
    return state + carry + activations;
  }
};

// Bytes of a step with `micro` puzzles per micro-step: weights, gradients,
// two moments and EMA in float32; the carry twice (the step's start and its
// result); the activations autograd keeps for the one H-cycle with
// gradients: (L_cycles + 1) applications of L_layers blocks, each keeping
// about its inputs, the SwiGLU's 3 inner widths and the norms' float32
// copies per position (the token-mixing MLP's per column of D).
TrmMemory estimate(
    const models::TrmConfig& c,
    double params,
    int64_t slots,
    int64_t micro,
    bool ema,
    int64_t elem) {
  TrmMemory m;
  m.state = params * 4 * (4 + (ema ? 1 : 0));
  const double T = double(c.positions()), D = double(c.hidden_size);
  m.carry = 2 * 2 * double(slots) * T * D * 4;
  const double inner = double(models::swiglu_width(c.hidden_size, c.expansion));
  double per_position = 6 * D * elem + 3 * inner * elem + 4 * D * 4;
  if (c.mlp_t)
    per_position += D *
        (3 * double(models::swiglu_width(c.positions(), c.expansion)) + T) *
        elem / T;
  else
    per_position += 6 * D * elem;
  m.activations = double(micro) * T * double(c.L_layers) *
      double(c.L_cycles + 1) * per_position;
  return m;
}

// The puzzles in flight in each process: global_batch_size shared among
// the processes (UserError when it does not divide).
int64_t slots_per_process(const TrmStageConfig& cfg) {
  const int64_t G = cfg.global_batch_size, world = dist::size();
  if (G % world != 0)
    throw UserError(
        "global_batch_size=" + std::to_string(G) + " cannot be shared among " +
        std::to_string(world) + " processes: use a multiple of " +
        std::to_string(world) + " (e.g. " +
        std::to_string(std::max<int64_t>(world, G / world * world)) +
        ") or another number of processes.");
  return G / world;
}

struct MicroPlan {
  int64_t micro = 1;
  TrmMemory memory;
  bool fits = false;
  train::MemoryBudget budget;
  std::vector<std::pair<int64_t, TrmMemory>> rows;
};

MicroPlan plan_micro(
    const TrmStageConfig& cfg,
    const models::TrmConfig& c,
    const DeviceInfo& device,
    const train::Precision& precision) {
  MicroPlan p;
  p.budget = train::memory_budget(device, cfg.memory_fraction);
  const int64_t elem = precision.compute == torch::kFloat32 ? 4 : 2;
  const int64_t G = slots_per_process(cfg);
  const double params = double(count_parameters(c));
  for (int64_t b = 1; b <= G; ++b)
    if (G % b == 0) {
      const TrmMemory m = estimate(c, params, G, b, cfg.ema, elem);
      p.rows.push_back({b, m});
    }
  if (cfg.device_batch_size) {
    const int64_t b = *cfg.device_batch_size;
    if (b < 1 || G % b != 0)
      throw UserError(
          "device_batch_size=" + std::to_string(b) +
          " does not divide the " + std::to_string(G) +
          " puzzles each process holds (global_batch_size=" +
          std::to_string(cfg.global_batch_size) + " over " +
          std::to_string(dist::size()) +
          " process(es)); give a divisor of it (or auto).");
    p.micro = b;
    p.memory = estimate(c, params, G, b, cfg.ema, elem);
    p.fits = p.memory.total() <= double(p.budget.bytes);
    return p;
  }
  p.micro = 1;
  p.memory = p.rows.front().second;
  for (const auto& [b, m] : p.rows)
    if (m.total() <= double(p.budget.bytes)) {
      p.micro = b;
      p.memory = m;
    }
  p.fits = p.memory.total() <= double(p.budget.bytes);
  return p;
}

std::string plan_text(const MicroPlan& p) {
  std::string t = "  micro-batch   state      carry      activations  total\n";
  for (const auto& [b, m] : p.rows) {
    char line[160];
    std::snprintf(
        line,
        sizeof line,
        "  %11lld   %-9s  %-9s  %-11s  %s%s\n",
        (long long)b,
        train::format_mb(m.state).c_str(),
        train::format_mb(m.carry).c_str(),
        train::format_mb(m.activations).c_str(),
        train::format_mb(m.total()).c_str(),
        b == p.micro ? "  <- choice" : "");
    t += line;
  }
  return t;
}

int64_t total_steps(const TrmStageConfig& cfg, int64_t rows) {
  if (cfg.num_iterations)
    return *cfg.num_iterations;
  const double epochs = cfg.epochs.value_or(1.0);
  return std::max<int64_t>(
      1,
      int64_t(
          std::ceil(epochs * double(rows) / double(cfg.global_batch_size))));
}

std::string pct(double v) {
  return fmt("%.1f", 100 * v) + " %";
}

// accuracy.svg of a run: held-out exact accuracy at each evaluation (EMA
// and raw weights).
void write_accuracy_chart(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::map<int64_t, double> ema, raw, cells;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step"))
      continue;
    const int64_t step = j["step"].get<int64_t>();
    if (j.contains("val_exact_accuracy"))
      ema[step] = 100 * j["val_exact_accuracy"].get<double>();
    if (j.contains("raw_val_exact_accuracy"))
      raw[step] = 100 * j["raw_val_exact_accuracy"].get<double>();
    if (j.contains("val_cell_accuracy"))
      cells[step] = 100 * j["val_cell_accuracy"].get<double>();
  }
  auto points = [](const std::map<int64_t, double>& m) {
    std::vector<train::MetricPoint> p;
    for (const auto& [s, v] : m)
      p.push_back({double(s), v});
    return p;
  };
  std::vector<train::Curve> curves = {
      {"exact (evaluated weights)", "#2f5fae", points(ema), true}};
  if (!raw.empty())
    curves.push_back({"exact (raw weights)", "#9aa9c7", points(raw), true});
  curves.push_back({"cells", "#d9541e", points(cells), true});
  atomic_write(
      run_dir + "/accuracy.svg",
      train::svg_chart(
          "held-out accuracy (" + run_dir + ")", curves, "step", "percent"));
}

class TrmStage : public Stage {
 public:
  using Stage::Stage;

  const config::Schema& schema() const override {
    return trm::trm_schema();
  }
  std::unique_ptr<Settings> defaults() const override {
    auto s = std::make_unique<SettingsOf<TrmStageConfig>>();
    s->stage = this;
    return s;
  }

  Report train(
      const Settings& settings,
      const DeviceInfo& device,
      int final_samples) const override {
    const TrmStageConfig& cfg = section<TrmStageConfig>(settings);
    Report report;
    std::vector<train::Sample> samples;
    report.result = run(cfg, settings.origins, device, final_samples, samples);
    return finish_stage(std::move(report), device, [&](Report& rep) {
      rep.samples = samples;
      rep.sample_note = cfg.tokenizer.empty()
          ? "held-out puzzles, the model's answer and how many supervision "
            "steps it took"
          : "held-out conversations and the model's greedy reply";
    });
  }

  // Upstream's torchrun runs: each process holds its share of
  // global_batch_size's puzzles in flight.
  bool data_parallel() const override {
    return true;
  }

  Plan plan(const Settings& settings, const DeviceInfo& device) const override {
    const TrmStageConfig& cfg = section<TrmStageConfig>(settings);
    std::string path;
    const data::PuzzleSplits data = load_data(cfg, path);
    const models::TrmConfig c =
        model_config(cfg, data.train, chat_side(cfg, data));
    const train::Precision precision =
        train::resolve_precision(cfg.dtype, device);
    const MicroPlan p = plan_micro(cfg, c, device, precision);
    Plan out;
    out.fits = p.fits;
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& [b, m] : p.rows)
      rows.push_back({{"batch", b}, {"total_bytes", m.total()}});
    out.json = {
        {"stage", "trm"},
        {"parameters", count_parameters(c)},
        {"global_batch_size", cfg.global_batch_size},
        {"precision", precision.name},
        {"budget_bytes", p.budget.bytes},
        {"candidates", rows},
        {"choice",
         {{"batch", p.micro},
          {"total_bytes", p.memory.total()},
          {"fits", p.fits}}}};
    out.text = "Model: TRM, " + std::to_string(count_parameters(c)) +
        " parameters (" + (c.mlp_t ? "MLP across positions" : "attention") +
        ", " + std::to_string(c.L_layers) + " layers x " +
        std::to_string(c.hidden_size) + ", H_cycles " +
        std::to_string(c.H_cycles) + ", L_cycles " +
        std::to_string(c.L_cycles) + "), " + std::to_string(c.positions()) +
        " positions, " + precision.name + "; " +
        std::to_string(cfg.global_batch_size) + " puzzles per step\n" +
        plan_text(p) + "Choice: device_batch_size=" + std::to_string(p.micro) +
        (cfg.device_batch_size ? " (as set)"
             : p.fits          ? " (the largest that fits)"
                               : " (nothing fits)") +
        ", " + train::format_mb(p.memory.total()) + " of " +
        train::format_mb(double(p.budget.bytes)) + "\n";
    if (!p.fits)
      out.text +=
          "Too large for this memory: lower global_batch_size (the carry "
          "grows with it) or arch.hidden_size, or set a smaller "
          "device_batch_size.\n";
    return out;
  }

  std::string next_steps(const Settings& settings, const Report& report)
      const override {
    const train::TrainResult& r = report.result;
    if (r.interrupted)
      return "Stopped; the same command resumes from the checkpoint.\n";
    const std::string& orchard = program_name();
    if (section<TrmStageConfig>(settings).tokenizer.size())
      return "\nChat: " + orchard + " chat --checkpoint " + r.run_dir +
          "\nGenerate: " + orchard + " generate --checkpoint " + r.run_dir +
          " --prompt \"...\"\n";
    return "\nSolve a puzzle: " + orchard + " solve --checkpoint " + r.run_dir +
        " --puzzle \"...\"\nEvaluate: " + orchard + " eval --checkpoint " +
        r.run_dir + "\n";
  }

 private:
  static train::TrainResult run(
      const TrmStageConfig& cfg,
      const config::Origins& origins,
      const DeviceInfo& device,
      int final_samples,
      std::vector<train::Sample>& samples_out) {
    using namespace train;
    const torch::Device dev = device.device;
    std::string data_path;
    data::PuzzleSplits data;
    // Generated puzzles are written once, by rank 0, before the others read.
    dist::leader_first(
        "preparing the puzzles", [&] { data = load_data(cfg, data_path); });
    const std::optional<ChatSide> chat = chat_side(cfg, data);
    models::TrmConfig mc = model_config(cfg, data.train, chat);
    const Precision precision = resolve_precision(cfg.dtype, device);
    const MicroPlan plan = plan_micro(cfg, mc, device, precision);
    if (cfg.device_batch_size && killed_when_out_of_memory(device))
      refuse_beyond_memory(
          device,
          "device_batch_size",
          plan.micro,
          plan.memory.total(),
          plan.budget,
          std::nullopt);

    TrainResult result;
    result.stage = "trm";
    fs::path dp = fs::path(data_path).lexically_normal();
    if (dp.filename().empty())
      dp = dp.parent_path();
    const std::string name = !cfg.run.empty() ? cfg.run : dp.stem().string();
    result.run_dir = !cfg.run_dir.empty() ? cfg.run_dir : "runs/trm/" + name;
    make_run_folder(result.run_dir, [&] {
      TrmStageConfig written = cfg;
      config::write_yaml(
          result.run_dir + "/config.yaml", trm::trm_schema(), &written,
          origins);
    });
    RunLog log(result.run_dir + "/train.log");

    torch::manual_seed(uint64_t(cfg.seed));
    models::Trm model(mc);
    model->to(dev);
    model->train();
    for (const auto& p : model->parameters())
      result.parameters += p.numel();
    result.trainable_parameters = result.parameters;
    result.data_description = data.description;

    // The network by AdamATan2 (or AdamW); the puzzle embeddings by
    // SignSGD with their own rate and decay.
    NamedTensors network, embeddings;
    for (const auto& p : model->named_parameters())
      (p.key() == "puzzle_emb" ? embeddings : network)
          .push_back({p.key(), p.value()});
    std::vector<ParamGroup> groups = {
        {.name = "network",
         .params = network,
         .lr = cfg.lr.value_or(1e-4),
         .weight_decay = cfg.weight_decay,
         .rule = cfg.optimizer == "adam_atan2" ? "adam_atan2" : ""}};
    if (!embeddings.empty())
      groups.push_back(
          {.name = "puzzle_emb",
           .params = embeddings,
           .lr = cfg.puzzle_emb_lr,
           .weight_decay = cfg.puzzle_emb_weight_decay,
           .rule = "sign_sgd"});
    OptimizerOptions oo;
    oo.adam_beta1 = cfg.beta1;
    oo.adam_beta2 = cfg.beta2;
    oo.adam_eps = kAdamWEpsilon;
    Optimizers optimizers(std::move(groups), oo);

    const int64_t G = cfg.global_batch_size;
    const int64_t slots = slots_per_process(cfg); // G in one process
    trm::ActTrainer act(model, data.train, slots, uint64_t(cfg.seed), dev);
    int64_t B = plan.micro;
    const int64_t total = total_steps(cfg, data.train.size());
    const int64_t eval_batch = std::max<int64_t>(B, 1);
    trm::EvalStats last;

    TrainingTask task;
    task.model = model.ptr();
    task.micro_step = [&] { return act.micro_step(B); };
    task.evaluate = [&] {
      last = trm::evaluate(model, data.test, cfg.eval_size, eval_batch, dev);
      EvalResult r;
      r.loss = last.loss;
      r.metrics = {
          {"val_exact_accuracy", last.exact},
          {"val_cell_accuracy", last.cells},
          {"val_q_halt_accuracy", last.q_halt_accuracy}};
      // After the first supervision step too: the gap to the last is
      // what the recursion adds.
      if (!last.exact_by_step.empty())
        r.metrics.emplace_back(
            "val_exact_accuracy_step_1", last.exact_by_step.front());
      r.summary = "held-out exact " + pct(last.exact) + ", cells " +
          pct(last.cells) + ", Q-halt " + pct(last.q_halt_accuracy) + " (" +
          std::to_string(last.puzzles) + " puzzles)";
      return r;
    };
    task.data_state = [&] { return act.data_state(); };
    task.restore_data = [&](const nlohmann::json& j) { act.restore_data(j); };
    // The data position does not depend on the micro-batch: the Trainer
    // sets the checkpoint's while restoring, then one that divides `slots`
    // (a run saved by fewer processes may have used a larger one).
    task.set_micro_batch = [&](int64_t b) { B = b; };
    trm::TrainMetrics shown;
    task.step_metrics = [&] {
      shown = act.take_metrics();
      std::map<std::string, double> m = {{"epoch", act.epochs_done()}};
      if (shown.halted > 0) {
        const double n = double(shown.halted);
        m["train_exact_accuracy"] = shown.exact / n;
        m["train_cell_accuracy"] = shown.cells / n;
        m["halt_steps"] = shown.steps / n;
        m["halted"] = n;
      }
      return m;
    };
    task.progress_note = [&] {
      if (shown.halted == 0)
        return std::string("no puzzle halted");
      return "exact " + fmt("%.1f", 100 * shown.exact / double(shown.halted)) +
          " %, " + fmt("%.1f", shown.steps / double(shown.halted)) + " steps";
    };
    task.model_tensors = [&]() -> NamedTensors {
      return {{"H_init", model->H_init}, {"L_init", model->L_init}};
    };
    task.state_tensors = [&] { return act.carry_tensors(); };
    task.state_per_rank = true;
    task.restore_tensors = [&](const runs::Checkpoint& ck) {
      act.restore_carry(ck.optimizer);
      torch::NoGradGuard no_grad;
      for (const char* key : {"H_init", "L_init"}) {
        auto it = ck.model.find(key);
        if (it != ck.model.end())
          model->named_buffers()[key].copy_(it->second);
      }
    };
    task.evaluate_raw_too = cfg.ema;
    task.describe = {
        {"stage", "trm"},
        {"trm", models::to_json(mc)},
        {"data", fs::absolute(data_path).string()},
        {"puzzles",
         {{"kind", data.train.kind},
          {"side", data.train.side},
          {"size", data.train.shape.n}}}};
    if (chat) {
      task.describe["tokenizer_dir"] = chat->tokenizer_dir;
      task.describe["chat_template"] = chat->template_name;
    }

    int64_t eval_every = cfg.eval_every;
    if (cfg.eval_interval && *cfg.eval_interval > 0)
      eval_every = std::max<int64_t>(
          1,
          int64_t(std::llround(
              *cfg.eval_interval * double(data.train.size()) / double(G))));
    TrainerOptions to{
        .run_dir = result.run_dir,
        .device = dev,
        .precision = precision,
        .total_steps = total,
        .micro_batch = B,
        .grad_accum = slots / B,
        .tokens_per_step = G * mc.seq_len,
        .grad_clip = cfg.grad_clip,
        .zero_stage = int(cfg.zero_stage),
        .grad_reduce_dtype =
            *parse_dtype(cfg.grad_reduce_dtype, "grad_reduce_dtype"),
        .bucket_cap_mb = cfg.bucket_cap_mb,
        .grad_average = dist::mover_named(cfg.grad_average),
        .warmup_steps = cfg.warmup_steps,
        .warmdown_ratio = cfg.warmdown_ratio,
        .ema = cfg.ema,
        .ema_rate = cfg.ema_rate,
        .eval_every = eval_every,
        .save_every = cfg.save_every,
        .save_total_limit = cfg.save_total_limit,
        .resume = cfg.resume};
    Trainer trainer(to, task, optimizers, log);
    const int64_t start = trainer.resume();
    B = trainer.micro_batch();
    if (start < total) {
      log("Stage: TRM, " + std::to_string(result.parameters) + " parameters (" +
          std::to_string(model->network_parameters()) +
          " without the puzzle embedding): " +
          (mc.mlp_t ? "MLP across positions" : "attention") + ", " +
          std::to_string(mc.L_layers) + " layers x " +
          std::to_string(mc.hidden_size) + ", H_cycles " +
          std::to_string(mc.H_cycles) + " x L_cycles " +
          std::to_string(mc.L_cycles) + ", up to " +
          std::to_string(mc.halt_max_steps) + " supervision steps");
      log("Data: " + data.description);
      log("Batch: " + std::to_string(G) +
          " puzzles in flight = " + std::to_string(B) + " per micro-step (" +
          (cfg.device_batch_size ? "as set" : "auto") + ", about " +
          format_mb(plan.memory.total()) + ") x " +
          std::to_string(trainer.grad_accum()) + "; " + std::to_string(total) +
          " steps; " + optimizers.describe() + "; precision " + precision.name +
          (cfg.ema ? "; EMA " + fmt("%g", cfg.ema_rate) : "") +
          "; run folder " + result.run_dir);
    }
    TrainerResult tr = trainer.run();
    copy_trainer_result(tr, result);
    result.total = total;
    if (tr.interrupted || !dist::leader()) // rank 0 evaluates and reports
      return result;
    result.output_dir = result.run_dir;
    write_accuracy_chart(result.run_dir);
    // The final evaluation is the evaluated weights' (EMA when on).
    trainer.with_eval_weights([&] {
      last = trm::evaluate(model, data.test, cfg.eval_size, eval_batch, dev);
    });
    std::string by_step;
    for (size_t k = 0; k < last.exact_by_step.size(); ++k)
      by_step += (k ? ", " : "") + fmt("%.1f", 100 * last.exact_by_step[k]);
    result.report_rows = {
        {"Held-out exact accuracy",
         pct(last.exact) + " of " + std::to_string(last.puzzles) + " puzzles" +
             (cfg.ema ? " (EMA weights)" : "")},
        {"Held-out cell accuracy", pct(last.cells)},
        {"Q-halt accuracy", pct(last.q_halt_accuracy)},
        {"Exact accuracy after supervision step 1, 2, ...", by_step + " %"},
        {"Accuracy curve", "![held-out accuracy](accuracy.svg)"}};
    if (!tr.already_done) {
      log("Done: held-out exact accuracy " + pct(last.exact) + ", cells " +
          pct(last.cells) + " (" + std::to_string(last.puzzles) + " puzzles, " +
          std::to_string(mc.halt_max_steps) + " supervision steps).");
      trainer.with_eval_weights([&] {
        const int64_t n = std::min<int64_t>(final_samples, data.test.size());
        if (n > 0 && chat) {
          samples_out = chat_samples(model, *chat, data.test, n, dev);
          return;
        }
        if (n <= 0 || (data.test.kind != "sudoku" && data.test.kind != "maze"))
          return; // grids have no text form
        const auto sols = trm::solve(
            model,
            data.test.inputs.narrow(0, 0, n),
            data.test.puzzle_ids.narrow(0, 0, n),
            dev);
        const auto& s = data.test.shape;
        for (int64_t i = 0; i < n; ++i) {
          if (data.test.kind == "maze") {
            const int64_t cells = data.test.seq_len();
            const int side = int(data.test.side);
            const auto q = data::maze_from_tokens(
                data.test.inputs[i].contiguous().data_ptr<int64_t>(), cells);
            const auto a =
                data::maze_from_tokens(sols[size_t(i)].tokens.data(), cells);
            const auto problem = data::maze::answer_problem(side, q, a);
            samples_out.push_back(
                {"a held-out maze, shortest path " +
                     std::to_string(data::maze::shortest_paths(side, q).steps) +
                     " steps",
                 "\n" + data::maze::pretty(side, a),
                 (problem.empty() ? std::string("right") : problem) + ", " +
                     std::to_string(sols[size_t(i)].steps) + " steps"});
            continue;
          }
          const auto q = data::sudoku_from_tokens(
              data.test.inputs[i].contiguous().data_ptr<int64_t>(), s.cells());
          const auto a = data::sudoku_from_tokens(
              sols[size_t(i)].tokens.data(), s.cells());
          const auto truth = data::sudoku_from_tokens(
              data.test.labels[i].contiguous().data_ptr<int64_t>(), s.cells());
          samples_out.push_back(
              {data::sudoku::to_text(q),
               data::sudoku::to_text(a),
               (a == truth ? "right" : "wrong") + std::string(", ") +
                   std::to_string(sols[size_t(i)].steps) + " steps"});
        }
      });
    }
    return result;
  }
};

} // namespace

const Stage& trm_stage() {
  static const TrmStage stage(
      "trm",
      "a tiny recursive model on puzzles (Sudoku, mazes, ARC-style grids): "
      "data=DIR|FILE or generated puzzles");
  return stage;
}

} // namespace orchard::stages
