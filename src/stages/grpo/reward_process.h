// reward_cmd: a long-lived child process that scores completions, so
// people keep their Python reward functions.
//
// Protocol: Orchard writes one JSON object per completion on the child's
// stdin, a line each: every column of the prompt's record, then "prompt"
// (the prompt text), "completion" (the completion text) and
// "completion_ids" (its token ids). The child writes one line back per
// object, in order: a JSON object of named numeric scores, the same names
// every time ({"correct": 1.0, "short": 0.2}). Its stderr is the
// terminal's. A child that exits, takes longer than `timeout_s` for a line,
// or writes anything else stops the run with a UserError saying which.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <sys/types.h>
#include <vector>

namespace orchard::grpo {

class RewardProcess {
 public:
  // Starts `/bin/sh -c command`; UserError when it cannot start.
  RewardProcess(std::string command, double timeout_s);
  // Closes its stdin and kills it if it lingers, and whatever it started
  // and left running (its process group).
  ~RewardProcess();
  RewardProcess(const RewardProcess&) = delete;
  RewardProcess& operator=(const RewardProcess&) = delete;

  // Scores of each request, in names() order. The first answer fixes the
  // names.
  std::vector<std::vector<double>> score(
      const std::vector<nlohmann::json>& requests);
  const std::vector<std::string>& names() const {
    return names_;
  }

 private:
  [[noreturn]] void fail(const std::string& what);
  std::string command_;
  double timeout_s_;
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string pending_; // read but not yet a whole line
  std::vector<std::string> names_;
};

} // namespace orchard::grpo
