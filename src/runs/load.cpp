#include "runs/load.h"

#include "core/dtype.h"
#include "core/error.h"
#include "models/hf/model.h"
#include "models/lora.h"
#include "runs/checkpoint.h"
#include "runs/run_folder.h"
#include "text/tokenizer_io.h"

#include <cstdio>
#include <filesystem>
#include <optional>

namespace orchard::runs {
namespace fs = std::filesystem;

std::string model_path(const ModelSource& s) {
  if (!s.model_dir.empty())
    return s.model_dir;
  if (!s.adapter.empty())
    throw UserError(
        "--adapter needs --model DIR, the base model the adapter was trained "
        "on.");
  if (!s.stage.empty() && !s.checkpoint.empty())
    throw UserError("give either -i STAGE or --checkpoint DIR, not both.");
  if (!s.checkpoint.empty())
    return s.checkpoint;
  if (s.stage.empty())
    throw UserError(
        "which model? Give -i base|mid|sft|rl (a stage's newest run) or "
        "--checkpoint DIR (a run or checkpoint folder).");
  return find_stage_run(s.stage, s.run);
}

namespace {

// The name of the model at `path` (model_path's answer for `s`).
std::string name_of(const ModelSource& s, const std::string& path) {
  if (!s.model_dir.empty()) {
    const std::string n = folder_name(s.model_dir);
    return s.adapter.empty() ? n : n + "+adapter";
  }
  fs::path run(path);
  if (fs::exists(run / "state.json"))
    run = run.parent_path().parent_path();
  run = run.lexically_normal();
  if (run.filename().empty())
    run = run.parent_path();
  return run.parent_path().filename().string() + "/" + run.filename().string();
}

} // namespace

std::string adapter_folder(const std::string& path) {
  if (fs::exists(fs::path(path) / "adapter_config.json"))
    return path;
  if (fs::exists(fs::path(path) / "adapter" / "adapter_config.json"))
    return (fs::path(path) / "adapter").string();
  throw UserError(
      "--adapter " + path +
      " holds no adapter_config.json (nor adapter/adapter_config.json, as an "
      "orchard train stage=lora run folder does once it finishes).");
}

LoadedModel loaded_from(
    std::shared_ptr<models::LanguageModel> model,
    const std::string& tokenizer_dir,
    const std::string& chat_template) {
  LoadedModel out;
  out.model = std::move(model);
  out.tokenizer = std::make_shared<const text::Tokenizer>(
      text::load_tokenizer(tokenizer_dir));
  out.tokenizer_dir = tokenizer_dir;
  out.chat_template = chat_template;
  return out;
}

text::ChatTemplate chat_template(const LoadedModel& loaded) {
  return text::open_chat_template(
      loaded.tokenizer_dir, *loaded.tokenizer, loaded.chat_template);
}

std::optional<c10::ScalarType> asked_dtype(
    const ModelSource& source,
    const DeviceInfo& device) {
  const std::optional<c10::ScalarType> asked = parse_dtype(
      source.dtype.empty() ? std::string("auto") : source.dtype, "--dtype");
  if (asked && source.model_dir.empty())
    throw UserError(
        "--dtype " + source.dtype +
        ": only a Hugging Face folder (--model DIR) is loaded in another "
        "dtype; Orchard's own checkpoints decode as they were trained.");
  if (asked == c10::ScalarType::Half && device.kind == "cpu")
    throw UserError(
        "--dtype float16 on the CPU: libtorch has no fast float16 matrix "
        "products there (Debian's 1.13 has none at all); use --dtype "
        "bfloat16 (about twice float32's speed) or float32.");
  return asked;
}

LoadedModel load_model(const ModelSource& source, const DeviceInfo& device) {
  const std::optional<c10::ScalarType> asked = asked_dtype(source, device);
  const std::string path = model_path(source);
  if (source.model_dir.empty()) {
    TrainedGpt t = load_gpt(path);
    t.model->to(device.device);
    t.model->eval();
    t.model->prepare_inference();
    LoadedModel out =
        loaded_from(t.model.ptr(), t.tokenizer_dir, source.chat_template);
    out.checkpoint_dir = t.checkpoint_dir;
    out.step = t.step;
    out.description =
        t.checkpoint_dir + " (step " + std::to_string(t.step) + ")";
    out.name = name_of(source, path);
    return out;
  }
  if (!source.stage.empty() || !source.checkpoint.empty())
    throw UserError("give either --model DIR or -i/--checkpoint, not both.");
  models::LoadOptions opt;
  opt.device = device.device;
  opt.dtype = asked.value_or(auto_dtype(device));
  models::Llama model = models::load_hf_model(source.model_dir, opt);
  std::string adapter;
  if (!source.adapter.empty()) {
    adapter = adapter_folder(source.adapter);
    models::load_adapter(model, adapter, torch::kFloat32);
  }
  model->eval();
  // For generation only: the adapter folded into the weights (no cost per
  // token), q/k/v and gate/up stacked.
  model->prepare_inference();
  LoadedModel out =
      loaded_from(model.ptr(), source.model_dir, source.chat_template);
  out.checkpoint_dir = source.model_dir;
  out.description = source.model_dir + " (" + model->config.architecture +
      ", " + std::to_string(model->config.num_hidden_layers) + " layers, " +
      dtype_name(*opt.dtype) + ")" +
      (adapter.empty() ? "" : " + adapter " + adapter);
  out.name = name_of(source, path);
  return out;
}

Checkpoint checkpoint_at(
    const std::string& path,
    const std::string& train_hint) {
  if (!fs::exists(path))
    throw UserError(
        "checkpoint '" + path + "' does not exist; give a run folder (" +
        train_hint + ") or one of its checkpoint folders.");
  if (fs::exists(fs::path(path) / "state.json"))
    return load_checkpoint(path);
  std::vector<std::string> skipped;
  std::optional<Checkpoint> ckpt = latest_checkpoint(path, &skipped);
  for (const auto& s : skipped)
    std::fprintf(stderr, "Warning: %s\n", s.c_str());
  if (!ckpt)
    throw UserError(
        "'" + path + "' holds no checkpoint; train first (`orchard train`).");
  return *ckpt;
}

TrainedGpt load_gpt(const std::string& path, bool prefer_ema) {
  std::optional<Checkpoint> ckpt = checkpoint_at(path, "such as runs/base/d4");
  if (!ckpt->state.contains("model"))
    throw UserError(
        ckpt->dir + "/state.json does not describe a GPT (no \"model\").");
  const auto& m = ckpt->state.at("model");
  TrainedGpt out;
  models::GptConfig& c = out.config;
  c.vocab_size = m.at("vocab_size");
  c.n_layer = m.at("n_layer");
  c.n_embd = m.at("n_embd");
  c.n_head = m.at("n_head");
  c.n_kv_head = m.at("n_kv_head");
  c.max_seq_len = m.at("max_seq_len");
  out.model = models::Gpt(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& named : out.model->named_parameters()) {
      auto it = prefer_ema ? ckpt->model.find("ema." + named.key())
                           : ckpt->model.end();
      if (it == ckpt->model.end())
        it = ckpt->model.find(named.key());
      if (it == ckpt->model.end() ||
          it->second.sizes() != named.value().sizes())
        throw UserError(
            "checkpoint " + ckpt->dir + " lacks '" + named.key() +
            "' or has it in another shape.");
      named.value().copy_(it->second);
    }
  }
  out.tokenizer_dir = ckpt->state.value("tokenizer", "");
  out.checkpoint_dir = ckpt->dir;
  out.step = ckpt->step;
  out.state = ckpt->state;
  return out;
}

} // namespace orchard::runs
