#include "train/trained_model.h"

#include "core/error.h"
#include "train/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <optional>

namespace orchard::train {
namespace fs = std::filesystem;

const std::vector<std::string>& stage_names() {
  static const std::vector<std::string> names = {"base", "mid", "sft"};
  return names;
}

std::string previous_stage(const std::string& stage) {
  if (stage == "mid")
    return "base";
  if (stage == "sft")
    return "mid";
  return "";
}

std::string stage_run_dir(const std::string& stage, const std::string& name) {
  return "runs/" + stage + "/" + name;
}

std::string find_stage_run(const std::string& stage, const std::string& name) {
  bool known = false;
  for (const auto& s : stage_names())
    known = known || s == stage;
  if (!known)
    throw UserError(
        "-i " + stage +
        ": the stages are base, mid and sft (or give "
        "--checkpoint with a run or checkpoint folder).");
  if (!name.empty()) {
    std::string dir = stage_run_dir(stage, name);
    if (list_checkpoints(dir).empty())
      throw UserError(
          dir +
          " holds no checkpoint; train it first (`orchard train "
          "stage=" +
          stage + " run=" + name + "` or `orchard pipeline`).");
    return dir;
  }
  std::string best;
  fs::file_time_type newest{};
  std::string runs;
  std::error_code ec;
  if (fs::is_directory("runs/" + stage, ec))
    for (const auto& e : fs::directory_iterator("runs/" + stage)) {
      auto ckpts = list_checkpoints(e.path().string());
      if (ckpts.empty())
        continue;
      runs += (runs.empty() ? "" : ", ") + e.path().string();
      auto t = fs::last_write_time(ckpts.back().second, ec);
      if (best.empty() || t > newest) {
        best = e.path().string();
        newest = t;
      }
    }
  if (best.empty())
    throw UserError(
        "no " + stage + " model under runs/" + stage +
        "/ in this folder; train one (`orchard pipeline`, or `orchard train "
        "stage=" +
        stage + "`) or give --checkpoint with a run folder.");
  return best;
}

TrainedModel load_trained(const std::string& path, bool prefer_ema) {
  if (!fs::exists(path))
    throw UserError(
        "checkpoint '" + path +
        "' does not exist; give a run folder (runs/base/d4) or a "
        "checkpoint folder (runs/base/d4/checkpoints/step_000500).");
  std::optional<Checkpoint> ckpt;
  if (fs::exists(fs::path(path) / "state.json")) {
    ckpt = load_checkpoint(path);
  } else {
    std::vector<std::string> skipped;
    ckpt = latest_checkpoint(path, &skipped);
    for (const auto& s : skipped)
      std::fprintf(stderr, "Warning: %s\n", s.c_str());
    if (!ckpt)
      throw UserError(
          "'" + path + "' holds no checkpoint; train first (`orchard train`).");
  }
  if (!ckpt->state.contains("model"))
    throw UserError(
        ckpt->dir + "/state.json does not describe a GPT (no \"model\").");
  const auto& m = ckpt->state.at("model");
  TrainedModel out;
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

} // namespace orchard::train
