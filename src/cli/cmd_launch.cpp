// `orchard launch --nproc-per-node N|gpu|auto [--nnodes M --node-rank R
// --master-addr A --master-port P] -- train ...` (torchrun's spellings,
// `--nproc_per_node` and the rest, work too): starts N copies of
// orchard on this node with torchrun's variables (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT),
// forwards SIGINT/SIGTERM/SIGHUP to them, prefixes each rank's stderr with
// its rank, and when one fails stops the others (SIGTERM, then SIGKILL after
// a grace period) and exits with the failed rank's code. Node 0's launcher
// serves the rendezvous store, as torchrun's agent does, and the launchers
// watch each other through it (dist/node_watch.h): a rank failing on one
// node stops every node's ranks. With --max-restarts N (torchrun's), every
// node then starts its ranks again, up to N times, and they resume from
// the run's newest checkpoint.
#include "cli/common.h"
#include "core/error.h"
#include "core/version.h"
#include "dist/launch_env.h"
#include "dist/node_watch.h"
#include "train/trainer.h"

#include <torch/cuda.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

extern char** environ;

namespace orchard::cli {
namespace {

// Seconds the other ranks get to stop after SIGTERM before SIGKILL.
constexpr int kGraceSeconds = 20;
// Seconds node 0's launcher waits for the other nodes to finish once its
// own ranks have (they end within moments of each other in a healthy run).
constexpr int kWaitForNodesSeconds = 300;
// Signals passed on to every rank (SIGHUP: the terminal or ssh session
// closed); each rank finishes its step, rank 0 saves, and they exit.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

volatile std::sig_atomic_t g_forward = 0; // a signal to pass on

extern "C" void on_launch_signal(int sig) {
  g_forward = sig;
}

struct Settings {
  std::string nproc_per_node = "1"; // as given: a number, gpu or auto
  int nproc = 1;                    // what it comes to on this machine
  std::string nproc_why;            // how, where it was not a number
  int nnodes = 1, node_rank = 0, master_port = 29500;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false; // several nodes must name node 0
  bool master_port_given = false;
  bool standalone = false; // one node, a free port (torchrun's)
  int max_restarts = 0;    // attempts after a failure (torchrun's)
  std::vector<std::string> command;
};

struct Child {
  pid_t pid = -1;
  int rank = 0;
  int err_fd = -1;     // read end of its stderr
  std::string partial; // stderr text after the last newline
  bool wrote = false;  // anything on stderr at all
  bool running = true;
};

// A port of 127.0.0.1 that nothing listens on now (the kernel's pick). Rank
// 0 binds it a moment later; another program taking it in between is
// the same race torchrun's --standalone runs, and rank 0 then says the
// port is taken.
int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t n = sizeof a;
  const bool ok = fd >= 0 &&
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0;
  const int saved = errno;
  if (fd >= 0)
    ::close(fd);
  if (!ok)
    throw UserError(
        std::string("orchard launch --standalone: cannot find a free port on "
                    "127.0.0.1 (") +
        std::strerror(saved) + "); give one with --master-port.");
  return ntohs(a.sin_port);
}

// The binary to start: this one.
std::string self_path() {
#if defined(__linux__)
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0)
    return std::string(buf, size_t(n));
#endif
  return program_name();
}

// This launch's own words up to its `--`, for the hints the ranks end
// with ("Next stage: orchard launch --nproc-per-node 2 -- train ...").
std::string launch_as(const Settings& s) {
  std::string a =
      program_name() + " launch --nproc-per-node " + s.nproc_per_node;
  if (s.nnodes > 1)
    a += " --nnodes " + std::to_string(s.nnodes) + " --node-rank " +
        std::to_string(s.node_rank) + " --master-addr " + s.master_addr;
  if (s.standalone)
    a += " --standalone";
  else if (s.master_port_given)
    a += " --master-port " + std::to_string(s.master_port);
  if (s.max_restarts > 0)
    a += " --max-restarts " + std::to_string(s.max_restarts);
  return a + " --";
}

