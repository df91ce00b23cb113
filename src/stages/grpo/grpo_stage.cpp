// `orchard train stage=grpo`: the stage around grpo::Learner. It loads the
// policy (a Hugging Face folder with LoRA or fully trained, or an Orchard
// GPT run), the environment and reward_cmd, plans the micro-batch, and
// hands the Learner's micro-steps to the shared Trainer.
#include "stages/grpo/grpo_stage.h"

#include "core/clock.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/files.h"
#include "core/progress.h"
#include "core/version.h"
#include "dist/world.h"
#include "models/lora.h"
#include "runs/checkpoint.h"
#include "runs/load.h"
#include "runs/run_folder.h"
#include "stages/grpo/config.h"
#include "stages/grpo/learner.h"
#include "stages/grpo/plan.h"
#include "stages/grpo/settings.h"
#include "stages/samples.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace orchard::stages {
namespace {

namespace fs = std::filesystem;
using grpo::finetune_kind;
using grpo::grpo_dtype;
using grpo::grpo_run_dir;
using grpo::GrpoConfig;
using grpo::GrpoPlanRows;
using grpo::plan_rows;
using grpo::plan_table;
using grpo::resolved;

// Settings that contradict each other or the policy (cfg resolved).
void check_source(const GrpoConfig& cfg) {
  if (!cfg.checkpoint.empty() && finetune_kind(cfg) == "lora")
    throw UserError(
        "finetune=lora works on Hugging Face models (model=DIR); an Orchard "
        "GPT (checkpoint=) trains every weight: use finetune=full or leave "
        "finetune at auto.");
  if (cfg.load_in_4bit && finetune_kind(cfg) != "lora")
    throw UserError(
        "load_in_4bit=true holds a frozen base in 4 bits for LoRA; "
        "finetune=full trains every weight. Use finetune=lora or drop "
        "load_in_4bit.");
  train::full_weights_dtype(grpo::as_finetune(cfg)); // refuses it with LoRA
  if (cfg.weights_dtype != "float32" && !cfg.checkpoint.empty())
    throw UserError(
        "weights_dtype=" + cfg.weights_dtype +
        " is for Hugging Face models (model=DIR) so far; an Orchard GPT "
        "(checkpoint=) trains float32 weights. Drop weights_dtype.");
  if (!cfg.adapter.empty() && finetune_kind(cfg) != "lora")
    throw UserError("adapter= continues a LoRA adapter; it needs finetune=lora.");
}

// The policy a run trains, loaded.
struct LoadedPolicy {
  std::shared_ptr<models::AdaptableModel> model;
  models::Llama llama{nullptr}; // a Hugging Face model
  runs::TrainedGpt gpt;         // an Orchard GPT
  runs::LoadedModel loaded;     // tokenizer and chat template
  std::vector<std::pair<std::string, torch::Tensor>> trained;
  int64_t parameters = 0, trainable = 0;
  models::LoraSpec spec;
  std::string describe;
};

LoadedPolicy load_policy(
    const GrpoConfig& cfg,
    const DeviceInfo& device,
    torch::ScalarType dtype) {
  LoadedPolicy p;
  const auto dev = device.device;
  const bool lora = finetune_kind(cfg) == "lora";
  const int64_t context = cfg.max_prompt_length + cfg.max_completion_length;
  if (!cfg.model.empty()) {
    models::LoadOptions lo;
    lo.device = dev;
    lo.dtype = lora ? dtype : train::full_weights_dtype(grpo::as_finetune(cfg));
    lo.context = std::min(
        context, models::read_hf_config(cfg.model).max_position_embeddings);
    lo.load_in_4bit = lora && cfg.load_in_4bit;
    lo.one_allocation = lora; // a frozen base
    p.llama = models::load_hf_model(cfg.model, lo);
    p.llama->gradient_checkpointing = cfg.gradient_checkpointing;
    p.model = p.llama.ptr();
    p.loaded = runs::loaded_from(
        p.llama.ptr(),
        cfg.model,
        cfg.chat_template == "auto" ? "" : cfg.chat_template);
    p.describe = p.llama->config.architecture + " from " + cfg.model;
  } else {
    // Prompts are cut to what the positions leave (the plan, below).
    p.gpt = runs::load_gpt(cfg.checkpoint, false);
    p.gpt.model->to(dev);
    p.model = p.gpt.model.ptr();
    p.loaded = runs::loaded_from(
        p.gpt.model.ptr(),
        p.gpt.tokenizer_dir,
        cfg.chat_template == "auto" ? "" : cfg.chat_template);
    p.describe = "Orchard GPT from " + p.gpt.checkpoint_dir;
  }
  if (lora) {
    if (!cfg.adapter.empty()) {
      const std::string dir = runs::adapter_folder(cfg.adapter);
      p.spec = models::read_adapter_config(dir);
      models::load_adapter(*p.model, dir, torch::kFloat32);
    } else {
      train::FinetuneConfig ft = cfg;
      p.spec = train::lora_spec(ft);
      p.model->add_lora(p.spec, torch::kFloat32);
    }
  }
  p.model->train();
  for (const auto& n : p.model->named_parameters()) {
    p.parameters += n.value().numel();
    if (n.value().requires_grad()) {
      p.trained.push_back({n.key(), n.value()});
      p.trainable += n.value().numel();
    }
  }
  return p;
}

// Every adapter's scaling is 0 while it lives: the base model alone.
class AdaptersOff {
 public:
  explicit AdaptersOff(models::AdaptableModel& model) {
    for (auto& [name, proj] : model.projections())
      if (proj->has_lora()) {
        saved_.push_back({proj.get(), proj->scaling});
        proj->scaling = 0.0;
      }
  }
  ~AdaptersOff() {
    for (auto& [p, s] : saved_)
      p->scaling = s;
  }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  std::vector<std::pair<models::ProjImpl*, double>> saved_;
};

// The report's rows comparing the held-out evaluation before training
// (eval_before.json) with the last one; none when either is missing (a
// run whose first steps came from an older Orchard, or no final
// evaluation).
std::vector<std::pair<std::string, std::string>> before_after_rows(
    const std::string& before_path,
    const grpo::Evaluation& after,
    const grpo::Environment& env,
    int64_t prompts) {
  std::ifstream in(before_path);
  const auto before = nlohmann::json::parse(in, nullptr, false);
  if (!before.is_object() || after.completions == 0)
    return {};
  const std::string over = " (" + std::to_string(prompts) +
      " held-out prompts x " +
      std::to_string(after.completions / std::max<int64_t>(1, prompts)) +
      " completions, the same seeds both times)";
  std::vector<std::pair<std::string, std::string>> rows = {
      {"Held-out reward before / after",
       fmt("%.4f", before.value("reward", 0.0)) + " / " +
           fmt("%.4f", after.reward) + over}};
  if (!env.success_label().empty()) {
    std::string label = env.success_label();
    label[0] = char(std::toupper(static_cast<unsigned char>(label[0])));
    rows.push_back(
        {label + " before / after",
         fmt("%.1f", 100 * before.value("success", 0.0)) + " % / " +
             fmt("%.1f", 100 * after.success) + " %"});
  }
  return rows;
}

class GrpoStage : public Stage {
 public:
  using Stage::Stage;

