#include "train/finetune.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/memory_stats.h"
#include "core/progress.h"
#include "core/torch_compat.h"
#include "data/chat_file.h"
#include "data/loader.h"
#include "dist/world.h"
#include "models/lora.h"
#include "train/memory_plan.h"
#include "train/memory_probe.h"
#include "train/precision.h"
#include "train/pretrain.h"
#include "train/stage_data.h"
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

namespace orchard::train {
namespace {
namespace fs = std::filesystem;
} // namespace

models::LoraSpec lora_spec(const FinetuneConfig& cfg) {
  models::LoraSpec s;
  s.r = cfg.lora_r;
  s.alpha = cfg.lora_alpha;
  s.dropout = cfg.lora_dropout;
  s.target_modules = models::normalize_target_modules(cfg.lora_target_modules);
  return s;
}

const config::Schema& finetune_schema() {
  using config::field;
  using C = FinetuneConfig;
  static const config::Schema schema = [] {
    config::Schema s("fine-tuning");
    s.add(
        {.key = "stage",
         .access = field(&C::stage),
         .help = "lora (adapters on a frozen base) or full (every weight)",
         .choices = {"lora", "full"}});
    s.add(
        {.key = "model",
         .access = field(&C::model),
         .help = "the Hugging Face model folder (config.json, "
                 "*.safetensors, tokenizer.json)",
         .aliases = {"model_name_or_path", "base_model"}});
    s.add(
        {.key = "data",
         .access = field(&C::data),
         .help = "JSONL files or folders: chat messages, ShareGPT, "
                 "prompt/completion or text; every 20th record validates",
         .aliases = {"dataset", "train_file", "chat_data"}});
    s.add(
        {.key = "chat_template",
         .access = field(&C::chat_template),
         .help = "how conversations are rendered: auto (the model folder's "
                 "own Jinja template) or a built-in family",
         .choices = {
             "auto", "llama3", "chatml", "mistral", "orchard", "plain"}});
    s.add(
        {.key = "lora.r",
         .access = field(&C::lora_r),
         .help = "adapter rank (16)",
         .aliases = {"lora_r", "r"},
         .min = 1,
         .max = 4096});
    s.add(
        {.key = "lora.alpha",
         .access = field(&C::lora_alpha),
         .help = "adapter scale numerator: updates are scaled by alpha / r "
                 "(32)",
         .aliases = {"lora_alpha"},
         .min = 0});
    s.add(
        {.key = "lora.dropout",
         .access = field(&C::lora_dropout),
         .help = "dropout on the adapters' input (0)",
         .aliases = {"lora_dropout"},
         .min = 0,
         .max = 0.9});
    s.add(
        {.key = "lora.target_modules",
         .access = field(&C::lora_target_modules),
         .help = "projections that get adapters ([q_proj, k_proj, v_proj, "
                 "o_proj, gate_proj, up_proj, down_proj]; short names "
                 "and all-linear work)",
         .aliases = {"target_modules", "lora_target_modules"}});
    train::add_training_options(
        s, train::Spelling::transformers, train::training_part<C>);
    s.add(
        {.key = "gradient_accumulation_steps",
         .access = field(&C::gradient_accumulation_steps),
         .help = "micro-steps per optimizer step (1); with device_batch_size "
                 "auto, the effective batch is 8 x this and the machine "
                 "splits it",
         .aliases = {"grad_accum"},
         .min = 1});
    s.add(
        {.key = "total_batch_size",
         .access = field(&C::total_batch_size),
         .help = "tokens per optimizer step, a multiple of max_seq_length "
                 "(auto: device_batch_size x gradient_accumulation_steps x "
                 "max_seq_length)",
         .env = "TOTAL_BATCH_SIZE",
         .min = 1});
    s.add(
        {.key = "pack",
         .access = field(&C::pack),
         .help = "pack whole conversations back to back in each row "
                 "(true) or one padded conversation per row (false)",
         .aliases = {"packing"}});
    s.add(
        {.key = "optim",
         .access = field(&C::optim),
         .help = "optimizer: adamw_torch (AdamW) or adamw_8bit (AdamW with "
                 "its two moments in 8 bits: 2 bytes a trained weight "
                 "instead of 8; bitsandbytes' name, on every device); auto: "
                 "adamw_8bit when the weights are bfloat16 (weights_dtype), "
                 "else adamw_torch",
         .choices = {
             "auto", "adamw_torch", "adamw", "adamw_8bit", "adamw_bnb_8bit"}});
    s.add(
        {.key = "weights_dtype",
         .access = field(&C::weights_dtype),
         .help = "full: float32 (a float32 copy of every weight, computing "
                 "under autocast) or bfloat16 (the weights held in bfloat16 "
                 "and updated with stochastic rounding: half the memory of "
                 "weights and gradients); auto: bfloat16 for a checkpoint "
                 "stored in bfloat16 on a GPU that computes bfloat16, else "
                 "float32",
         .choices = {"auto", "float32", "bfloat16"}});
    s.add(
        {.key = "adam_beta1",
         .access = field(&C::adam_beta1),
         .help = "0.9",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "adam_beta2",
         .access = field(&C::adam_beta2),
         .help = "0.999",
         .min = 0,
         .max = 1});
    s.add(
        {.key = "adam_epsilon",
         .access = field(&C::adam_epsilon),
         .help = "1e-8",
         .min = 0});
    s.add(
        {.key = "fp16",
         .access = field(&C::fp16),
         .help = "transformers' switch: dtype=float16"});
    s.add(
        {.key = "bf16",
         .access = field(&C::bf16),
         .help = "transformers' switch: dtype=bfloat16"});
    s.add(
        {.key = "gradient_checkpointing",
         .access = field(&C::gradient_checkpointing),
         .help = "recompute each layer in the backward instead of keeping "
                 "its activations (true)"});
    s.add(
        {.key = "load_in_4bit",
         .access = field(&C::load_in_4bit),
         .help = "lora: the base's layer projections in 4 bits (NF4, as "
                 "QLoRA): about a quarter of the memory, slower steps"});
    return s;
  }();
  return schema;
}

int64_t finetune_rows_per_step(const FinetuneConfig& cfg) {
  const int64_t T = cfg.max_seq_len;
  int64_t rows = cfg.device_batch_size.value_or(kDefaultRowsPerDevice) *
      cfg.gradient_accumulation_steps;
  if (cfg.total_batch_size) {
    if (*cfg.total_batch_size % T != 0)
      throw UserError(
          "total_batch_size=" + std::to_string(*cfg.total_batch_size) +
          " is not a whole number of rows of max_seq_length=" +
          std::to_string(T) + " tokens; use a multiple of " +
          std::to_string(T) + " (e.g. " +
          std::to_string(std::max<int64_t>(1, *cfg.total_batch_size / T) * T) +
          ").");
    rows = *cfg.total_batch_size / T;
    // Several processes share the step's rows (each its own part).
    const int64_t world = dist::size();
    if (rows % world != 0)
      throw UserError(
          "total_batch_size=" + std::to_string(*cfg.total_batch_size) + " is " +
          std::to_string(rows) + " rows of " + std::to_string(T) +
          " tokens, which " + std::to_string(world) +
          " processes cannot share evenly; use a multiple of " +
          std::to_string(T * world) + " (e.g. " +
          std::to_string(std::max<int64_t>(1, rows / world) * world * T) +
          ").");
    rows /= world;
  }
  if (cfg.device_batch_size && rows % *cfg.device_batch_size != 0)
    throw UserError(
        "device_batch_size=" + std::to_string(*cfg.device_batch_size) +
        " does not divide the " + std::to_string(rows) +
        " rows per step of total_batch_size=" + std::to_string(rows * T) +
        "; choose a divisor of " + std::to_string(rows) +
        " or leave device_batch_size at auto.");
  return rows;
}

std::string resolve_auto_precision(
    FinetuneConfig& cfg,
    const DeviceInfo& device,
    std::optional<torch::ScalarType> stored) {
  if (cfg.weights_dtype != "auto" && cfg.optim != "auto")
    return "";
  const bool weights_auto = cfg.weights_dtype == "auto";
  if (weights_auto) {
    const bool bf16 = cfg.stage != "lora" && stored == torch::kBFloat16 &&
        computes_bfloat16_natively(device);
    cfg.weights_dtype = bf16 ? "bfloat16" : "float32";
  }
  if (cfg.optim == "auto")
    cfg.optim = cfg.weights_dtype == "bfloat16" ? "adamw_8bit" : "adamw_torch";
  if (cfg.stage == "lora")
    return "auto: LoRA's adapters are float32 with float32 moments";
  if (cfg.weights_dtype == "float32")
    return std::string("auto: float32 weights and moments (") +
        (weights_auto && stored != torch::kBFloat16
             ? "the checkpoint is stored in " +
                 (stored ? dtype_name(*stored) : std::string("float32"))
             : weights_auto
             ? device.kind + " does not compute bfloat16 natively"
             : "weights_dtype=float32 as set") +
        ")";
  const std::string moments = cfg.optim == "adamw_8bit"
      ? "8-bit AdamW moments (TRL's torch AdamW holds them in bfloat16)"
      : "float32 AdamW moments";
  return weights_auto ? "auto: the checkpoint is bfloat16 and " + device.kind +
          " computes bfloat16, so bfloat16 weights and " + moments +
          "; weights_dtype=float32 optim=adamw_torch for float32 weights "
          "and moments"
                      : "auto: bfloat16 weights as set, with " + moments;
}

torch::ScalarType full_weights_dtype(const FinetuneConfig& cfg) {
  if (cfg.weights_dtype == "auto" || cfg.optim == "auto")
    throw std::logic_error(
        "weights_dtype/optim auto reached training unresolved "
        "(resolve_auto_precision)");
  if (cfg.weights_dtype == "float32")
    return torch::kFloat32;
  if (cfg.stage == "lora")
    throw UserError(
        "weights_dtype=" + cfg.weights_dtype +
        " sets how full fine-tuning holds the weights it trains; LoRA trains "
        "float32 adapters on a frozen base whose dtype is dtype=. Drop "
        "weights_dtype, or use full fine-tuning (stage=full; for GRPO "
        "finetune=full).");
  return torch::kBFloat16;
}

Precision full_precision(const FinetuneConfig& cfg, const DeviceInfo& device) {
  Precision p = resolve_precision(
      cfg.fp16       ? "float16"
          : cfg.bf16 ? "bfloat16"
                     : cfg.dtype,
      device);
  if (full_weights_dtype(cfg) == torch::kBFloat16)
    p.name = p.compute == torch::kFloat32
        ? "bfloat16 weights (stochastic rounding), computing in bfloat16"
        : p.compute == torch::kBFloat16
        ? "bfloat16 weights (stochastic rounding), bfloat16 autocast"
        : "bfloat16 weights (stochastic rounding), float16 autocast";
  return p;
}

OptimizerOptions finetune_optimizer_options(const FinetuneConfig& cfg) {
  OptimizerOptions oo;
  oo.adam_beta1 = cfg.adam_beta1;
  oo.adam_beta2 = cfg.adam_beta2;
  oo.adam_eps = cfg.adam_epsilon;
  if (cfg.optim == "auto")
    throw std::logic_error(
        "optim=auto reached the optimizer unresolved (resolve_auto_precision)");
  oo.adam_8bit = cfg.optim == "adamw_8bit" || cfg.optim == "adamw_bnb_8bit";
  oo.seed = uint64_t(cfg.seed);
  return oo;
}

torch::ScalarType finetune_dtype(
    const FinetuneConfig& cfg,
    const DeviceInfo& device) {
  std::string d = cfg.dtype;
  if (cfg.fp16 && cfg.bf16)
    throw UserError("fp16=true and bf16=true together; choose one.");
  if (cfg.fp16 || cfg.bf16) {
    const std::string want = cfg.fp16 ? "float16" : "bfloat16";
    if (d != "auto" && d != want)
      throw UserError(
          (cfg.fp16 ? "fp16=true" : "bf16=true") +
          std::string(" contradicts dtype=") + d + "; set one of them.");
    d = want;
  }
  return resolve_dtype(d, "dtype", device);
}

namespace {

// How a run computes: stage=lora in the base's dtype (no autocast; float16
// activations need loss scaling), stage=full under autocast.
Precision finetune_precision(
    const FinetuneConfig& cfg,
    const DeviceInfo& device,
    torch::ScalarType dtype) {
  if (cfg.stage != "lora")
    return full_precision(cfg, device);
  Precision precision;
  precision.compute = torch::kFloat32;
  precision.loss_scaling = dtype == torch::kFloat16;
  precision.name = (cfg.load_in_4bit ? "4-bit NF4 base (frozen, computing in " +
                            dtype_name(dtype) + ")"
                                     : dtype_name(dtype) + " base (frozen)") +
      ", float32 adapters";
  precision.why = cfg.dtype == "auto" && !cfg.fp16 && !cfg.bf16
      ? "auto: " + device.kind
      : "asked for";
  return precision;
}

// The model a run trains, loaded as `cfg` says (the base in `dtype` or 4
// bits with LoRA added for stage=lora, float32 for stage=full), in train
// mode, with the parameters the optimizer updates.
struct TrainableModel {
  models::Llama model{nullptr};
  std::vector<std::pair<std::string, torch::Tensor>> trained;
  int64_t parameters = 0, trainable = 0;
};

TrainableModel load_for_training(
    const FinetuneConfig& cfg,
    torch::ScalarType dtype,
    const torch::Device& dev) {
  const bool lora = cfg.stage == "lora";
  models::LoadOptions lo;
  lo.device = dev;
  lo.dtype = lora ? dtype : full_weights_dtype(cfg);
  lo.context = cfg.max_seq_len;
  lo.load_in_4bit = lora && cfg.load_in_4bit;
  lo.one_allocation = lora; // a frozen base
  TrainableModel t;
  t.model = models::load_hf_model(cfg.model, lo);
  t.model->gradient_checkpointing = cfg.gradient_checkpointing;
  if (lora)
    t.model->add_lora(lora_spec(cfg), torch::kFloat32);
  t.model->train();
  for (const auto& p : t.model->named_parameters()) {
    t.parameters += p.value().numel();
    if (p.value().requires_grad()) {
      t.trained.push_back({p.key(), p.value()});
      t.trainable += p.value().numel();
    }
  }
  return t;
}

Optimizers finetune_optimizers(
    const FinetuneConfig& cfg,
    std::vector<std::pair<std::string, torch::Tensor>> trained) {
  const bool lora = cfg.stage == "lora";
  std::vector<ParamGroup> groups = {
      {.name = lora ? "adapters" : "weights",
       .params = std::move(trained),
       .lr = cfg.lr.value_or(lora ? 2e-4 : 1e-5),
       .weight_decay = cfg.weight_decay,
       .muon = false}};
  return Optimizers(std::move(groups), finetune_optimizer_options(cfg));
}

} // namespace

FinetuneProbe measure_finetune_peak(
    const FinetuneConfig& cfg,
    const DeviceInfo& device,
    int64_t batch) {
  const torch::Device dev = device.device;
  const models::HfModelConfig mc = models::read_hf_config(cfg.model);
  const torch::ScalarType dtype = finetune_dtype(cfg, device);
  const Precision precision = finetune_precision(cfg, device, dtype);
  const int64_t T = cfg.max_seq_len;
  const uint64_t base = probe_baseline(dev);
  uint64_t peak = 0;
  {
    torch::manual_seed(uint64_t(cfg.seed));
    TrainableModel t = load_for_training(cfg, dtype, dev);
    Optimizers optimizers = finetune_optimizers(cfg, std::move(t.trained));
    auto x = torch::randint(0, mc.vocab_size, {batch, T}, torch::kLong).to(dev);
    auto y = torch::randint(0, mc.vocab_size, {batch, T}, torch::kLong).to(dev);
    peak = peak_of_two_steps(
        [&] { return t.model->loss(x, y); },
        optimizers,
        cfg.gradient_accumulation_steps,
        precision.compute,
        dev);
  }
  FinetuneProbe r;
  r.measured = double(peak > base ? peak - base : 0);
  r.predicted = finetune_memory(mc, cfg, dtype, batch, dev.type());
  return r;
}

TrainResult run_finetune(
    const FinetuneConfig& given,
    const config::Origins& origins,
    const DeviceInfo& device) {
  const torch::Device dev = device.device;
  const bool lora = given.stage == "lora";
  if (given.model.empty())
    throw UserError(
        "stage=" + given.stage +
        " needs model=DIR, the folder of a Hugging Face model (config.json, "
        "*.safetensors, tokenizer.json).");
  if (given.data.empty())
    throw UserError(
        "stage=" + given.stage +
        " needs data=FILE (or a folder, or [a.jsonl, b.jsonl]): chat JSONL "
        "{\"messages\": [...]}, {\"prompt\", \"completion\"} or {\"text\"}.");
  models::HfModelConfig mc = models::read_hf_config(given.model);
  FinetuneConfig cfg = given;
  const std::string auto_why = resolve_auto_precision(cfg, device, mc.dtype);
  const torch::ScalarType dtype = finetune_dtype(cfg, device);
  const Precision precision = finetune_precision(cfg, device, dtype);
  if (cfg.load_in_4bit && !lora)
    throw UserError(
        "load_in_4bit=true holds a frozen base in 4 bits for stage=lora; "
        "stage=full trains every weight and needs them in full precision. "
        "Use stage=lora, or drop load_in_4bit.");
  full_weights_dtype(cfg); // weights_dtype with LoRA fails here
  const int64_t T = cfg.max_seq_len;
  if (T > mc.max_position_embeddings)
    throw UserError(
        "max_seq_length=" + std::to_string(T) +
        " is longer than the model's "
        "max_position_embeddings (" +
        std::to_string(mc.max_position_embeddings) + ").");

  finetune_rows_per_step(cfg); // a batch that does not divide fails first

  TrainResult result;
  result.stage = cfg.stage;
  result.tokenizer_dir = cfg.model;
  result.init_dir = cfg.model;
  const std::string name = !cfg.run.empty() ? cfg.run
      : fs::path(cfg.model).lexically_normal().filename().string().empty()
      ? fs::path(cfg.model).lexically_normal().parent_path().filename().string()
      : fs::path(cfg.model).lexically_normal().filename().string();
  result.run_dir =
      !cfg.run_dir.empty() ? cfg.run_dir : "runs/" + cfg.stage + "/" + name;
  make_run_folder(result.run_dir);
  RunLog log(result.run_dir + "/train.log");
  if (!origins.count("max_seq_length") && T != kDefaultMaxSeqLength)
    log("Sequences: max_seq_length=" + std::to_string(T) +
        ", the model's max_position_embeddings (the default " +
        std::to_string(kDefaultMaxSeqLength) + " is longer than it reads).");
  FinetuneConfig written = cfg;
  if (dist::leader())
    config::write_yaml(
        result.run_dir + "/config.yaml", finetune_schema(), &written, origins);

  // Data: the model's tokenizer and chat template; cached by content (rank
  // 0 prepares it first when there are several processes).
  ChatData chats;
  dist::leader_first("preparing the data", [&] {
    chats = prepare_chat_data(
        {.files = cfg.data,
         .data_dir = cfg.data_dir,
         .max_seq_len = T,
         .tokenizer_dir = cfg.model,
         .chat_template = cfg.chat_template},
        [&](const std::string& s) { log(s); });
  });
  result.data_description = chats.description;
  result.chat_val = chats.val;
  auto train_file =
      std::make_shared<data::ChatFile>(data::ChatFile::open(chats.train));
  auto val_file =
      std::make_shared<data::ChatFile>(data::ChatFile::open(chats.val));

  // Batch: as given, or the largest of 1, 2, 4, 8, 16 the estimate fits.
  const FinetunePlan plan = plan_finetune(mc, cfg, dtype, device);
  if (cfg.device_batch_size) {
    std::optional<int64_t> largest;
    for (const auto& r : plan.rows)
      if (r.fits && finetune_rows_per_step(cfg) % r.batch == 0)
        largest = r.batch;
    refuse_beyond_memory(
        device,
        "device_batch_size",
        plan.choice.batch,
        plan.choice.memory.total(),
        memory_budget(device, cfg.memory_fraction),
        largest);
  }
  // Every rank takes the same micro-batch: the smallest any chose.
  const int64_t B = dist::min_over_ranks(plan.choice.batch);
  const int world = dist::size();
  const FinetuneMemory est = plan.choice.memory;
  const std::string batch_why = cfg.device_batch_size
      ? "as set"
      : "auto: the largest of 1-16 dividing the step's rows whose estimated "
        "peak fits " +
          format_mb(double(plan.budget)) + " (" + plan.budget_why + ")";
  if (!plan.choice.fits)
    log("Warning: the estimated peak " + format_mb(est.total()) +
        " is above the budget " + format_mb(double(plan.budget)) +
        " at device_batch_size=" + std::to_string(B) +
        "; lower max_seq_length, keep gradient_checkpointing=true" +
        (lora && dtype == torch::kFloat32 ? ", use dtype=bfloat16" : "") +
        ", or use a smaller model.");
  const int64_t rows_per_step = finetune_rows_per_step(cfg); // per process
  const int64_t accum = rows_per_step / B;
  const int64_t rows_per_epoch = cfg.pack
      ? std::max<int64_t>(1, int64_t(train_file->total_tokens()) / T)
      : int64_t(train_file->size());
  const int64_t total = cfg.num_iterations
      ? *cfg.num_iterations
      : std::max<int64_t>(
            1,
            int64_t(std::ceil(
                cfg.epochs.value_or(1.0) * double(rows_per_epoch) /
                double(B * accum * world))));

  // The model.
  torch::manual_seed(uint64_t(cfg.seed));
  log("Loading " + mc.architecture + " from " + cfg.model + " (" +
      (lora && cfg.load_in_4bit ? "4-bit NF4 projections, " : "") +
      dtype_name(lora ? dtype : torch::kFloat32) + " weights on " +
      device.name + ")...");
  TrainableModel loaded = load_for_training(cfg, dtype, dev);
  models::Llama model = loaded.model;
  result.parameters = loaded.parameters;
  result.trainable_parameters = loaded.trainable;
  const models::LoraSpec spec = lora_spec(cfg);
  Optimizers optimizers = finetune_optimizers(cfg, std::move(loaded.trained));

  const uint32_t pad_id = 0; // padding is never a target
  // Rank r fills the r-th B of every world * B rows.
  auto loader = std::make_shared<data::ChatBatcher>(
      *train_file,
      B,
      T,
      cfg.pack,
      pad_id,
      true,
      uint64_t(cfg.seed),
      dist::rank(),
      world);
  TrainingTask task;
  task.model = model.ptr();
  task.micro_step = [&, loader] {
    auto b = loader->next();
    auto y = torch::where(b.loss_mask > 0, b.y, torch::full_like(b.y, -1));
    return model->loss(b.x.to(dev), y.to(dev));
  };
  task.evaluate = [&, val_file, loader] {
    // The training micro-batch, which an out-of-memory error may have
    // lowered.
    const int64_t vb = loader->batch_size();
    data::ChatBatcher val(*val_file, vb, T, cfg.pack, pad_id, false, 0);
    double nats = 0, count = 0;
    int64_t seen = 0;
    do {
      auto b = val.next();
      if (val.state().epoch > 0)
        break;
      auto y = torch::where(b.loss_mask > 0, b.y, torch::full_like(b.y, -1));
      const double n = double(y.ne(-1).sum().item<int64_t>());
      if (n > 0)
        nats += model->loss(b.x.to(dev), y.to(dev)).item<double>() * n;
      count += n;
      seen += vb * T;
    } while (seen < cfg.eval_tokens);
    if (count == 0)
      throw UserError(
          "the held-out records of " + chats.val +
          " have no answer tokens to evaluate; check the data.");
    const double loss = nats / count;
    return EvalResult{
        loss, {}, "val loss on held-out answers " + fmt("%.4f", loss)};
  };
  task.data_state = [loader] { return nlohmann::json(loader->state()); };
  task.restore_data = [loader](const nlohmann::json& j) {
    loader->restore(j.get<data::LoaderState>());
  };
  // Out of memory: the Trainer halves the micro-batch and redoes the step.
  task.set_micro_batch = [loader](int64_t b) { loader->set_batch_size(b); };
  task.describe = {
      {"stage", cfg.stage},
      {"model_dir", fs::absolute(cfg.model).string()},
      {"architecture", mc.architecture}};
  if (lora)
    task.describe["lora"] = {
        {"r", spec.r},
        {"alpha", spec.alpha},
        {"dropout", spec.dropout},
        {"target_modules", spec.target_modules}};

  TrainerOptions to{
      .run_dir = result.run_dir,
      .device = dev,
      .precision = precision,
      .total_steps = total,
      .micro_batch = B,
      .grad_accum = accum,
      .tokens_per_step = B * accum * T * world,
      .grad_clip = cfg.grad_clip,
      .zero_stage = int(cfg.zero_stage),
      .grad_reduce_dtype =
          *parse_dtype(cfg.grad_reduce_dtype, "grad_reduce_dtype"),
      .bucket_cap_mb = cfg.bucket_cap_mb,
      .grad_average = dist::mover_named(cfg.grad_average),
      .warmup_steps = cfg.warmup_steps,
      .warmdown_ratio = cfg.warmdown_ratio,
      .eval_every = cfg.eval_every,
      .sample_every = 0,
      .save_every = cfg.save_every,
      .save_total_limit = cfg.save_total_limit,
      .resume = cfg.resume};
  Trainer trainer(to, task, optimizers, log);
  const int64_t start = trainer.resume();
  if (start < total) {
    log("Stage: " + cfg.stage + " fine-tuning of " + cfg.model + " (" +
        mc.architecture + ", " + std::to_string(mc.num_hidden_layers) +
        " layers, width " + std::to_string(mc.hidden_size) + ")");
    log("Data: " + chats.description + " (" +
        std::to_string(train_file->size()) + " train, " +
        std::to_string(val_file->size()) + " held-out records)");
    log("Parameters: " + std::to_string(result.trainable_parameters) +
        " trained of " + std::to_string(result.parameters) +
        (lora ? " (LoRA r=" + std::to_string(spec.r) + ", alpha " +
                 fmt("%g", spec.alpha) + ", on " +
                 std::to_string(spec.target_modules.size()) +
                 " projection kinds)"
              : std::string(" (full)")));
    log("Precision: " + precision.name + " (" + precision.why + ")");
    if (!auto_why.empty())
      log("Weights and optimizer: " + auto_why);
    log("Memory estimate: " + format_mb(est.total()) + " (weights " +
        format_mb(est.weights) + ", trained weights + gradients + AdamW " +
        format_mb(est.trainable + est.gradients + est.optimizer) +
        ", activations " + format_mb(est.activations) + ", loss " +
        format_mb(est.logits) + "); budget " + format_mb(double(plan.budget)));
    log("Batch: " + std::to_string(rows_per_step * world) + " rows of " +
        std::to_string(T) + " tokens per step (" +
        std::to_string(rows_per_step * world * T) +
        " tokens, the same on every machine) = " + std::to_string(B) +
        " per micro-step (" + batch_why + ")" +
        (cfg.gradient_checkpointing ? ", gradient checkpointing" : "") + " x " +
        std::to_string(accum) + " accumulation step(s)" +
        (world > 1 ? " x " + std::to_string(world) + " processes" : "") + "; " +
        std::to_string(total) + " steps; run folder " + result.run_dir);
  }
  TrainerResult tr = trainer.run();
  copy_trainer_result(tr, result);
  result.total = total;
  if (tr.interrupted || !dist::leader()) // rank 0 writes the result
    return result;
  // The result in the formats other tools read, from the final weights.
  if (lora) {
    result.output_dir = result.run_dir + "/adapter";
    models::save_adapter(
        model, spec, result.output_dir, fs::absolute(cfg.model).string());
  } else {
    result.output_dir = result.run_dir + "/model";
    models::write_merged_model(model, cfg.model, result.output_dir);
  }
  // The report names the folder other tools read.
  result.checkpoint_dir = result.output_dir;
  if (!tr.already_done)
    log("Done: step " + std::to_string(total) +
        ", validation loss on held-out answers " +
        fmt("%.4f", result.val_loss) + ". " +
        (lora ? "Adapter (PEFT format): " : "Model folder: ") +
        result.output_dir);
  return result;
}

} // namespace orchard::train