// The environment of one rank: this process's, with torchrun's variables
// set. With a watch, node 0's launcher serves the store and every rank
// connects to it, as torchrun's agent and its ranks do, its keys apart for
// each attempt (TORCHELASTIC_RESTART_COUNT).
std::vector<std::string> rank_environment(
    const Settings& s,
    int local_rank,
    int attempt,
    bool launcher_store) {
  const int world = s.nnodes * s.nproc;
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(s.node_rank * s.nproc + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(s.nproc)},
      {"GROUP_RANK", std::to_string(s.node_rank)},
      {"MASTER_ADDR", s.master_addr},
      {"MASTER_PORT", std::to_string(s.master_port)},
      {"TORCHELASTIC_USE_AGENT_STORE", launcher_store ? "True" : "False"},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"ORCHARD_LAUNCH_AS", launch_as(s)}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (!set.count(v.substr(0, v.find('='))))
      env.push_back(v);
  }
  for (const auto& [k, v] : set)
    env.push_back(k + "=" + v);
  return env;
}

// Starts one rank, its stderr into a pipe (err_fd, the read end). The
// child only calls what is safe after fork() in a program with threads
// (the store's server runs one): everything it needs is made here first.
pid_t start_rank(
    const Settings& s,
    int local_rank,
    int attempt,
    const std::string& exe,
    bool launcher_store,
    int& err_fd) {
  // argv[0] as the user typed it (the ranks' hints name the program so).
  std::vector<std::string> args = {program_name()};
  args.insert(args.end(), s.command.begin(), s.command.end());
  std::vector<std::string> env =
      rank_environment(s, local_rank, attempt, launcher_store);
  std::vector<char*> argv, envp;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string cannot = "cannot run " + exe + "\n";
  const pid_t launcher = ::getpid();
  int fds[2];
  if (::pipe(fds) != 0)
    throw UserError(
        std::string("orchard launch: cannot make a pipe: ") +
        std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0)
    throw UserError(
        std::string("orchard launch: cannot start a process: ") +
        std::strerror(errno));
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
#if defined(__linux__)
    // A launcher that is killed takes its ranks along (each saves first,
    // as on any SIGTERM) rather than leaving them training unwatched.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher)
      ::_exit(128 + SIGTERM);
#endif
    ::execve(exe.c_str(), argv.data(), envp.data());
    [[maybe_unused]] auto n =
        ::write(STDERR_FILENO, cannot.data(), cannot.size());
    ::_exit(127);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  err_fd = fds[0];
  return pid;
}

// Copies what a rank wrote to stderr, each line prefixed with its rank.
void drain(Child& c, bool flush_partial) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(c.err_fd, buf, sizeof buf);
    if (n <= 0)
      break;
    c.wrote = true;
    c.partial.append(buf, size_t(n));
  }
  size_t nl;
  while ((nl = c.partial.find('\n')) != std::string::npos) {
    std::fprintf(
        stderr, "[rank %d] %s\n", c.rank, c.partial.substr(0, nl).c_str());
    c.partial.erase(0, nl + 1);
  }
  if (flush_partial && !c.partial.empty()) {
    std::fprintf(stderr, "[rank %d] %s\n", c.rank, c.partial.c_str());
    c.partial.clear();
  }
  std::fflush(stderr);
}

std::string how_it_ended(int status) {
  if (WIFEXITED(status))
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") +
        std::to_string(WTERMSIG(status)) + " (" +
        ::strsignal(WTERMSIG(status)) + ")";
  return "ended";
}

// The signal a rank stopped for: Orchard's exit 128 + a forwarded signal,
// after saving; or death by `forwarded`, the signal the launcher passed on,
// which a rank still starting (its handler not yet installed) takes as
// any program does. 0 otherwise: a death by another signal is a failure.
int stop_signal_of(int status, int forwarded) {
  if (WIFSIGNALED(status))
    return forwarded != 0 && WTERMSIG(status) == forwarded ? forwarded : 0;
  if (!WIFEXITED(status))
    return 0;
  for (int sig : kForwarded)
    if (WEXITSTATUS(status) == 128 + sig)
      return sig;
  return 0;
}

int exit_code_of(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return 1;
}

