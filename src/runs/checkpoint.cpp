#include "runs/checkpoint.h"

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace orchard::runs {
namespace {
namespace fs = std::filesystem;

constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kCheckpointFiles[] = {
    "model.safetensors",
    "optimizer.safetensors"};

// UserError naming the file when it is not what state.json says was
// written (checkpoints from before checksums were kept are not checked).
void verify_files(const fs::path& dir, const nlohmann::json& state) {
  if (!state.contains("files") || !state["files"].is_object())
    return;
  for (const auto& [name, want] : state["files"].items()) {
    if (std::find(
            std::begin(kCheckpointFiles), std::end(kCheckpointFiles), name) ==
        std::end(kCheckpointFiles))
      continue; // only the checkpoint's own files, never a path elsewhere
    const fs::path file = dir / name;
    if (!fs::exists(file))
      throw UserError(
          "checkpoint '" + dir.string() + "': " + name + " is missing.");
    FileChecksum got = checksum_file(file.string());
    const uint64_t bytes =
        want.is_object() ? want.value("bytes", uint64_t(0)) : 0;
    const std::string crc =
        want.is_object() ? want.value("crc32c", std::string()) : "";
    const std::string where = "checkpoint '" + dir.string() + "': " + name;
    if (got.bytes != bytes)
      throw UserError(
          where + " is damaged: " +
          (got.bytes < bytes ? "truncated, " : "longer than saved, ") +
          std::to_string(got.bytes) + " bytes of the " + std::to_string(bytes) +
          " saved.");
    if (crc_hex(got.crc32c) != crc)
      throw UserError(
          where +
          " is damaged: its bytes changed since it was saved (CRC-32C " +
          crc_hex(got.crc32c) + ", saved " + crc + ").");
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::optional<int64_t> step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5)
    return std::nullopt;
  char* end = nullptr;
  long long v = std::strtoll(name.c_str() + 5, &end, 10);
  if (*end != '\0' || v < 0)
    return std::nullopt;
  return v;
}

} // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint(
    const std::string& run_dir,
    int64_t step,
    const NamedTensors& model,
    const NamedTensors& optimizer,
    nlohmann::json state) {
  fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  fs::path final_dir = root / checkpoint_name(step);
  fs::path tmp = root /
      (kTmpPrefix + checkpoint_name(step) + "-" + std::to_string(::getpid()));
  remove_tree(tmp.string());
  fs::create_directories(tmp);
  state["step"] = step;
  try {
    safetensors::save(
        (tmp / "model.safetensors").string(), model, {{"format", "pt"}});
    safetensors::save(
        (tmp / "optimizer.safetensors").string(),
        optimizer,
        {{"format", "pt"}});
    // Each file's size and checksum, verified whenever it is loaded: bytes
    // changed in place (same size) are found, not trained on.
    nlohmann::json files = nlohmann::json::object();
    for (const char* name : kCheckpointFiles) {
      files[name] = checksum_record((tmp / name).string());
    }
    state["files"] = files;
    atomic_write((tmp / "state.json").string(), state.dump(2) + "\n");
  } catch (const UserError& e) {
    // Nothing half-written stays behind; the checkpoints before are
    // untouched.
    remove_tree(tmp.string());
    auto ckpts = list_checkpoints(run_dir);
    throw UserError(
        std::string("could not save the checkpoint of step ") +
            std::to_string(step) + ": " + e.what() + "\n  " +
            (ckpts.empty() ? std::string("No earlier checkpoint exists.")
                           : "The checkpoint of step " +
                     std::to_string(ckpts.back().first) +
                     " is intact; free some space and run the same command "
                     "to resume from it."),
        kExitFailure);
  }
  fsync_dir(tmp);
  // Replacing an existing checkpoint of the same step (a resumed run saving
  // again): move the old one aside first so a crash never leaves neither.
  fs::path old =
      root / (std::string(kTmpPrefix) + "old-" + checkpoint_name(step));
  // POSIX rename, not std::filesystem's: see remove_tree in core/files.h.
  auto move = [](const fs::path& from, const fs::path& to) {
    if (::rename(from.c_str(), to.c_str()) != 0)
      throw UserError(
          "cannot move '" + from.string() + "' to '" + to.string() +
          "': " + std::strerror(errno));
  };
  if (fs::exists(final_dir)) {
    remove_tree(old.string());
    move(final_dir, old);
  }
  move(tmp, final_dir);
  fsync_dir(root);
  remove_tree(old.string());
  return final_dir.string();
}

