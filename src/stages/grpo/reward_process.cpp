#include "stages/grpo/reward_process.h"

#include "core/clock.h"
#include "core/error.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace orchard::grpo {
namespace {

std::string shorten(const std::string& s) {
  return s.size() <= 200 ? s : s.substr(0, 200) + "...";
}

} // namespace

RewardProcess::RewardProcess(std::string command, double timeout_s)
    : command_(std::move(command)), timeout_s_(timeout_s) {
  // A child that dies while we write must give EPIPE, not kill Orchard.
  std::signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0)
    throw UserError(
        "reward_cmd: cannot make pipes (" + std::string(std::strerror(errno)) +
        ").");
  pid_ = fork();
  if (pid_ < 0)
    throw UserError(
        "reward_cmd: cannot start a process (" +
        std::string(std::strerror(errno)) + ").");
  if (pid_ == 0) {
    // Its own process group, so that stopping it stops what it started
    // too (a shell script's children would outlive it otherwise).
    setpgid(0, 0);
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid_, pid_); // as the child does: whichever runs first
  close(in[0]);
  close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
  fcntl(to_child_, F_SETFL, fcntl(to_child_, F_GETFL) | O_NONBLOCK);
  fcntl(to_child_, F_SETFD, FD_CLOEXEC);
  fcntl(from_child_, F_SETFD, FD_CLOEXEC);
}

RewardProcess::~RewardProcess() {
  if (to_child_ >= 0)
    close(to_child_);
  if (from_child_ >= 0)
    close(from_child_);
  if (pid_ <= 0)
    return;
  // Its stdin closed, the command has a second to end; then it is killed.
  // Either way, what it started and left running goes too (its group).
  bool ended = false;
  for (int i = 0; i < 20 && !ended; ++i) {
    ended = waitpid(pid_, nullptr, WNOHANG) == pid_;
    if (!ended)
      usleep(50'000);
  }
  kill(-pid_, SIGKILL);
  if (!ended)
    waitpid(pid_, nullptr, 0);
}

void RewardProcess::fail(const std::string& what) {
  std::string status;
  if (pid_ > 0) {
    // A child that closed its output is usually exiting: give it a moment
    // so its status can be reported.
    int st = 0;
    pid_t done = 0;
    for (int i = 0; i < 50 && done == 0; ++i) {
      done = waitpid(pid_, &st, WNOHANG);
      if (done == 0)
        usleep(20'000);
    }
    if (done == pid_) {
      pid_ = -1;
      status = WIFEXITED(st)
          ? " It exited with status " + std::to_string(WEXITSTATUS(st)) + "."
          : WIFSIGNALED(st)
          ? " It was killed by signal " + std::to_string(WTERMSIG(st)) + "."
          : "";
    }
  }
  throw UserError(
      "reward_cmd \"" + command_ + "\": " + what + status +
      " Its own messages (stderr) are above. It must read one JSON object "
      "per line on stdin and write one line back for each: a JSON object of "
      "named numbers, such as {\"correct\": 1.0}. Checkpoints already "
      "written are intact; fix it and run the same command to resume.");
}

std::vector<std::vector<double>> RewardProcess::score(
    const std::vector<nlohmann::json>& requests) {
  std::string out;
  for (const auto& r : requests)
    out += r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
  std::vector<std::vector<double>> scores;
  size_t written = 0;
  double last_progress = now_s();
  while (scores.size() < requests.size()) {
    pollfd fds[2] = {
        {from_child_, POLLIN, 0},
        {written < out.size() ? to_child_ : -1, POLLOUT, 0}};
    const double left = timeout_s_ - (now_s() - last_progress);
    if (left <= 0)
      fail(
          "no answer within reward_timeout=" + std::to_string(timeout_s_) +
          " s (answered " + std::to_string(scores.size()) + " of " +
          std::to_string(requests.size()) +
          " completions). Raise reward_timeout if it is just slow.");
    const int n = poll(fds, 2, int(std::min(left, 1.0) * 1000) + 1);
    if (n < 0 && errno != EINTR)
      fail("poll failed (" + std::string(std::strerror(errno)) + ").");
    if (n <= 0)
      continue;
    if (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
      const ssize_t w =
          write(to_child_, out.data() + written, out.size() - written);
      if (w < 0 && errno != EAGAIN && errno != EINTR)
        fail("stopped reading its input (it has exited or closed stdin).");
      if (w > 0) {
        written += size_t(w);
        last_progress = now_s();
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t r = read(from_child_, buf, sizeof buf);
      if (r == 0)
        fail(
            "exited after answering " + std::to_string(scores.size()) + " of " +
            std::to_string(requests.size()) + " completions.");
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN)
          continue;
        fail("cannot be read (" + std::string(std::strerror(errno)) + ").");
      }
      last_progress = now_s();
      pending_.append(buf, size_t(r));
      size_t nl;
      while ((nl = pending_.find('\n')) != std::string::npos) {
        std::string line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r')
          line.pop_back();
        if (scores.size() >= requests.size())
          fail(
              "wrote more lines than it was sent completions (\"" +
              shorten(line) + "\").");
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || j.empty())
          fail(
              "answered completion " + std::to_string(scores.size() + 1) +
              " with \"" + shorten(line) +
              "\", not a JSON object of named scores.");
        if (names_.empty())
          for (auto it = j.begin(); it != j.end(); ++it)
            names_.push_back(it.key());
        std::vector<double> row;
        for (const auto& name : names_) {
          if (!j.contains(name) || !j[name].is_number())
            fail(
                "answered completion " + std::to_string(scores.size() + 1) +
                " with \"" + shorten(line) + "\": the score \"" + name +
                "\" is missing or not a number (every answer must have the "
                "same named numbers).");
          row.push_back(j[name].get<double>());
        }
        if (j.size() != names_.size())
          fail(
              "answered completion " + std::to_string(scores.size() + 1) +
              " with \"" + shorten(line) +
              "\": other score names than its first answer's.");
        scores.push_back(std::move(row));
      }
    }
  }
  return scores;
}

} // namespace orchard::grpo