// How one attempt of the run ended on this node.
struct Attempt {
  int result = 0;            // the exit code this node ends with
  std::string failure;       // the first rank that failed, and how
  std::string where;         // where its own account of it is, if anywhere
  bool node_lost = false;    // another node, or node 0's store, is gone
  int forwarded = 0;         // the signal passed on to every rank, if any
  int stopped_on_signal = 0; // ranks' exit 128 + SIGINT/TERM/HUP, saved
};

// Why a failed attempt is not followed by another, or "" when it is: the
// restarts are used up, the user stopped the run, a node is gone, or the
// run's first failure was Orchard's exit 2 (bad input, which a restart
// would only repeat). Every node decides alike: the code is the run's
// first, read from node 0's store.
std::string why_not_restarted(
    const Attempt& a,
    const Settings& s,
    dist::NodeWatch* watch,
    int attempt) {
  if (attempt >= s.max_restarts)
    return s.max_restarts == 0
        ? "--max-restarts is 0"
        : "--max-restarts " + std::to_string(s.max_restarts) + " used up";
  if (a.forwarded || g_forward)
    return "the run was stopped by a signal to orchard launch";
  if (a.node_lost)
    return "a node is gone; start every node's `orchard launch` again to "
           "resume";
  const int first = watch ? watch->first_failure_code() : 0;
  const int code = first ? first : a.result;
  if (code == kExitUsage)
    return "the rank exited with code 2, Orchard's answer to bad input, "
           "which a restart would only repeat; fix what its error says";
  return "";
}