Checkpoint load_checkpoint(const std::string& dir) {
  Checkpoint c;
  c.dir = dir;
  fs::path p(dir);
  auto state_path = p / "state.json";
  if (!fs::exists(state_path))
    throw UserError(
        "checkpoint '" + dir + "' has no state.json: it was not completed.");
  {
    std::ifstream in(state_path);
    c.state = nlohmann::json::parse(in, nullptr, false);
  }
  if (c.state.is_discarded() || !c.state.is_object() ||
      !c.state.contains("step"))
    throw UserError("checkpoint '" + dir + "': state.json is damaged.");
  if (!c.state["step"].is_number_integer())
    throw UserError("checkpoint '" + dir + "': state.json is damaged.");
  c.step = c.state["step"].get<int64_t>();
  verify_files(p, c.state);
  // A file that does not parse is a damaged checkpoint, whatever the
  // reader's advice for downloaded files says.
  auto load = [&](const char* name) {
    try {
      return safetensors::load((p / name).string());
    } catch (const UserError& e) {
      std::string what = e.what();
      what = what.substr(0, what.find('\n')); // not the download advice
      throw UserError(
          "checkpoint '" + dir + "': " + name + " is damaged (" + what + ").");
    }
  };
  c.model = load("model.safetensors");
  c.optimizer = load("optimizer.safetensors");
  return c;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(
    const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root))
    return out;
  for (const auto& e : fs::directory_iterator(root)) {
    auto step = step_of(e.path().filename().string());
    if (step && e.is_directory() && fs::exists(e.path() / "state.json"))
      out.push_back({*step, e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<Checkpoint> latest_checkpoint(
    const std::string& run_dir,
    std::vector<std::string>* skipped,
    bool move_damaged_aside) {
  auto all = list_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return load_checkpoint(it->second);
    } catch (const UserError& e) {
      std::string note;
      if (move_damaged_aside) {
        const fs::path from(it->second);
        fs::path to;
        for (int n = 0; to.empty() || fs::exists(to); ++n)
          to = from.parent_path() /
              ("damaged-" + from.filename().string() +
               (n ? "-" + std::to_string(n) : ""));
        if (::rename(from.c_str(), to.c_str()) == 0)
          note = " It was moved to " + to.string() + ".";
      }
      if (skipped)
        skipped->push_back(
            std::string("skipping damaged checkpoint ") + it->second + ": " +
            e.what() + note + " An older checkpoint is used.");
    }
  }
  return std::nullopt;
}

std::vector<std::string> prune_checkpoints(
    const std::string& run_dir,
    int64_t keep,
    std::optional<int64_t> also_keep) {
  std::vector<std::string> removed;
  fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root))
    return removed;
  // Leftovers of saves that were interrupted.
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind(kTmpPrefix, 0) == 0 &&
        e.path().filename().string().find(std::to_string(::getpid())) ==
            std::string::npos) {
      remove_tree(e.path().string());
      removed.push_back(e.path().string());
    }
  if (keep <= 0)
    return removed;
  auto all = list_checkpoints(run_dir);
  std::set<int64_t> kept;
  for (size_t i = all.size() > size_t(keep) ? all.size() - keep : 0;
       i < all.size();
       ++i)
    kept.insert(all[i].first);
  if (also_keep)
    kept.insert(*also_keep);
  // The newest checkpoint that loads is never deleted, whatever `keep` says.
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      safetensors::File::open(it->second + "/model.safetensors");
      safetensors::File::open(it->second + "/optimizer.safetensors");
      kept.insert(it->first);
      break;
    } catch (const UserError&) {
    }
  }
  for (const auto& [step, dir] : all)
    if (!kept.count(step)) {
      remove_tree(dir);
      removed.push_back(dir);
    }
  return removed;
}

} // namespace orchard::runs