  const config::Schema& schema() const override {
    return grpo::grpo_schema();
  }
  std::unique_ptr<Settings> defaults() const override {
    auto s = std::make_unique<SettingsOf<GrpoConfig>>();
    s->cfg.stage = name();
    s->stage = this;
    return s;
  }

  Report train(
      const Settings& settings,
      const DeviceInfo& device,
      int final_samples) const override {
    const GrpoConfig& cfg = section<GrpoConfig>(settings);
    Report report;
    std::vector<train::Sample> samples;
    report.result = run(cfg, settings.origins, device, final_samples, samples);
    return finish_stage(std::move(report), device, [&](Report& rep) {
      rep.samples = samples;
      rep.sample_note =
          "completions of held-out prompts after training, with their reward";
    });
  }

  bool data_parallel() const override {
    return true;
  }

  Plan plan(const Settings& settings, const DeviceInfo& device) const override {
    const GrpoConfig cfg = resolved(section<GrpoConfig>(settings), device);
    check_source(cfg);
    if (cfg.model.empty())
      throw UserError(
          "orchard plan stage=grpo plans Hugging Face models (model=DIR); an "
          "Orchard GPT's micro-batch is planned when it trains.");
    const models::HfModelConfig mc = models::read_hf_config(cfg.model);
    const GrpoPlanRows p = plan_rows(mc, cfg, device);
    const int64_t gb = grpo::grpo_generation_batch(cfg);
    grpo::grpo_shape(cfg, p.choice.batch, dist::size()); // bad batches fail
    Plan out;
    out.fits = p.choice.fits;
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : p.rows)
      rows.push_back(
          {{"batch", r.batch},
           {"total_bytes", r.memory.total()},
           {"kv_cache_bytes", r.memory.kv_cache},
           {"logps_bytes", r.memory.logps},
           {"reference_bytes", r.memory.reference},
           {"fits", r.fits}});
    const auto dtype = grpo_dtype(cfg, device);
    out.json = {
        {"stage", "grpo"},
        {"architecture", mc.architecture},
        {"finetune", finetune_kind(cfg)},
        {"base_dtype", dtype_name(dtype)},
        {"weights_dtype", cfg.weights_dtype},
        {"optim", cfg.optim},
        {"load_in_4bit", cfg.load_in_4bit},
        {"generation_batch", gb},
        {"num_generations", cfg.num_generations},
        {"tokens_per_row", cfg.max_prompt_length + cfg.max_completion_length},
        {"budget_bytes", p.budget.bytes},
        {"candidates", rows},
        {"choice",
         {{"batch", p.choice.batch},
          {"total_bytes", p.choice.memory.total()},
          {"fits", p.choice.fits}}}};
    out.text = "Model: " + cfg.model + " (" + mc.architecture + "), GRPO " +
        finetune_kind(cfg) + ", " +
        (finetune_kind(cfg) == "full"
             ? cfg.weights_dtype + " weights, " +
                 (train::finetune_optimizer_options(cfg).adam_8bit
                      ? "8-bit AdamW moments"
                      : "float32 AdamW moments")
         : cfg.load_in_4bit ? "4-bit NF4 base computing in " + dtype_name(dtype)
                            : dtype_name(dtype) + " base") +
        "; " + std::to_string(gb) + " completions per generation (" +
        std::to_string(gb / cfg.num_generations) + " prompts x " +
        std::to_string(cfg.num_generations) + ") of up to " +
        std::to_string(cfg.max_prompt_length) + " + " +
        std::to_string(cfg.max_completion_length) + " tokens" +
        (cfg.gradient_checkpointing ? ", gradient checkpointing" : "") +
        "\n" + plan_table(p) + "\nChoice: per_device_train_batch_size=" +
        std::to_string(p.choice.batch) +
        (cfg.device_batch_size ? " (as set)" : " (the largest that fits)") +
        ", " + train::format_mb(p.choice.memory.total()) + "\n";
    return out;
  }

