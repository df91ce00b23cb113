#include "runs/run_folder.h"

#include "core/error.h"
#include "runs/checkpoint.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace orchard::runs {
namespace fs = std::filesystem;

const std::vector<std::string>& pipeline_stages() {
  static const std::vector<std::string> names = {"base", "mid", "sft", "rl"};
  return names;
}

std::string previous_stage(const std::string& stage) {
  if (stage == "mid")
    return "base";
  if (stage == "sft")
    return "mid";
  if (stage == "rl")
    return "sft";
  return "";
}

std::string stage_run_dir(const std::string& stage, const std::string& name) {
  return "runs/" + stage + "/" + name;
}

std::string find_stage_run(const std::string& stage, const std::string& name) {
  bool known = false;
  for (const auto& s : pipeline_stages())
    known = known || s == stage;
  if (!known)
    throw UserError(
        "-i " + stage +
        ": the stages are base, mid, sft and rl (or give "
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

std::string folder_name(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  return p.filename().empty() ? p.parent_path().filename().string()
                              : p.filename().string();
}

std::string trained_from(const std::string& run_dir) {
  auto ckpts = list_checkpoints(run_dir);
  if (ckpts.empty())
    return "";
  std::ifstream in(ckpts.back().second + "/state.json");
  auto state = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object() || !state.contains("init") ||
      !state["init"].is_string())
    return "";
  return state["init"].get<std::string>();
}

bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  auto ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  if (ea || eb)
    return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  return ca == cb;
}

std::string set_aside_if_stale(
    const std::string& run_dir,
    const std::string& init,
    const std::string& stage) {
  const std::string was = trained_from(run_dir);
  if (was.empty() || same_folder(was, init))
    return "";
  const std::string kept = set_aside(run_dir);
  return run_dir + " was trained from " + was +
      ", but its starting model is now " + init + ": training " + stage +
      " again from it (the old run is kept in " + kept + ").";
}

std::string set_aside(const std::string& run_dir) {
  std::string base = fs::path(run_dir).lexically_normal().string();
  while (!base.empty() && base.back() == '/')
    base.pop_back();
  for (int n = 1;; ++n) {
    std::string to = base + ".old-" + std::to_string(n);
    if (!fs::exists(to)) {
      std::error_code ec;
      fs::rename(base, to, ec);
      if (ec)
        throw UserError(
            "cannot move the stale run " + base + " aside to " + to + " (" +
                ec.message() + "); move or delete it by hand.",
            kExitFailure);
      return to;
    }
  }
}

} // namespace orchard::runs