// One attempt: starts this node's ranks and waits for them, stopping them
// all when one fails, when another node's rank fails or when a node is
// gone. Node 0's launcher serves the store and, unless the ranks restart,
// stays until every other node has finished.
Attempt run_attempt(
    const Settings& s,
    const std::string& exe,
    dist::NodeWatch* watch,
    int attempt) {
  std::vector<Child> children(size_t(s.nproc));
  for (int i = 0; i < s.nproc; ++i) {
    children[size_t(i)].rank = s.node_rank * s.nproc + i;
    children[size_t(i)].pid = start_rank(
        s, i, attempt, exe, watch != nullptr, children[size_t(i)].err_fd);
  }
  Attempt a;
  time_t kill_at = 0; // SIGKILL the rest after this time
  int running = s.nproc;
  time_t next_look = 0;      // the next look at the other nodes
  time_t ended_at = 0;       // when this node's ranks had all ended
  bool said_waiting = false; // node 0: "waiting for the other nodes"
  auto stop_others = [&](int sig) {
    for (auto& c : children)
      if (c.running)
        ::kill(c.pid, sig);
  };
  // Another node's rank failed or a node is gone: this node's ranks stop.
  auto stop_for =
      [&](const std::string& why, const std::string& account, int code) {
        if (!a.failure.empty())
          return;
        a.failure = why;
        a.where = account;
        a.result = code;
        if (running > 0) {
          std::fprintf(
              stderr,
              "orchard launch: %s; stopping this node's rank(s).\n",
              a.failure.c_str());
          stop_others(SIGTERM);
          kill_at = std::time(nullptr) + kGraceSeconds;
        }
      };
  for (;;) {
    if (g_forward) {
      a.forwarded = g_forward;
      g_forward = 0;
      stop_others(a.forwarded); // each finishes its step and exits (rank 0
                                // saves a checkpoint first)
    }
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.err_fd >= 0)
        fds.push_back({c.err_fd, POLLIN, 0});
    ::poll(fds.data(), nfds_t(fds.size()), 200);
    for (auto& c : children)
      if (c.err_fd >= 0)
        drain(c, false);
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& c : children) {
        if (c.pid != pid || !c.running)
          continue;
        c.running = false;
        --running;
        drain(c, true);
        ::close(c.err_fd);
        c.err_fd = -1;
        const int code = exit_code_of(status);
        // A rank that stopped for a signal after saving (Orchard exits
        // 128 + it, as one process would; with several processes every
        // rank stops after the same step, signalled itself or not), or was
        // still starting when the launcher passed one on, has not failed,
        // and rank 0 may still be saving.
        if (const int sig = stop_signal_of(status, a.forwarded)) {
          a.stopped_on_signal = a.stopped_on_signal ? a.stopped_on_signal : sig;
          a.result = a.result ? a.result : code;
          continue;
        }
        if (code != 0 && a.failure.empty()) {
          a.failure = "rank " + std::to_string(c.rank) +
              (s.nnodes > 1 ? " (node " + std::to_string(s.node_rank) + ")"
                            : std::string()) +
              " " + how_it_ended(status);
          a.where = c.wrote ? "its error is above, marked [rank " +
                  std::to_string(c.rank) + "]"
              : WIFSIGNALED(status)
              ? "it printed nothing: stopped from outside, e.g. by the "
                "out-of-memory killer (see dmesg) or a kill command"
              : "it printed nothing on stderr";
          a.result = code;
          if (watch)
            watch->report_failure(a.failure, code);
          if (running > 0) {
            std::fprintf(
                stderr,
                "orchard launch: %s; stopping the other rank(s).\n",
                a.failure.c_str());
            stop_others(SIGTERM);
            kill_at = std::time(nullptr) + kGraceSeconds;
          }
        }
      }
    }
    const time_t now = std::time(nullptr);
    if (kill_at && now >= kill_at) {
      stop_others(SIGKILL);
      kill_at = 0;
    }
    if (running == 0 && ended_at == 0) {
      ended_at = now;
      if (watch)
        watch->finished(a.result);
    }
    // Node 0 serves the store: it stays until every other node has read
    // what it needs (a failure, the end) and said it finished, or is gone.
    // Restarting, every node goes on to the next attempt at once.
    if (running == 0 &&
        (!watch || watch->others_finished() ||
         (!a.failure.empty() &&
          why_not_restarted(a, s, watch, attempt).empty())))
      break;
    if (watch && now >= next_look) {
      next_look = now + 1;
      const dist::NodeNews news = watch->look();
      if (!news.failure.empty())
        stop_for(
            news.failure,
            "its error is in that node's output",
            news.failure_code ? news.failure_code : 1);
      if (!news.lost.empty()) {
        stop_for(news.lost, "the ranks there may still be running", 1);
        a.node_lost = true;
      }
    }
    if (running > 0 || watch->others_finished())
      continue;
    // After a failure, node 0 waits no longer than the others' grace.
    const time_t waited = now - ended_at;
    if (waited >=
        (a.failure.empty() ? kWaitForNodesSeconds : kGraceSeconds + 10)) {
      std::fprintf(
          stderr,
          "orchard launch: the other node(s) had not finished %d s after "
          "this node's ranks ended; leaving (their launchers find node 0 "
          "gone and stop their ranks).\n",
          int(waited));
      break;
    }
    if (!said_waiting && waited >= 2) {
      said_waiting = true;
      std::fprintf(
          stderr,
          "orchard launch: this node's ranks have ended; waiting for the "
          "other node(s) to finish.\n");
    }
  }
  return a;
}

// The attempt's last line: the failure (and another node's, where this
// one may be its echo), or the signal the ranks stopped for.
void say_how_it_ended(
    const Attempt& a,
    const Settings& s,
    dist::NodeWatch* watch) {
  const std::string all = s.nproc == 1
      ? "it has exited"
      : "all " + std::to_string(s.nproc) + " have exited";
  if (!a.failure.empty()) {
    std::fprintf(
        stderr,
        "orchard launch: %s (%s).\n",
        a.failure.c_str(),
        a.where.c_str());
    // A failure here may be the echo of one on another node.
    if (watch)
      for (const std::string& there : watch->failures_elsewhere())
        if (there != a.failure)
          std::fprintf(
              stderr,
              "orchard launch: also, on another node: %s (its error is in "
              "that node's output).\n",
              there.c_str());
  } else if (a.forwarded)
    std::fprintf(
        stderr,
        "orchard launch: stopped by %s, passed on to every rank; %s.\n",
        train::signal_name(a.forwarded).c_str(),
        all.c_str());
  else if (a.stopped_on_signal)
    std::fprintf(
        stderr,
        "orchard launch: the ranks stopped for %s, sent to a rank itself or "
        "to another node; every rank stopped after the same step, rank 0 "
        "saving a checkpoint; %s.\n",
        train::signal_name(a.stopped_on_signal).c_str(),
        all.c_str());
  std::fflush(stderr);
}

