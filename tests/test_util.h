// Helpers shared by the tests: a temporary folder and a way to run the
// orchard binary and collect what it printed.
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/files.h"
#include "test_paths.h"

namespace orchard::test {

// The tiny Llama of tests/fixtures/hf (transformers' random weights).
inline const std::string kLlama = std::string(ORCHARD_FIXTURES) + "/hf/llama";

// A device description for planning and policy tests: `kind` cuda, mps or
// cpu, with a compute capability for CUDA (0: unknown).
inline DeviceInfo device_of(const std::string& kind, int cc = 0) {
  DeviceInfo d;
  d.kind = kind;
  d.device = kind == "cuda" ? c10::Device(c10::kCUDA, 0)
      : kind == "mps"       ? c10::Device(c10::kMPS)
                            : c10::Device(c10::kCPU);
  d.compute_capability = cc;
  return d;
}

class TempDir {
 public:
  // Under $TMPDIR (or /tmp); where that is not writable, under the current
  // folder (ctest runs in the build folder).
  TempDir() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    for (const auto& dir : {base, std::filesystem::current_path()}) {
      std::string tmpl = (dir / "orchard-test-XXXXXX").string();
      if (::mkdtemp(tmpl.data())) {
        path_ = tmpl;
        return;
      }
    }
    throw std::runtime_error(
        "cannot create a temporary folder under " + base.string() +
        " or the current folder");
  }
  ~TempDir() {
    remove_tree(path_.string());
  }
  const std::filesystem::path& path() const {
    return path_;
  }
  std::string file(const std::string& name) const {
    return (path_ / name).string();
  }
  // Writes `content` to `name` (creating folders) and returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    auto p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

// One code point as UTF-8.
inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xc0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += char(0xe0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3f));
    s += char(0x80 | (cp & 0x3f));
  } else {
    s += char(0xf0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3f));
    s += char(0x80 | ((cp >> 6) & 0x3f));
    s += char(0x80 | (cp & 0x3f));
  }
  return s;
}

// Whether `part` occurs in `text` (messages the tests look for).
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// An environment holding exactly `vars`, for code that takes an EnvLookup.
inline std::function<std::optional<std::string>(const std::string&)> env_of(
    std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end())
      return std::nullopt;
    return it->second;
  };
}

// `count` short numbered documents as text JSONL (one {"text": ...} a
// line): a corpus the tiny training runs of the e2e tests pretrain on.
inline std::string numbered_documents(int count) {
  std::string jsonl;
  for (int i = 0; i < count; ++i)
    jsonl += "{\"text\": \"Document " + std::to_string(i) +
        ": the quick brown fox jumps over the lazy dog while numbers " +
        std::to_string(i * 7919 % 1000) + " go by.\"}\n";
  return jsonl;
}

// 40 sums as GRPO prompts with their answers (JSONL, one {"prompt",
// "answer"} a line): env=answers' data for the e2e GRPO runs.
inline std::string sums_jsonl() {
  std::string jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += "{\"prompt\": \"What is " + std::to_string(i % 7) + "+" +
        std::to_string(i % 5) + "?\", \"answer\": \"" +
        std::to_string(i % 7 + i % 5) + "\"}\n";
  return jsonl;
}

// What `f` refused with: its UserError's message and exit code, or an
// empty message and -1 where it returned.
struct Refusal {
  std::string what;
  int exit_code = -1;
};
inline Refusal refusal_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return {e.what(), e.exit_code()};
  }
  return {};
}

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `orchard args...` with extra environment variables (and
// MEMORY_SIZE/WORLD_SIZE/DEPTH... unset unless given), in `cwd` when
// given, reading `stdin_text` as its input (else /dev/null).
inline CliResult run_orchard(
    const std::vector<std::string>& args,
    const std::map<std::string, std::string>& env = {},
    const std::string& cwd = "",
    const std::optional<std::string>& stdin_text = std::nullopt) {
  TempDir tmp;
  std::string cmd = cwd.empty() ? "" : "cd " + shell_quote(cwd) + " && ";
  cmd +=
      "env -u MEMORY_SIZE -u WORLD_SIZE -u DEPTH "
      "-u DEVICE_BATCH_SIZE -u TOTAL_BATCH_SIZE -u EVAL_TOKENS "
      "-u SPLIT_TOKENS -u MID_ITERATIONS -u SFT_ITERATIONS "
      "-u BASE_ITERATIONS -u ORCHARD_HOME";
  for (const auto& [k, v] : env)
    cmd += " " + k + "=" + shell_quote(v);
  cmd += " " + shell_quote(ORCHARD_BIN);
  for (const auto& a : args)
    cmd += " " + shell_quote(a);
  std::string err_path = tmp.file("stderr");
  std::string in_path = "/dev/null";
  if (stdin_text) {
    in_path = tmp.file("stdin");
    std::ofstream(in_path, std::ios::binary) << *stdin_text;
  }
  cmd += " 2>" + shell_quote(err_path) + " <" + shell_quote(in_path);
  CliResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0)
    r.out.append(buf, n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.err = read_text(err_path);
  return r;
}

// Starts `orchard args...` in the background (stdout and stderr to
// `log_path`) and returns its pid.
inline pid_t spawn_orchard(
    const std::vector<std::string>& args,
    const std::map<std::string, std::string>& env,
    const std::string& log_path,
    const std::string& cwd = "") {
  std::string cmd = cwd.empty() ? "" : "cd " + shell_quote(cwd) + " && ";
  for (const auto& [k, v] : env)
    cmd += k + "=" + shell_quote(v) + " ";
  cmd += "exec " + shell_quote(ORCHARD_BIN);
  for (const auto& a : args)
    cmd += " " + shell_quote(a);
  cmd += " >" + shell_quote(log_path) + " 2>&1 </dev/null";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits for a child; returns its exit code, or 128 + signal.
inline int wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

} // namespace orchard::test