  std::string next_steps(const Settings& settings, const Report& report)
      const override {
    const GrpoConfig& cfg = section<GrpoConfig>(settings);
    const train::TrainResult& r = report.result;
    if (r.interrupted)
      return "Stopped; the same command resumes from the checkpoint.\n";
    const std::string& orchard = program_name();
    if (!cfg.checkpoint.empty())
      return "\nChat with it: " + orchard + " chat --checkpoint " + r.run_dir +
          "\n";
    if (finetune_kind(cfg) == "lora")
      return "\nChat with it: " + orchard + " chat --model " + cfg.model +
          " --adapter " + r.output_dir + "\n";
    return "\nChat with it: " + orchard + " chat --model " + r.output_dir +
        "\n";
  }

 private:
  static train::TrainResult run(
      const GrpoConfig& given,
      const config::Origins& origins,
      const DeviceInfo& device,
      int final_samples,
      std::vector<train::Sample>& samples_out) {
    using namespace train;
    std::string auto_why;
    const GrpoConfig cfg =
        resolved(given, device, &auto_why, grpo_run_dir(given));
    check_source(cfg);
    const torch::Device dev = device.device;
    const bool lora = finetune_kind(cfg) == "lora";
    // Settings that fail without the model fail first.
    grpo::grpo_shape(cfg, 1, dist::size());
    const auto scale = grpo::parse_scale_rewards(cfg.scale_rewards);
    const auto loss_type = grpo::parse_loss_type(cfg.loss_type);
    const auto level =
        grpo::parse_importance_level(cfg.importance_sampling_level);
    std::vector<double> weights;
    for (const auto& w : cfg.reward_weights) {
      char* end = nullptr;
      const double v = std::strtod(w.c_str(), &end);
      if (w.empty() || !end || *end != '\0' || !std::isfinite(v))
        throw UserError(
            "reward_weights: '" + w + "' is not a number; give one number "
            "per reward function, such as reward_weights=[1.0,0.5].");
      weights.push_back(v);
    }

    TrainResult result;
    result.stage = "grpo";
    const std::string source = cfg.model.empty() ? cfg.checkpoint : cfg.model;
    result.run_dir = grpo_run_dir(cfg);
    if (cfg.data.size() > 1)
      throw UserError(
          "stage=grpo reads one data file; give data=FILE (merge the others "
          "into it).");
    // The environment: bad data fails before a run folder is made (rank 0
    // prepares what it caches first).
    decltype(grpo::make_environment({})) env;
    dist::leader_first("preparing the environment", [&] {
      env = grpo::make_environment(
          {.name = cfg.env,
           .data = cfg.data.empty() ? "" : cfg.data.front(),
           .words = cfg.words,
           .data_dir = cfg.data_dir.empty() ? default_data_dir() : cfg.data_dir,
           .seed = uint64_t(cfg.seed)});
    });
    // A run trained from an older checkpoint of its starting run is stale
    // (the pipeline's sft trained further): kept aside and trained anew.
    if (!cfg.checkpoint.empty() && cfg.resume == "auto" && dist::leader()) {
      const auto starts = runs::list_checkpoints(cfg.checkpoint);
      if (auto moved = runs::set_aside_if_stale(
              result.run_dir,
              starts.empty() ? cfg.checkpoint : starts.back().second,
              "grpo");
          !moved.empty())
        std::printf("%s\n", moved.c_str());
    }
    train::make_run_folder(result.run_dir, [&] {
      GrpoConfig written = cfg;
      config::write_yaml(
          result.run_dir + "/config.yaml", grpo::grpo_schema(), &written,
          origins);
    });
    RunLog log(result.run_dir + "/train.log");

    // reward_cmd.
    std::unique_ptr<grpo::RewardProcess> reward_process;
    if (!cfg.reward_cmd.empty())
      reward_process = std::make_unique<grpo::RewardProcess>(
          cfg.reward_cmd, cfg.reward_timeout);

    // The policy.
    const torch::ScalarType dtype = grpo_dtype(cfg, device);
    torch::manual_seed(uint64_t(cfg.seed));
    log("Loading the policy (" + std::string(lora ? "LoRA" : "full") +
        (lora && cfg.load_in_4bit ? ", 4-bit NF4 base" : "") + ", " +
        dtype_name(
            lora ? dtype : train::full_weights_dtype(grpo::as_finetune(cfg))) +
        " weights on " + device.name + ")...");
    if (!auto_why.empty())
      log("Weights and optimizer: " + auto_why);
    LoadedPolicy pol = load_policy(cfg, device, dtype);
    result.parameters = pol.parameters;
    result.trainable_parameters = pol.trainable;
    result.tokenizer_dir = pol.loaded.tokenizer_dir;
    result.init_dir = source;

    // Prompts: the chat template, or raw text.
    std::shared_ptr<const text::ChatTemplate> tmpl;
    if (cfg.prompt_format != "raw") {
      try {
        tmpl = std::make_shared<const text::ChatTemplate>(
            runs::chat_template(pol.loaded));
      } catch (const UserError& e) {
        if (cfg.prompt_format == "chat")
          throw;
      }
    }
    // Prompts keep what the model's positions leave after the completion.
    const int64_t positions = pol.model->max_seq_len();
    const int64_t prompt_limit = std::min(
        cfg.max_prompt_length, positions - cfg.max_completion_length);
    if (prompt_limit < 1)
      throw UserError(
          "max_completion_length=" + std::to_string(cfg.max_completion_length) +
          " leaves no room for a prompt in the model's " +
          std::to_string(positions) + " positions; lower it.");
    if (prompt_limit < cfg.max_prompt_length)
      log("Prompts: at most " + std::to_string(prompt_limit) +
          " tokens (the model reads " + std::to_string(positions) +
          " positions, max_completion_length takes " +
          std::to_string(cfg.max_completion_length) + ").");
    auto prompter = std::make_shared<grpo::Prompter>(
        pol.loaded.tokenizer, tmpl, prompt_limit);

    // The micro-batch: as set, or the plan's (HF) / the largest divisor up
    // to 8 (a GPT, small by construction).
    int64_t micro = 0;
    std::string micro_why;
    if (!cfg.model.empty()) {
      const GrpoPlanRows p = plan_rows(pol.llama->config, cfg, device);
      micro = p.choice.batch;
      micro_why = cfg.device_batch_size
          ? "as set"
          : "auto: the largest dividing the step that the plan fits in " +
              format_mb(double(p.budget.bytes));
      log("Memory estimate: " + format_mb(p.choice.memory.total()) +
          " (rollouts' KV cache " + format_mb(p.choice.memory.kv_cache) +
          ", log-probabilities " + format_mb(p.choice.memory.logps) + ")");
    } else {
      const int64_t g = std::gcd(
          grpo::grpo_rows_per_step(cfg), grpo::grpo_generation_batch(cfg));
      micro = cfg.device_batch_size.value_or(1);
      if (!cfg.device_batch_size)
        for (int64_t b = 1; b <= std::min<int64_t>(g, 8); ++b)
          if (g % b == 0)
            micro = b;
      micro_why = cfg.device_batch_size ? "as set" : "auto";
    }
    const grpo::GrpoShape shape = grpo::grpo_shape(cfg, micro, dist::size());
    // Several processes: each takes its own prompts of every generation
    // (per_device_train_batch_size x gradient_accumulation_steps rows a
    // step, as TRL's), one generation per optimizer step, so that no
    // process's rollouts outlive a step (the checkpoint is rank 0's).
    const int world = dist::size();
    if (world > 1 &&
        (cfg.policy_iterations > 1 ||
         shape.generation_batch != shape.rows_per_step))
      throw UserError(
          "with " + std::to_string(world) +
          " processes GRPO generates once per optimizer step: leave "
          "generation_batch_size and steps_per_generation unset (a generation "
          "of " +
          std::to_string(shape.generation_batch) + " completions here, " +
          std::to_string(shape.rows_per_step) +
          " per step) and keep num_iterations=1 (it is " +
          std::to_string(cfg.policy_iterations) +
          "), or train in one process.");

    grpo::LearnerOptions lo;
    lo.num_generations = cfg.num_generations;
    lo.generation_batch = shape.generation_batch;
    lo.max_completion_length = cfg.max_completion_length;
    lo.policy_iterations = cfg.policy_iterations;
    lo.keep_old_logps =
        cfg.policy_iterations > 1 || shape.generation_batch > shape.rows_per_step;
    lo.temperature = cfg.temperature;
    lo.top_p = cfg.top_p;
    lo.min_p = cfg.min_p;
    lo.repetition_penalty = cfg.repetition_penalty;
    lo.top_k = cfg.top_k;
    lo.sampling_device = cfg.sampling_device;
    lo.scale = scale;
    lo.loss.type = loss_type;
    lo.loss.level = level;
    lo.loss.epsilon_low = cfg.epsilon;
    lo.loss.epsilon_high = cfg.epsilon_high.value_or(cfg.epsilon);
    lo.loss.delta = cfg.delta;
    lo.loss.beta = cfg.beta;
    lo.loss.max_completion_length = cfg.max_completion_length;
    lo.mask_truncated = cfg.mask_truncated_completions;
    lo.rows_per_step = shape.rows_per_step;
    lo.weights = weights;
    lo.seed = uint64_t(cfg.seed);
    lo.graphs = dev.is_cuda();
    lo.rank = dist::rank();
    lo.world = world;

    grpo::Policy policy;
    policy.model = pol.model;
    policy.device = dev;
    std::shared_ptr<models::LanguageModel> frozen;
    if (cfg.beta != 0.0) {
      if (lora) {
        policy.with_reference = [m = pol.model](const auto& fn) {
          AdaptersOff off(*m);
          fn(*m);
        };
      } else {
        // A frozen copy of the starting weights.
        LoadedPolicy ref = load_policy(cfg, device, dtype);
        for (auto& p : ref.model->parameters())
          p.set_requires_grad(false);
        ref.model->eval();
        frozen = ref.model;
        policy.with_reference = [frozen](const auto& fn) { fn(*frozen); };
      }
    }
    grpo::Learner learner(lo, policy, *env, prompter, reward_process.get());

    // The optimizer: AdamW over the trained parameters.
    std::vector<ParamGroup> groups = {
        {.name = lora ? "adapters" : "weights",
         .params = pol.trained,
         .lr = cfg.lr.value_or(lora ? 1e-5 : 1e-6),
         .weight_decay = cfg.weight_decay,
         .muon = false}};
    Optimizers optimizers(
        std::move(groups), train::finetune_optimizer_options(cfg));

    Precision precision;
    if (lora) {
      precision.compute = torch::kFloat32;
      precision.loss_scaling = dtype == torch::kFloat16;
      precision.name = dtype_name(dtype) + " base (frozen), float32 adapters";
      precision.why = "LoRA";
    } else {
      precision = train::full_precision(grpo::as_finetune(cfg), device);
    }

    int64_t B = shape.micro_batch;
    TrainingTask task;
    task.model = pol.model;
    task.micro_step = [&] { return learner.micro_step(B); };
    grpo::Evaluation last_eval;
    task.evaluate = [&] {
      const grpo::Evaluation ev = learner.evaluate(cfg.eval_prompts);
      last_eval = ev;
      EvalResult r;
      r.loss = -ev.reward;
      r.metrics.push_back({"eval_reward", ev.reward});
      std::string parts;
      for (const auto& [n, v] : ev.per_function) {
        r.metrics.push_back({"eval_rewards/" + n + "/mean", v});
        parts += (parts.empty() ? "" : ", ") + n + " " + fmt("%.3f", v);
      }
      r.summary = "held-out reward " + fmt("%.4f", ev.reward) + " over " +
          std::to_string(ev.completions) + " completions (" + parts + ")";
      if (!env->success_label().empty()) {
        r.metrics.push_back({"eval_success", ev.success});
        r.summary += "; " + fmt("%.1f", 100 * ev.success) + " % " +
            env->success_label();
      }
      return r;
    };
    task.sample = [&](int64_t step) {
      for (const auto& s : learner.samples(2, uint64_t(cfg.seed) + 7 +
                                                  uint64_t(step))) {
        std::printf(
            "  [%s] -> %s (reward %.3f)\n",
            s.prompt.substr(s.prompt.size() > 160 ? s.prompt.size() - 160 : 0)
                .c_str(),
            s.completion.c_str(),
            s.reward);
      }
      std::fflush(stdout);
    };
    task.data_state = [&] { return learner.state(); };
    task.restore_data = [&](const nlohmann::json& j) { learner.restore(j); };
    task.set_micro_batch = [&](int64_t b) { B = b; };
    int64_t steps_logged = 0;
    double last_step_end = now_s();
    task.step_metrics = [&] {
      auto m = learner.step_metrics();
      // The step's seconds split: generating, scoring, the rest training.
      const double now = now_s();
      m["step_s"] = now - last_step_end;
      last_step_end = now;
      m["training_s"] = m["step_s"] -
          (m.count("generation_s") ? m["generation_s"] + m["scoring_s"] : 0.0);
      if (++steps_logged % cfg.logging_steps == 0 && m.count("reward")) {
        std::string line = "step " + std::to_string(steps_logged) +
            ": reward " + fmt("%.4f", m["reward"]);
        for (const auto& [k, v] : m)
          if (k.rfind("rewards/", 0) == 0 && k.size() > 5 &&
              k.substr(k.size() - 5) == "/mean")
            line += ", " + k.substr(8, k.size() - 13) + " " + fmt("%.3f", v);
        log.file_only(line);
      }
      return m;
    };
    task.progress_note = [&] { return learner.progress_note(); };
    // The precision it began with, which a resume with auto keeps
    // (adopt_run_precision).
    task.describe = {
        {"stage", "grpo"},
        {"env", cfg.env},
        {"weights_dtype", cfg.weights_dtype},
        {"optim", cfg.optim}};
    if (!cfg.model.empty()) {
      task.describe["model_dir"] = fs::absolute(cfg.model).string();
      task.describe["architecture"] = pol.llama->config.architecture;
    } else {
      task.describe["model"] = pol.gpt.state.at("model");
      task.describe["tokenizer"] = pol.gpt.tokenizer_dir;
      task.describe["init"] = pol.gpt.checkpoint_dir;
    }
    if (lora)
      task.describe["lora"] = {
          {"r", pol.spec.r},
          {"alpha", pol.spec.alpha},
          {"dropout", pol.spec.dropout},
          {"target_modules", pol.spec.target_modules}};

    const int64_t total = cfg.num_iterations.value_or(200);
    TrainerOptions to{
        .run_dir = result.run_dir,
        .device = dev,
        .precision = precision,
        .total_steps = total,
        .micro_batch = B,
        .grad_accum = shape.accumulation,
        .tokens_per_step =
            shape.rows_per_step * world * cfg.max_completion_length,
        .grad_clip = cfg.grad_clip,
        .zero_stage = int(cfg.zero_stage),
        .grad_reduce_dtype =
            *parse_dtype(cfg.grad_reduce_dtype, "grad_reduce_dtype"),
        .bucket_cap_mb = cfg.bucket_cap_mb,
        .grad_average = dist::mover_named(cfg.grad_average),
        .warmup_steps = cfg.warmup_steps,
        .warmdown_ratio = cfg.warmdown_ratio,
        .eval_every = cfg.eval_every,
        .sample_every = cfg.sample_every,
        .save_every = cfg.save_every,
        .save_total_limit = cfg.save_total_limit,
        .resume = cfg.resume};
    Trainer trainer(to, task, optimizers, log);
    const int64_t start = trainer.resume();
    B = trainer.micro_batch();
    if (start < total) {
      log("Stage: GRPO on " + pol.describe + ", " +
          std::to_string(pol.trainable) + " of " +
          std::to_string(pol.parameters) + " parameters trained" +
          (lora ? " (LoRA r=" + std::to_string(pol.spec.r) + ")" : ""));
      log("Environment: " + env->describe() + "; prompts " +
          (prompter->chat() ? "through the chat template" : "as raw text") +
          (reward_process ? "; reward_cmd: " + cfg.reward_cmd : ""));
      log("Rollouts: " + std::to_string(shape.prompts_per_generation) +
          " prompts x " + std::to_string(cfg.num_generations) +
          " completions per generation" +
          (world > 1 ? " (all processes' together)" : std::string()) +
          ", up to " +
          std::to_string(cfg.max_completion_length) +
          " new tokens, temperature " + fmt("%g", cfg.temperature) + "; " +
          cfg.loss_type + " loss, beta " + fmt("%g", cfg.beta) +
          ", num_iterations " + std::to_string(cfg.policy_iterations));
      log("Batch: " + std::to_string(shape.rows_per_step) +
          " completions per step = " + std::to_string(B) +
          " per micro-step (" + micro_why + ") x " +
          std::to_string(trainer.grad_accum()) +
          (world > 1 ? " on each of " + std::to_string(world) + " processes"
                     : std::string()) +
          "; " + std::to_string(total) +
          " steps; precision " + precision.name + "; run folder " +
          result.run_dir);
    }
    // The held-out evaluation before the first step, kept in the run
    // folder so that the report compares before and after across resumes
    // (the same prompts and sampling seeds both times).
    const std::string before_path = result.run_dir + "/eval_before.json";
    if (start == 0 && start < total && dist::leader()) {
      log("Evaluating " + std::to_string(cfg.eval_prompts) +
          " held-out prompts before training...");
      const grpo::Evaluation ev = learner.evaluate(cfg.eval_prompts);
      atomic_write(
          before_path,
          nlohmann::json{
              {"reward", ev.reward},
              {"success", ev.success},
              {"completions", ev.completions}}
                  .dump() +
              "\n");
      log("Before training: held-out reward " + fmt("%.4f", ev.reward) +
          (env->success_label().empty()
               ? ""
               : ", " + fmt("%.1f", 100 * ev.success) + " % " +
                   env->success_label()));
    }
    last_step_end = now_s();
    TrainerResult tr = trainer.run();
    copy_trainer_result(tr, result);
    result.total = total;
    if (tr.interrupted || !dist::leader()) // rank 0 writes what it trained
      return result;
    result.data_description = env->describe();
    result.report_rows =
        before_after_rows(before_path, last_eval, *env, cfg.eval_prompts);
    if (!cfg.model.empty()) {
      if (lora) {
        result.output_dir = result.run_dir + "/adapter";
        models::save_adapter(
            *pol.model, pol.spec, result.output_dir,
            fs::absolute(cfg.model).string());
      } else {
        result.output_dir = result.run_dir + "/model";
        models::write_merged_model(pol.llama, cfg.model, result.output_dir);
      }
      result.checkpoint_dir = result.output_dir;
    } else {
      result.output_dir = result.run_dir;
    }
    if (!tr.already_done) {
      log("Done: step " + std::to_string(total) + ", held-out reward " +
          fmt("%.4f", -result.val_loss) + ". " +
          (lora ? "Adapter (PEFT format): " + result.output_dir
                : "Model: " + result.output_dir));
      for (const auto& s :
           learner.samples(final_samples, uint64_t(cfg.seed) + 99))
        samples_out.push_back(
            {s.prompt,
             s.completion,
             (s.reference.empty() ? "" : s.reference + " ") + "(reward " +
                 fmt("%.3f", s.reward) + ")"});
    }
    return result;
  }
};

} // namespace

const Stage& grpo_stage() {
  static const GrpoStage stage(
      "grpo",
      "GRPO with reward functions on a Hugging Face model or an Orchard run "
      "(model=DIR|checkpoint=RUN env=wordle|answers|wordnet|...)");
  return stage;
}

} // namespace orchard::stages