int run_launch(const Settings& s) {
  if (s.command.empty())
    throw UserError(
        "orchard launch needs the command to run after `--`, e.g. `orchard "
        "launch --nproc-per-node 2 -- train --preset quick`.");
  if (s.command.front() != "train" && s.command.front() != "pipeline")
    throw UserError(
        "orchard launch starts training commands (train, pipeline), not '" +
        s.command.front() + "'.");
  if (s.node_rank >= s.nnodes)
    throw UserError(
        "--node-rank " + std::to_string(s.node_rank) +
        " is not below "
        "--nnodes " +
        std::to_string(s.nnodes) + ": number the nodes 0 to " +
        std::to_string(s.nnodes - 1) + ".");
  if (s.standalone && (s.nnodes > 1 || s.master_addr_given))
    throw UserError(
        "--standalone is one node on this host, with the rendezvous on a "
        "free port of its own: leave out --nnodes and --master-addr, or "
        "leave out --standalone to join several nodes.");
  if (s.standalone && s.master_port_given)
    throw UserError(
        "--standalone picks a free port itself: leave out --master-port, or "
        "leave out --standalone to use that port.");
  if (s.nnodes > 1 && !s.master_addr_given)
    throw UserError(
        "--nnodes " + std::to_string(s.nnodes) +
        " needs --master-addr: the "
        "host name or address of node 0, the same on every node.");
  // A mistyped host fails here, not after the rendezvous's 300 s.
  dist::check_host_resolves(s.master_addr, "--master-addr");
  const std::string exe = self_path();
  if (!s.nproc_why.empty())
    std::printf("orchard launch: %s.\n", s.nproc_why.c_str());
  std::printf(
      "orchard launch: %d process(es) on this node (node %d of %d, %d in "
      "all), rendezvous at %s:%d\n",
      s.nproc,
      s.node_rank,
      s.nnodes,
      s.nproc * s.nnodes,
      s.master_addr.c_str(),
      s.master_port);
  std::fflush(stdout);
  // Node 0 serves the rendezvous; the other nodes wait for it here,
  // before starting their ranks.
  if (s.node_rank > 0) {
    std::printf(
        "orchard launch: joining node 0 at %s:%d\n",
        s.master_addr.c_str(),
        s.master_port);
    std::fflush(stdout);
  }
  // What every node must be started with alike (the ranks' numbers and
  // the restarts follow from it): another node's launcher compares its own
  // with node 0's.
  const dist::LaunchSettings alike = {
      {"--nnodes", std::to_string(s.nnodes)},
      {"--nproc-per-node", std::to_string(s.nproc)},
      {"--max-restarts", std::to_string(s.max_restarts)}};
  std::unique_ptr<dist::NodeWatch> watch = dist::NodeWatch::start(
      s.master_addr, s.master_port, s.node_rank, s.nnodes, alike);

  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old[3] = {};
  for (int i = 0; i < 3; ++i)
    sigaction(kForwarded[i], &sa, &old[i]);
  int result = 0;
  for (int attempt = 0;; ++attempt) {
    const Attempt a = run_attempt(s, exe, watch.get(), attempt);
    say_how_it_ended(a, s, watch.get());
    result = a.result;
    if (a.failure.empty()) {
      if (attempt > 0 && result == 0)
        std::fprintf(
            stderr,
            "orchard launch: the run finished after %d restart(s).\n",
            attempt);
      break;
    }
    const std::string why_not = why_not_restarted(a, s, watch.get(), attempt);
    if (!why_not.empty()) {
      if (s.max_restarts > 0)
        std::fprintf(
            stderr, "orchard launch: not restarted: %s.\n", why_not.c_str());
      break;
    }
    std::fprintf(
        stderr,
        "orchard launch: restarting %s (restart %d of %d, --max-restarts); "
        "they resume from the run's newest checkpoint.\n",
        s.nnodes > 1 ? "every node's ranks" : "the ranks",
        attempt + 1,
        s.max_restarts);
    std::fflush(stderr);
    if (watch)
      watch->start_attempt(attempt + 1);
  }
  for (int i = 0; i < 3; ++i)
    sigaction(kForwarded[i], &old[i], nullptr);
  return result;
}

// "its options: --nproc-per-node, --nnodes, ...", from launch's own
// declarations.
std::string launch_options(const CLI::App& launch) {
  std::string said = "its options:";
  for (const CLI::Option* o : launch.get_options()) {
    if (o->get_lnames().empty() || o == launch.get_help_ptr())
      continue;
    said += (said.back() == ':' ? " --" : ", --") + o->get_lnames().front();
  }
  return said + ", and torchrun's underscore spellings of them";
}

} // namespace

void separate_launched_command(
    const CLI::App& root,
    std::vector<std::string>& args) {
  if (args.size() < 3 || args[1] != "launch")
    return;
  const CLI::App* launch = root.get_subcommand("launch");
  for (size_t i = 2; i < args.size();) {
    const std::string& a = args[i];
    if (a == "--")
      return; // already separated
    if (a.size() > 1 && a[0] == '-') {
      // One of launch's options (its value the next word unless given
      // with '='), or one it does not know: CLI11 then says so.
      const size_t eq = a.find('=');
      const std::string name = a.substr(0, eq);
      const CLI::Option* o = launch->get_option_no_throw(name);
      if (o == nullptr)
        throw UserError(
            "'" + name + "' is not an option of orchard launch (" +
            launch_options(*launch) +
            "). An option of the command goes after the command: `orchard "
            "launch --nproc-per-node 2 -- train --device cpu`.");
      i += eq == std::string::npos && o->get_items_expected_max() > 0 ? 2 : 1;
      continue;
    }
    args.insert(args.begin() + std::ptrdiff_t(i), "--");
    return;
  }
}

Command register_launch(CLI::App& root) {
  auto st = std::make_shared<Settings>();
  CLI::App* app = root.add_subcommand(
      "launch",
      "Start several training processes on this node (data-parallel, "
      "torchrun's variables): orchard launch --nproc-per-node 2 -- train ...");
  // Each option also under torchrun's underscore spelling.
  app->add_option(
      "--nproc-per-node,--nproc_per_node",
      st->nproc_per_node,
      "processes on this node: a number, `gpu` (one per CUDA GPU) or `auto` "
      "(one per CUDA GPU, else one); default 1");
  app->add_option("--nnodes", st->nnodes, "nodes in all (default 1)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option(
         "--node-rank,--node_rank", st->node_rank, "this node's number, from 0")
      ->check(CLI::Range(0, 1 << 16));
  app->add_option(
      "--master-addr,--master_addr",
      st->master_addr,
      "host of node 0, where rank 0 serves the rendezvous (default "
      "127.0.0.1)");
  app->add_option(
         "--master-port,--master_port",
         st->master_port,
         "its port (default 29500)")
      ->check(CLI::Range(1, 65535));
  app->add_flag(
      "--standalone",
      st->standalone,
      "one node, the rendezvous on a free port of 127.0.0.1 (torchrun's "
      "--standalone): two runs on one host need no --master-port");
  app->add_option(
         "--max-restarts,--max_restarts",
         st->max_restarts,
         "after a rank fails, start every rank again this many times at "
         "most, each resuming from the run's newest checkpoint (torchrun's "
         "--max-restarts); default 0")
      ->check(CLI::Range(0, 1000));
  app->add_option(
      "command",
      st->command,
      "the orchard command to run, after `--` (which may be left out)");
  return {app, [st, app] {
            st->master_addr_given = app->count("--master-addr") > 0;
            st->master_port_given = app->count("--master-port") > 0;
            if (st->standalone && !st->master_port_given)
              st->master_port = free_local_port();
            // Counting the GPUs starts CUDA's driver here, not a context;
            // the ranks are new programs (exec), so they start their own.
            const bool asks_gpus =
                st->nproc_per_node == "gpu" || st->nproc_per_node == "auto";
            const auto count = dist::processes_per_node(
                st->nproc_per_node,
                asks_gpus ? int(torch::cuda::device_count()) : 0);
            st->nproc = count.processes;
            st->nproc_why = count.why;
            return run_launch(*st);
          }};
}

} // namespace orchard::cli
