// Several processes on c10d (Gloo on loopback, src/dist): `orchard launch`
// with two ranks trains the same weights as one process with the same total
// batch; killing one rank stops the other with a message naming it, and a
// relaunch resumes exactly; bad launches get a clear message and a non-zero
// exit. Skipped where this build has no Gloo (dist::backend_for says why).
#include "core/safetensors.h"
#include "dist/world.h"
#include "runs/checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace orchard {
namespace {

using test::TempDir;

#define REQUIRE_GLOO()                                         \
  do {                                                         \
    auto [ok, why] = dist::backend_for("cpu");                 \
    if (!ok)                                                   \
      GTEST_SKIP() << "no multi-process CPU backend: " << why; \
  } while (0)

// A port nothing listens on now (bound, read, released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct Corpus {
  TempDir dir;
  std::map<std::string, std::string> env;
  Corpus() {
    dir.write("corpus/a.jsonl", test::numbered_documents(400));
    env = {{"ORCHARD_HOME", dir.file("home")}, {"OMP_NUM_THREADS", "1"}};
  }
  // 256 tokens a step: 2 sequences of 32 a micro-step, 4 micro-steps in
  // one process, 2 on each of two.
  std::vector<std::string> train(
      const std::string& run,
      int steps,
      std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {
        "train",
        "--device",
        "cpu",
        "data_paths=[" + dir.file("corpus") + "]",
        "depth=1",
        "max_seq_len=32",
        "total_batch_size=256",
        "device_batch_size=2",
        "num_iterations=" + std::to_string(steps),
        "eval_every=0",
        "eval_tokens=256",
        "sample_every=0",
        "save_total_limit=0",
        "run_dir=" + dir.file(run)};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // Port 0: `--standalone`, the launcher's own pick of a free port.
  std::vector<std::string> launch(
      int port,
      const std::vector<std::string>& command,
      int processes = 2) const {
    std::vector<std::string> a = {
        "launch", "--nproc-per-node", std::to_string(processes)};
    if (port == 0)
      a.push_back("--standalone");
    else
      a.insert(a.end(), {"--master-port", std::to_string(port)});
    a.push_back("--");
    a.insert(a.end(), command.begin(), command.end());
    return a;
  }
  // Node `node` of two on this host (`orchard launch --nnodes=2`), node
  // 0's rendezvous at 127.0.0.1:port; `options` go before the `--`.
  static std::vector<std::string> node_launch(
      int node,
      int port,
      const std::vector<std::string>& command,
      const std::vector<std::string>& options = {}) {
    std::vector<std::string> a = {
        "launch",
        "--nnodes=2",
        "--node-rank=" + std::to_string(node),
        "--master-addr=127.0.0.1",
        "--master-port=" + std::to_string(port)};
    a.insert(a.end(), options.begin(), options.end());
    a.push_back("--");
    a.insert(a.end(), command.begin(), command.end());
    return a;
  }
  std::map<std::string, torch::Tensor> weights(const std::string& run, int step)
      const {
    char name[64];
    std::snprintf(name, sizeof name, "/checkpoints/step_%06d", step);
    return safetensors::load(dir.file(run + name + "/model.safetensors"));
  }
};

// Expects every line of `lines` somewhere in `out` (a run's output).
void expect_said(
    const std::string& out,
    const std::vector<std::string>& lines) {
  for (const auto& line : lines)
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
}

// What rank 0 of a restarted run says when its command had resume=never.
const std::string kRestartResumes =
    "Restart 1 of this run (TORCHELASTIC_RESTART_COUNT): resuming from its "
    "newest checkpoint, resume=auto in place of resume=never.";

double max_difference(
    const std::map<std::string, torch::Tensor>& a,
    const std::map<std::string, torch::Tensor>& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a)
    worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
  return worst;
}

// From a zero_stage=1 run's output: how many of the trained values rank 0
// steps, and of how many ({-1, -1} where it does not say).
std::pair<int64_t, int64_t> values_rank0_steps(
    const std::string& out,
    int processes) {
  const std::string said = "Optimizer state sharded over " +
      std::to_string(processes) + " processes (zero_stage=1): rank 0 steps ";
  const size_t at = out.find(said);
  if (at == std::string::npos)
    return {-1, -1};
  std::istringstream figures(out.substr(at + said.size()));
  int64_t mine = 0, all = 0;
  std::string of, the;
  figures >> mine >> of >> the >> all;
  return {mine, all};
}

// The mean of |a - b| over every element of every tensor.
double mean_difference(
    const std::map<std::string, torch::Tensor>& a,
    const std::map<std::string, torch::Tensor>& b) {
  double sum = 0, n = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    sum += (t - b.at(name)).abs().sum().item<double>();
    n += double(t.numel());
  }
  return n > 0 ? sum / n : 0;
}

TEST(Distributed, TwoGlooProcessesTrainWhatOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  // The model gets a trained matrix that no forward uses, and the blocks
  // a weight decay: one process leaves that matrix as it was (it has no
  // gradient, so the optimizer skips it), and so must two.
  c.env["ORCHARD_TEST_UNUSED_PARAMETER"] = "1";
  auto one = test::run_orchard(c.train("one", 6, {"weight_decay=0.1"}), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_NE(
      one.out.find("4 accumulation step(s), 256 tokens"), std::string::npos)
      << one.out;
  auto two = test::run_orchard(
      c.launch(free_port(), c.train("two", 6, {"weight_decay=0.1"})), c.env);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NE(
      two.out.find("2 accumulation step(s) on each of 2 processes"),
      std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("Distributed: rank 0 of 2"), std::string::npos)
      << two.out;
  // Rank 1 prints nothing (its stdout is silenced); rank 0 writes the run.
  EXPECT_EQ(two.out.find("Distributed: rank 1 of 2"), std::string::npos)
      << two.out;
  const size_t device_line = two.out.find("Using device");
  ASSERT_NE(device_line, std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("Using device", device_line + 1), std::string::npos)
      << two.out;
  EXPECT_TRUE(std::filesystem::exists(c.dir.file("two/report.md")));
  // Every gradient reaches the averager through autograd's hooks (what
  // lets buckets go out while the backward runs; this small model's one
  // bucket goes once the last gradient is in, after the backward).
  const size_t hooks = two.out.find(" gradients handed over by its hooks");
  ASSERT_NE(hooks, std::string::npos) << two.out;
  const size_t of = two.out.rfind(" of ", hooks);
  const size_t from = two.out.rfind("; ", of);
  ASSERT_TRUE(of != std::string::npos && from != std::string::npos);
  const int hooked = std::stoi(two.out.substr(from + 2));
  EXPECT_GT(hooked, 0) << two.out;
  EXPECT_EQ(hooked + 1, std::stoi(two.out.substr(of + 4))) << two.out;
  EXPECT_NE(
      two.out.find("1 parameter(s) no process gave a gradient keep none"),
      std::string::npos)
      << two.out;

  // Same data, same mean gradient: the weights agree to float rounding
  // (the sums run in another order). Two ranks reading the same data, or
  // gradients summed rather than averaged, move them by far more.
  auto w1 = c.weights("one", 6), w2 = c.weights("two", 6);
  EXPECT_LT(max_difference(w1, w2), 2e-4);
  const auto ones = torch::ones({4, 4});
  EXPECT_TRUE(torch::equal(w1.at("blocks.0.test_unused"), ones));
  EXPECT_TRUE(torch::equal(w2.at("blocks.0.test_unused"), ones))
      << w2.at("blocks.0.test_unused");
  // ... and they did train: far from the same run's first checkpoint.
  auto start =
      test::run_orchard(c.train("short", 1, {"weight_decay=0.1"}), c.env);
  ASSERT_EQ(start.exit_code, 0) << start.err;
  EXPECT_GT(max_difference(c.weights("short", 1), w2), 1e-2);

  // A control: one process with half the batch (what a rank alone sees)
  // ends elsewhere, so the tolerance above can tell.
  auto half = test::run_orchard(
      c.train("half", 6, {"total_batch_size=128", "weight_decay=0.1"}), c.env);
  ASSERT_EQ(half.exit_code, 0) << half.err;
  EXPECT_GT(max_difference(c.weights("half", 6), w2), 1e-3);
}

// Three ranks (more than two GPUs cannot be tried on the CUDA machine,
// which lends two): a world size that is not a power of two splits the
// data, the buckets and ZeRO-1's regions three ways, and still trains what
// one process trains; a sharded checkpoint of three goes on with two.
TEST(Distributed, ThreeProcessesTrainWhatOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  // 192 tokens a step: 3 micro-steps of 2 x 32 in one process, 1 on each
  // of three.
  const std::string batch = "total_batch_size=192";
  auto one = test::run_orchard(
      c.train("one", 6, {batch, "save_every=3", "weight_decay=0.1"}), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  // `processes` ranks train `run` for 6 steps.
  // (Three processes start with `--standalone`: a port of the launcher's
  // choosing.)
  auto launched = [&](int processes,
                      const std::string& run,
                      std::vector<std::string> extra) {
    extra.push_back(batch);
    extra.push_back("weight_decay=0.1");
    return test::run_orchard(
        c.launch(
            processes == 3 ? 0 : free_port(),
            c.train(run, 6, extra),
            processes),
        c.env);
  };
  auto three = launched(3, "three", {});
  ASSERT_EQ(three.exit_code, 0) << three.out << three.err;
  EXPECT_EQ(three.out.find("rendezvous at 127.0.0.1:29500"), std::string::npos)
      << three.out;
  EXPECT_NE(
      three.out.find("1 accumulation step(s) on each of 3 processes"),
      std::string::npos)
      << three.out;
  // The embedding's gradient from all three ranks' rows, gathered (one
  // micro-step a rank: nothing accumulated to add to them).
  EXPECT_NE(
      three.out.find("1 made from every process's rows"), std::string::npos)
      << three.out;
  EXPECT_LT(max_difference(c.weights("one", 6), c.weights("three", 6)), 2e-4);

  // ZeRO-1 over three: rank 0 steps about a third of the values.
  auto sharded = launched(3, "sharded", {"save_every=3", "zero_stage=1"});
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out << sharded.err;
  const auto [mine, all] = values_rank0_steps(sharded.out, 3);
  ASSERT_GT(all, 0) << sharded.out;
  EXPECT_GT(mine, all / 6) << sharded.out;
  EXPECT_LT(mine, all / 2) << sharded.out;
  // Sharded too, the embedding's gradient is made from the three ranks'
  // gathered rows, and every rank steps it whole.
  EXPECT_NE(
      sharded.out.find("1 made from every process's rows"), std::string::npos)
      << sharded.out;
  EXPECT_NE(
      sharded.out.find("every rank steps the embedding's "), std::string::npos)
      << sharded.out;
  // Every step's gradient norm is one process's: the ranks' pieces'
  // squares summed, the embedding's (on every rank) counted once.
  auto norms = [&](const std::string& run) {
    std::vector<double> n;
    std::istringstream lines(
        test::read_text(c.dir.file(run + "/metrics.jsonl")));
    for (std::string line; std::getline(lines, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("grad_norm"))
        n.push_back(j["grad_norm"].get<double>());
    }
    return n;
  };
  const auto one_norms = norms("one"), sharded_norms = norms("sharded");
  ASSERT_EQ(one_norms.size(), 6u);
  ASSERT_EQ(sharded_norms.size(), one_norms.size());
  for (size_t i = 0; i < one_norms.size(); ++i)
    EXPECT_NEAR(sharded_norms[i], one_norms[i], 1e-4 * one_norms[i])
        << "step " << i + 1;
  EXPECT_LT(max_difference(c.weights("one", 6), c.weights("sharded", 6)), 2e-4);

  // Its step-3 checkpoint on two processes (one sequence a micro-step, so
  // that the 6 sequences of a step divide between them): each takes its
  // share of the state three wrote, and the run ends where one process's
  // does.
  auto two = launched(
      2,
      "two",
      {"device_batch_size=1",
       "zero_stage=1",
       "resume=" + c.dir.file("sharded/checkpoints/step_000003")});
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NE(
      two.out.find("The checkpoint was written by 3 process(es), each keeping "
                   "its share of the optimizer state; this run has 2, each "
                   "taking its share"),
      std::string::npos)
      << two.out;
  EXPECT_LT(max_difference(c.weights("one", 6), c.weights("two", 6)), 2e-4);
  // A control: the last 3 steps moved the weights by far more than that.
  EXPECT_GT(max_difference(c.weights("one", 3), c.weights("two", 6)), 1e-3);
}

// A shell command that runs Debian's torchrun (two processes, `options`
// added) on `orchard command...` in the corpus's folder with its
// environment, its output to `log`, torchrun itself in the shell's place.
// Debian 12's torchrun (python3-torch 1.13, installed by ./orchard.sh setup
// for the tests) crashes with its default output flags under Python 3.11;
// `--redirects 2 --tee 2` avoids that.
std::string torchrun_command(
    const Corpus& c,
    const std::vector<std::string>& options,
    const std::vector<std::string>& command,
    const std::string& log) {
  std::string cmd = "cd " + test::shell_quote(c.dir.path()) + " && exec env";
  for (const auto& [k, v] : c.env)
    cmd += " " + k + "=" + test::shell_quote(v);
  std::vector<std::string> a = {
      "torchrun",
      "--nproc_per_node",
      "2",
      "--master_port",
      std::to_string(free_port()),
      "--redirects",
      "2",
      "--tee",
      "2"};
  a.insert(a.end(), options.begin(), options.end());
  a.insert(a.end(), {"--no_python", ORCHARD_BIN});
  a.insert(a.end(), command.begin(), command.end());
  for (const auto& x : a)
    cmd += " " + test::shell_quote(x);
  return cmd + " > " + test::shell_quote(log) + " 2>&1";
}

// torchrun starts the binary unchanged (its agent serves the store, every
// rank connects as a client).
TEST(Distributed, TorchrunStartsTheBinaryUnchanged) {
  REQUIRE_GLOO();
  if (std::system("command -v torchrun >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "torchrun is not installed (Debian: python3-torch)";
  Corpus c;
  auto one = test::run_orchard(c.train("one", 4), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string cmd =
      torchrun_command(c, {}, c.train("two", 4), c.dir.file("torchrun.log"));
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << test::read_text(c.dir.file("torchrun.log"));
  EXPECT_LT(max_difference(c.weights("one", 4), c.weights("two", 4)), 2e-4);
}

// Two "machines" on one host: two `orchard launch --nnodes 2` groups of one
// process each, node 1 joining node 0's rendezvous by address, train what
// one process trains (issue 22: the multi-node rendezvous, simulated).
TEST(Distributed, TwoNodesOnOneHostTrainWhatOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  auto one = test::run_orchard(c.train("one", 4), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const std::string port = std::to_string(free_port());
  // Node 0 is started as Orchard spells it; node 1 as torchrun is, with
  // its underscores and no `--` before the command.
  auto node = [&](int r) {
    const std::string dash = r == 0 ? "-" : "_";
    std::vector<std::string> a = {
        "launch",
        "--nnodes",
        "2",
        "--node" + dash + "rank",
        std::to_string(r),
        "--nproc" + dash + "per" + dash + "node",
        "1",
        "--master" + dash + "addr=127.0.0.1",
        "--master" + dash + "port",
        port};
    if (r == 0)
      a.push_back("--");
    // 4 rows a micro-step: one micro-step a step on each rank, so the
    // head's product makes its gradient in the averager's bucket.
    for (const auto& x : c.train("nodes", 4, {"device_batch_size=4"}))
      a.push_back(x);
    return a;
  };
  pid_t second = test::spawn_orchard(node(1), c.env, c.dir.file("node1.log"));
  auto first = test::run_orchard(node(0), c.env);
  EXPECT_EQ(test::wait_child(second), 0)
      << test::read_text(c.dir.file("node1.log"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("Distributed: rank 0 of 2"), std::string::npos)
      << first.out;
  // The next stage is started as this one was.
  EXPECT_NE(
      first.out.find(
          "Next stage: " + std::string(ORCHARD_BIN) +
          " launch --nproc-per-node 1 --nnodes 2 --node-rank 0 --master-addr "
          "127.0.0.1 --master-port " +
          port + " -- train stage=mid"),
      std::string::npos)
      << first.out;
  // Node 1's only process is rank 1: it writes nothing to the run folder.
  EXPECT_EQ(
      test::read_text(c.dir.file("node1.log")).find("Distributed: rank"),
      std::string::npos);
  EXPECT_NE(
      first.out.find("1 accumulation step(s) on each of 2 processes"),
      std::string::npos)
      << first.out;
  EXPECT_NE(
      first.out.find("1 of them made in their bucket by their product"),
      std::string::npos)
      << first.out;
  // 128 tokens a rank, two ranks, fewer than the vocabulary's rows: the
  // embedding's gradient is made from both ranks' rows, gathered.
  EXPECT_NE(
      first.out.find("1 made from every process's rows of its output's "
                     "gradient, gathered"),
      std::string::npos)
      << first.out;
  EXPECT_LT(max_difference(c.weights("one", 4), c.weights("nodes", 4)), 2e-4);
}

// grad_reduce_dtype=bfloat16: each rank's gradient is rounded to bfloat16
// before the sum (on NCCL the buckets are sent in it; Gloo sends the
// rounded values in float32). The weights then stay near one process's,
// but not at float32's distance from them: the rounding did happen.
TEST(Distributed, GradientsAveragedInBfloat16StayNearOneProcess) {
  REQUIRE_GLOO();
  Corpus c;
  const std::vector<std::string> bf16 = {"grad_reduce_dtype=bfloat16"};
  auto one = test::run_orchard(c.train("one", 6, bf16), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_NE(
      one.out.find("grad_reduce_dtype=bfloat16 is how several processes "
                   "average their gradients; with one process it changes "
                   "nothing"),
      std::string::npos)
      << one.out;
  // bucket_cap_mb reaches the averager (this model's gradients fit in one
  // bucket either way).
  std::vector<std::string> low_settings = bf16;
  low_settings.push_back("bucket_cap_mb=3");
  auto low = test::run_orchard(
      c.launch(free_port(), c.train("low", 6, low_settings)), c.env);
  ASSERT_EQ(low.exit_code, 0) << low.out << low.err;
  EXPECT_NE(low.out.find("1 bucket(s) of up to 3 MB"), std::string::npos)
      << low.out;
  EXPECT_NE(
      low.out.find("averaged in bfloat16 (each rank's gradient rounded to "
                   "it; Gloo sends the sum in float32)"),
      std::string::npos)
      << low.out;
  auto full =
      test::run_orchard(c.launch(free_port(), c.train("full", 6)), c.env);
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  EXPECT_EQ(full.out.find("averaged in bfloat16"), std::string::npos);
  // Mean |difference| over every weight (the largest is no measure here:
  // where the ranks' gradients nearly cancel, the rounding can flip the
  // mean's sign, and AdamW's normalised step makes that a step of the
  // embedding's full rate). Seen: float32 6e-9, bfloat16 4.6e-5; one
  // process with half the batch (the wrong data) 3.4e-3.
  const auto w1 = c.weights("one", 6);
  const double near = mean_difference(w1, c.weights("full", 6)),
               rounded = mean_difference(w1, c.weights("low", 6));
  EXPECT_LT(near, 1e-7);
  EXPECT_LT(rounded, 3e-4);
  EXPECT_GT(rounded, 100 * near) << near;
}

// stage=trm on two processes: each holds half of global_batch_size's
// puzzles in flight; the halted slots of both take rows of one shared
// stream in slot order and exploration is drawn for all slots, so two
// processes hold the same puzzles in flight as one and train its weights.
// A run saved by one process resumes on two (the carry split between them).
TEST(Distributed, TwoProcessesTrainTheTrmOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  auto data = test::run_orchard(
      {"data",
       "sudoku",
       "--size",
       "4",
       "--count",
       "300",
       "--out",
       c.dir.file("s4")},
      c.env);
  ASSERT_EQ(data.exit_code, 0) << data.err;
  auto trm = [&](const std::string& run, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {
        "train",
        "--preset",
        "trm-sudoku-quick",
        "--device",
        "cpu",
        "data=" + c.dir.file("s4"),
        "num_iterations=8",
        "save_every=1",
        "eval_every=0",
        "eval_size=20",
        "save_total_limit=0",
        "run_dir=" + c.dir.file(run)};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto one = test::run_orchard(trm("one"), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  auto two = test::run_orchard(c.launch(free_port(), trm("two")), c.env);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  // Resumed on two processes with the optimizer state sharded (ZeRO-1:
  // AdamATan2's tensors split by elements, SignSGD's puzzle embeddings
  // whole) from one process's checkpoint.
  auto resumed = test::run_orchard(
      c.launch(
          free_port(),
          trm("resumed",
              {"zero_stage=1",
               "resume=" + c.dir.file("one/checkpoints/step_000004")})),
      c.env);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("(zero_stage=1)"), std::string::npos)
      << resumed.out;
  auto half = test::run_orchard(trm("half", {"global_batch_size=32"}), c.env);
  ASSERT_EQ(half.exit_code, 0) << half.err;
  auto load = [&](const std::string& run, int step, const char* file) {
    char name[64];
    std::snprintf(name, sizeof name, "/checkpoints/step_%06d/", step);
    return safetensors::load(c.dir.file(run + name + file));
  };
  // The weights agree to float rounding a few steps on; one process with
  // half the puzzles lands far away. Compared by the mean difference: a
  // gradient element near zero may take the other sign on two processes
  // (the sum's order differs), and SignSGD's puzzle embeddings and
  // AdamATan2's first steps move it by the whole rate either way (on this
  // VM two elements of 113K by 2 x 8e-4 at step 4, after which the
  // recursion spreads the difference by ~5x a step). Measured here at step
  // 3: two processes 2.3e-8, half the puzzles 3.5e-5; resumed one step on
  // two processes about 1e-10 (a flipped element would add 3.5e-8).
  // The trained weights (the EMA copies, 1 % of each step, left out).
  auto trained = [&](const std::string& run, int step) {
    auto w = load(run, step, "model.safetensors");
    std::erase_if(
        w, [](const auto& kv) { return kv.first.starts_with("ema."); });
    return w;
  };
  const auto w1 = trained("one", 3);
  ASSERT_FALSE(w1.empty());
  EXPECT_LT(mean_difference(w1, trained("two", 3)), 2e-6);
  EXPECT_GT(mean_difference(w1, trained("half", 3)), 1e-5);
  EXPECT_LT(mean_difference(trained("one", 5), trained("resumed", 5)), 1e-7);
  // The checkpoint holds both ranks' slots: the same puzzles in flight,
  // after as many supervision steps, as the one process's.
  const auto a = load("one", 8, "optimizer.safetensors");
  for (const char* run : {"two", "resumed"}) {
    const auto b = load(run, 8, "optimizer.safetensors");
    for (const char* key :
         {"carry.inputs", "carry.steps", "carry.halted", "carry.puzzle_ids"})
      EXPECT_TRUE(torch::equal(a.at(key), b.at(key))) << run << ": " << key;
  }
  // global_batch_size must split evenly.
  auto odd = test::run_orchard(
      c.launch(free_port(), trm("odd", {"global_batch_size=63"})), c.env);
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_NE(
      odd.err.find("global_batch_size=63 cannot be shared among 2 processes"),
      std::string::npos)
      << odd.err;
}

// stage=grpo on two processes: each generates for its own prompts of every
// generation (rows seeded by their place in the whole generation, the
// advantages and dapo's token count over all of it) and trains on its
// rows, so two processes of 4 completions a step train the adapter one
// process trains with 8.
TEST(Distributed, TwoProcessesTrainTheGrpoAdapterOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  c.dir.write("sums.jsonl", test::sums_jsonl());
  auto grpo = [&](const std::string& run,
                  int accumulation,
                  std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {
        "train",
        "stage=grpo",
        "model=" + std::string(ORCHARD_FIXTURES) + "/hf/llama",
        "env=answers",
        "data=" + c.dir.file("sums.jsonl"),
        "num_generations=4",
        "per_device_train_batch_size=4",
        "gradient_accumulation_steps=" + std::to_string(accumulation),
        "max_completion_length=8",
        "max_steps=3",
        "save_steps=1",
        "save_total_limit=0",
        "eval_steps=0",
        "eval_prompts=2",
        "learning_rate=5e-3",
        "lora.r=4",
        "lora.alpha=8",
        "run_dir=" + c.dir.file(run),
        "--device",
        "cpu"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto one = test::run_orchard(grpo("one", 2), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  auto two = test::run_orchard(c.launch(free_port(), grpo("two", 1)), c.env);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NE(two.out.find("on each of 2 processes"), std::string::npos)
      << two.out;
  auto half = test::run_orchard(grpo("half", 1), c.env);
  ASSERT_EQ(half.exit_code, 0) << half.err;
  auto adapter = [&](const std::string& run) {
    return safetensors::load(
        c.dir.file(run + "/adapter/adapter_model.safetensors"));
  };
  const double apart = max_difference(adapter("one"), adapter("two"));
  const double control = max_difference(adapter("one"), adapter("half"));
  std::printf(
      "GRPO: two ranks vs one process %.3g; vs half the prompts %.3g\n",
      apart,
      control);
  EXPECT_LT(apart, 1e-4);
  EXPECT_GT(control, 1e-3);
  // The same rewards, step by step: the same completions were drawn.
  auto rewards = [&](const std::string& run) {
    std::vector<double> r;
    std::istringstream lines(
        test::read_text(c.dir.file(run + "/metrics.jsonl")));
    for (std::string line; std::getline(lines, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("reward") && j.contains("loss"))
        r.push_back(j["reward"].get<double>());
    }
    return r;
  };
  EXPECT_EQ(rewards("one"), rewards("two"));
  EXPECT_EQ(rewards("two").size(), 3u);
  // A prompt's group split between the processes (2 rows each, groups of
  // 4, as TRL allows), with the optimizer state sharded (zero_stage=1):
  // the adapter and rewards of one process with the 4 rows.
  auto split = test::run_orchard(
      c.launch(
          free_port(),
          grpo("split", 1, {"per_device_train_batch_size=2", "zero_stage=1"})),
      c.env);
  ASSERT_EQ(split.exit_code, 0) << split.out << split.err;
  EXPECT_NE(split.out.find("(zero_stage=1)"), std::string::npos) << split.out;
  EXPECT_LT(max_difference(adapter("half"), adapter("split")), 1e-4);
  EXPECT_EQ(rewards("half"), rewards("split"));
  // The processes' rows together must be whole groups: 2 x 3 are not.
  auto ragged = test::run_orchard(
      c.launch(
          free_port(), grpo("ragged", 1, {"per_device_train_batch_size=3"})),
      c.env);
  EXPECT_NE(ragged.exit_code, 0);
  EXPECT_NE(
      ragged.err.find("x 2 processes = 6 is not a multiple of "
                      "num_generations=4"),
      std::string::npos)
      << ragged.err;
  EXPECT_NE(ragged.err.find("Nearest valid values: 2 or 4."), std::string::npos)
      << ragged.err;
  // A generation that outlives a step would be each process's own.
  auto spanning = test::run_orchard(
      c.launch(free_port(), grpo("spanning", 1, {"steps_per_generation=2"})),
      c.env);
  EXPECT_NE(spanning.exit_code, 0);
  EXPECT_NE(
      spanning.err.find("GRPO generates once per optimizer step"),
      std::string::npos)
      << spanning.err;
}

// device_batch_size=auto: each process plans its own memory and all take
// the smallest micro-batch (here rank 1 plans for 0.12 GB, rank 0 for 8 GB).
TEST(Distributed, AutoMicroBatchIsTheSmallestAnyRankPlanned) {
  REQUIRE_GLOO();
  Corpus c;
  auto args = c.train(
      "run",
      2,
      {"max_seq_len=64",
       "total_batch_size=2048",
       "depth=4",
       "device_batch_size=auto",
       "val_fraction=0.1"});
  const std::string port = std::to_string(free_port());
  std::map<std::string, std::string> env = c.env;
  env.insert(
      {{"WORLD_SIZE", "2"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", port}});
  auto env1 = env;
  env1.insert({{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"MEMORY_SIZE", "0.12"}});
  pid_t rank1 = test::spawn_orchard(args, env1, c.dir.file("rank1.log"));
  env.insert({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"MEMORY_SIZE", "8"}});
  auto r0 = test::run_orchard(args, env);
  EXPECT_EQ(test::wait_child(rank1), 0)
      << test::read_text(c.dir.file("rank1.log"));
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  // Alone, rank 0 takes all its 16 rows at once (its plan line says so);
  // together both take rank 1's smaller choice.
  EXPECT_NE(
      r0.out.find("Another process planned a smaller micro-batch, so "
                  "every process takes "),
      std::string::npos)
      << r0.out;
  const size_t at = r0.out.find("Batch: ");
  ASSERT_NE(at, std::string::npos) << r0.out;
  const int taken = std::stoi(r0.out.substr(at + 7));
  EXPECT_LT(taken, 16) << r0.out;
  EXPECT_NE(
      r0.out.find("every process takes " + std::to_string(taken)),
      std::string::npos)
      << r0.out;
  EXPECT_NE(
      r0.out.find(
          std::to_string(16 / taken) +
          " accumulation step(s) on each of 2 processes"),
      std::string::npos)
      << r0.out;
}

// ZeRO-1 (zero_stage=1): each rank steps its share of the parameters
// (Muon's matrices whole, AdamW's split by elements) and keeps only that
// share's optimizer state; the checkpoint holds the whole state, the same
// as one process's, so a run resumes with or without sharding, on another
// number of processes.
TEST(Distributed, ShardedOptimizerStateTrainsWhatOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  auto one = test::run_orchard(c.train("one", 6, {"save_every=3"}), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  auto two = test::run_orchard(
      c.launch(
          free_port(), c.train("two", 6, {"save_every=3", "zero_stage=1"})),
      c.env);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  // Rank 0 steps part of the values, not all, not none.
  const auto [mine, all] = values_rank0_steps(two.out, 2);
  ASSERT_GT(all, 0) << two.out;
  EXPECT_GT(mine, all / 4) << two.out;
  EXPECT_LT(mine, 3 * all / 4) << two.out;
  EXPECT_NE(two.out.find("reduce-scattered"), std::string::npos) << two.out;
  // The embedding is not sharded: every rank steps it whole (here its
  // gradient is all-reduced: more rows a rank than the vocabulary's; its
  // moments are whole in the checkpoint below all the same).
  EXPECT_NE(
      two.out.find("every rank steps the embedding's "), std::string::npos)
      << two.out;
  // The regions are balanced: next to no padding is sent.
  const size_t padding = two.out.find(" % of the buckets is padding");
  ASSERT_NE(padding, std::string::npos) << two.out;
  const size_t number = two.out.rfind(", ", padding);
  ASSERT_NE(number, std::string::npos) << two.out;
  EXPECT_LT(std::stod(two.out.substr(number + 2, padding - number - 2)), 1.0)
      << two.out;

  EXPECT_LT(max_difference(c.weights("one", 6), c.weights("two", 6)), 2e-4);
  // The gathered state is the unsharded one: every tensor, its shape, its
  // values to float rounding (moments of very different sizes: relative
  // to each tensor's largest value).
  auto state = [&](const std::string& run) {
    return safetensors::load(
        c.dir.file(run + "/checkpoints/step_000006/optimizer.safetensors"));
  };
  const auto s1 = state("one"), s2 = state("two");
  int compared = 0;
  for (const auto& [name, t] : s1) {
    if (name.rfind("rng.", 0) == 0)
      continue; // each process's own generators
    ASSERT_TRUE(s2.count(name)) << name;
    const auto& u = s2.at(name);
    ASSERT_EQ(t.sizes(), u.sizes()) << name;
    const double scale = t.abs().max().item<double>();
    EXPECT_LE(
        (t.to(torch::kFloat64) - u.to(torch::kFloat64))
            .abs()
            .max()
            .item<double>(),
        1e-3 * scale + 1e-9)
        << name;
    ++compared;
  }
  EXPECT_GT(compared, 6);

  // A run resumed from another's step 3 on `processes` ends at one
  // process's step 6 and says what it converted.
  auto resume = [&](const std::string& run,
                    const std::string& from,
                    int processes,
                    std::vector<std::string> extra,
                    const std::string& said) {
    extra.push_back("resume=" + c.dir.file(from + "/checkpoints/step_000003"));
    auto args = c.train(run, 6, extra);
    auto r = test::run_orchard(
        processes == 1 ? args : c.launch(free_port(), args), c.env);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(said), std::string::npos) << r.out;
    EXPECT_LT(max_difference(c.weights("one", 6), c.weights(run, 6)), 2e-4);
  };
  // One process's checkpoint on two (the data position converted),
  // unsharded ...
  resume(
      "resumed",
      "one",
      2,
      {},
      "Resuming with 2 process(es) where the checkpoint's run had 1");
  // ... and sharded (the state re-split) ...
  resume(
      "split",
      "one",
      2,
      {"zero_stage=1"},
      "The checkpoint was written by 1 process(es); this run has 2, each "
      "taking its share of the checkpoint's optimizer state (zero_stage=1)");
  // ... and the sharded run's on one process (the state put together;
  // zero_stage=1 there is said to change nothing).
  resume(
      "joined",
      "two",
      1,
      {"zero_stage=1"},
      "The checkpoint was written by 2 process(es), each keeping its share "
      "of the optimizer state; this run has 1, with all of the optimizer "
      "state");
  EXPECT_NE(
      test::read_text(c.dir.file("joined/train.log"))
          .find("with one process it changes nothing"),
      std::string::npos);
  // A control: the last 3 steps moved the weights by far more than the
  // tolerance above.
  EXPECT_GT(max_difference(c.weights("one", 3), c.weights("joined", 6)), 1e-3);
}

// LoRA on the fixture Llama: two ranks (each half of the step's rows) and
// three train the adapter one process trains with the whole step.
TEST(Distributed, TwoAndThreeProcessesTrainTheLoraAdapterOneProcessTrains) {
  REQUIRE_GLOO();
  Corpus c;
  std::string chats;
  const char* words[] = {"river", "mountain", "fox", "noun", "cloud"};
  for (int i = 0; i < 40; ++i)
    chats += std::string("{\"messages\": [{\"role\": \"user\", ") +
        "\"content\": \"what is a " + words[i % 5] + "?\"}, " +
        "{\"role\": \"assistant\", \"content\": \"a " + words[i % 5] +
        " is a thing number " + std::to_string(i) + ".\"}]}\n";
  const std::string data = c.dir.write("chat.jsonl", chats);
  auto args = [&](const std::string& run) {
    return std::vector<std::string>{
        "train",
        "stage=lora",
        "model=" + std::string(ORCHARD_FIXTURES) + "/hf/llama",
        "data=" + data,
        "max_steps=4",
        "max_seq_length=64",
        "total_batch_size=512", // 8 rows: 4 on each of two ranks
        "per_device_train_batch_size=2",
        "lora.r=4",
        "lora.alpha=8",
        "lora.dropout=0",
        "learning_rate=5e-3",
        "save_steps=2",
        "eval_steps=0",
        "run_dir=" + c.dir.file(run),
        "--device",
        "cpu"};
  };
  auto one = test::run_orchard(args("one"), c.env);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  auto two = test::run_orchard(c.launch(free_port(), args("two")), c.env);
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NE(
      two.out.find("2 accumulation step(s) x 2 processes"), std::string::npos)
      << two.out;
  auto a =
      safetensors::load(c.dir.file("one/adapter/adapter_model.safetensors"));
  auto b =
      safetensors::load(c.dir.file("two/adapter/adapter_model.safetensors"));
  EXPECT_LT(max_difference(a, b), 1e-4);
  // A control: one process with a rank's half of the rows ends elsewhere.
  auto half_args = args("half");
  std::replace(
      half_args.begin(),
      half_args.end(),
      std::string("total_batch_size=512"),
      std::string("total_batch_size=256"));
  auto half = test::run_orchard(half_args, c.env);
  ASSERT_EQ(half.exit_code, 0) << half.err;
  const double control = max_difference(
      safetensors::load(c.dir.file("half/adapter/adapter_model.safetensors")),
      b);
  std::printf(
      "LoRA: two ranks vs one process %.3g; vs half the rows %.3g\n",
      max_difference(a, b),
      control);
  EXPECT_GT(control, 1e-3);

  // Three ranks, 12 rows a step (2 a micro-step, 2 micro-steps each), 3
  // steps: still within the first epoch of 40 conversations (at an
  // epoch's end the last, short micro-step pads a world's worth of rows,
  // so another number of ranks pads differently there).
  auto twelve = [&](const std::string& run) {
    auto a = args(run);
    std::replace(
        a.begin(),
        a.end(),
        std::string("total_batch_size=512"),
        std::string("total_batch_size=768"));
    std::replace(
        a.begin(),
        a.end(),
        std::string("max_steps=4"),
        std::string("max_steps=3"));
    return a;
  };
  auto one12 = test::run_orchard(twelve("one12"), c.env);
  ASSERT_EQ(one12.exit_code, 0) << one12.out << one12.err;
  auto three = test::run_orchard(
      c.launch(free_port(), twelve("three"), /*processes=*/3), c.env);
  ASSERT_EQ(three.exit_code, 0) << three.out << three.err;
  EXPECT_NE(
      three.out.find("2 accumulation step(s) x 3 processes"), std::string::npos)
      << three.out;
  EXPECT_LT(
      max_difference(
          safetensors::load(
              c.dir.file("one12/adapter/adapter_model.safetensors")),
          safetensors::load(
              c.dir.file("three/adapter/adapter_model.safetensors"))),
      1e-4);

  // Full fine-tuning with 8-bit moments and the state sharded: 8-bit
  // tensors are stepped whole by one rank each (their blocks), and the
  // checkpoint holds every one of them.
  auto full = [&](const std::string& run) {
    auto a = args(run);
    std::replace(
        a.begin(),
        a.end(),
        std::string("stage=lora"),
        std::string("stage=full"));
    a.push_back("optim=adamw_8bit");
    a.push_back("learning_rate=1e-3");
    return a;
  };
  auto full_one = test::run_orchard(full("full_one"), c.env);
  ASSERT_EQ(full_one.exit_code, 0) << full_one.out << full_one.err;
  auto full_args = full("full_two");
  full_args.push_back("zero_stage=1");
  auto full_two = test::run_orchard(c.launch(free_port(), full_args), c.env);
  ASSERT_EQ(full_two.exit_code, 0) << full_two.out << full_two.err;
  EXPECT_NE(full_two.out.find(" whole)"), std::string::npos) << full_two.out;
  auto checkpoint = [&](const std::string& run, const char* file) {
    return safetensors::load(
        c.dir.file(run + "/checkpoints/step_000004/" + file));
  };
  EXPECT_LT(
      max_difference(
          checkpoint("full_one", "model.safetensors"),
          checkpoint("full_two", "model.safetensors")),
      1e-4);
  const auto s1 = checkpoint("full_one", "optimizer.safetensors");
  const auto s2 = checkpoint("full_two", "optimizer.safetensors");
  int codes = 0;
  for (const auto& [name, t] : s1)
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".q8") == 0) {
      ASSERT_TRUE(s2.count(name)) << name;
      ASSERT_EQ(t.sizes(), s2.at(name).sizes()) << name;
      ++codes;
    }
  EXPECT_GT(codes, 4);
  // The adapter moved: its B matrices start at zero.
  double moved = 0;
  for (const auto& [name, t] : b)
    if (name.find("lora_B") != std::string::npos)
      moved = std::max(moved, t.abs().max().item<double>());
  EXPECT_GT(moved, 1e-3);
}

// SIGKILL of one rank: `orchard launch` says which rank died and stops the
// other; a relaunch resumes from the last checkpoint and ends with the
// same weights, bit for bit, as a launch never interrupted.
// A rank killed, and a Ctrl-C to the launcher: both runs, launched again,
// end with the weights of one never stopped.
// The pid of the process `launcher` started as rank `rank` (its RANK), or
// -1.
pid_t rank_under(pid_t launcher, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != launcher)
      continue;
    const std::string environ =
        test::read_text((e.path() / "environ").string());
    if (environ.find('\0' + ("RANK=" + std::to_string(rank)) + '\0') !=
        std::string::npos)
      return std::stoi(pid);
  }
  return -1;
}

// Waits up to `seconds` for a child; its exit code as wait_child gives it,
// or -1 if it was still running (then killed with SIGKILL and reaped).
int wait_child_for(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 10; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGKILL);
  test::wait_child(pid);
  return -1;
}

// Waits up to two minutes for `run` to hold a checkpoint at `step` or
// later.
bool wait_for_checkpoint(const std::string& run, int64_t step) {
  for (int i = 0; i < 12000; ++i) {
    for (const auto& [s, d] : runs::list_checkpoints(run))
      if (s >= step)
        return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// torchrun's own restarts (`--max_restarts`): its agent starts both ranks
// again with TORCHELASTIC_RESTART_COUNT=1 under a new rendezvous prefix,
// and they resume from the newest checkpoint although the command says
// resume=never.
TEST(Distributed, TorchrunRestartsResumeFromTheNewestCheckpoint) {
  REQUIRE_GLOO();
  if (std::system("command -v torchrun >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "torchrun is not installed (Debian: python3-torch)";
  Corpus c;
  auto train = c.train("restarted", 300, {"save_every=20"});
  train.push_back("resume=never");
  const std::string log = c.dir.file("torchrun.log");
  const std::string cmd =
      torchrun_command(c, {"--max_restarts", "1"}, train, log);
  const pid_t torchrun = ::fork();
  if (torchrun == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_TRUE(wait_for_checkpoint(c.dir.file("restarted"), 40))
      << test::read_text(log);
  const pid_t rank = rank_under(torchrun, 1);
  ASSERT_GT(rank, 0) << "no rank 1 under torchrun";
  ::kill(rank, SIGKILL);
  ASSERT_EQ(wait_child_for(torchrun, 300), 0) << test::read_text(log);
  expect_said(
      test::read_text(log),
      {kRestartResumes, "Resuming from", "Done: step 300"});
}

// Ctrl-C to the launcher while its ranks are still starting (before their
// handler is installed, so SIGINT ends them as it ends any program): a
// stop, as later in the run, not a rank's failure.
TEST(Distributed, ACtrlCWhileTheRanksStartIsAStopNotAFailure) {
  REQUIRE_GLOO();
  Corpus c;
  const std::string log = c.dir.file("early.log");
  const pid_t launcher =
      test::spawn_orchard(c.launch(0, c.train("early", 100000)), c.env, log);
  bool started = false;
  for (int i = 0; i < 300 && !started; ++i) {
    started = rank_under(launcher, 1) > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(started) << test::read_text(log);
  ::kill(launcher, SIGINT);
  EXPECT_EQ(wait_child_for(launcher, 120), 128 + SIGINT)
      << test::read_text(log);
  const std::string said = test::read_text(log);
  expect_said(
      said,
      {"orchard launch: stopped by SIGINT (Ctrl-C), passed on to every rank; "
       "all 2 have exited."});
  EXPECT_EQ(said.find("stopping the other rank(s)"), std::string::npos) << said;
  EXPECT_EQ(said.find("was killed by signal"), std::string::npos) << said;
}

TEST(Distributed, KilledOrInterruptedRunsResumeExactly) {
  REQUIRE_GLOO();
  Corpus c;
  const int steps = 200; // rank 1 dies near step 40: 160 steps to spare
  auto args = [&](const std::string& run) {
    return c.train(
        run, steps, {"save_every=20", "total_batch_size=512", "depth=2"});
  };
  auto ref = test::run_orchard(c.launch(free_port(), args("ref")), c.env);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;

  // Starts the run in the background and returns once it has saved a
  // checkpoint past the first.
  auto start_until_mid_run = [&](const std::string& run) {
    const std::string log = c.dir.file(run + ".log");
    pid_t launcher =
        test::spawn_orchard(c.launch(free_port(), args(run)), c.env, log);
    bool mid_run = false;
    for (int i = 0; i < 6000 && !mid_run; ++i) {
      for (const auto& [s, d] : runs::list_checkpoints(c.dir.file(run)))
        mid_run = mid_run || s >= 40;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(mid_run) << test::read_text(log);
    return std::make_pair(launcher, log);
  };
  auto resumes_to_the_reference = [&](const std::string& run) {
    auto again = test::run_orchard(c.launch(free_port(), args(run)), c.env);
    ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
    EXPECT_NE(again.out.find("Resuming from"), std::string::npos) << again.out;
    auto want = c.weights("ref", steps), got = c.weights(run, steps);
    for (const auto& [name, t] : want)
      EXPECT_TRUE(torch::equal(t, got.at(name))) << run << ": " << name;
  };

  // Rank 1 (the launcher's child whose RANK is 1) killed.
  const auto [launcher, log] = start_until_mid_run("killed");
  const pid_t rank1 = rank_under(launcher, 1);
  ASSERT_GT(rank1, 0) << "no rank 1 under the launcher";
  ::kill(rank1, SIGKILL);
  const int code = test::wait_child(launcher);
  EXPECT_NE(code, 0);
  const std::string out = test::read_text(log);
  EXPECT_NE(out.find("rank 1 was killed by signal 9"), std::string::npos)
      << out;
  EXPECT_NE(out.find("stopping the other rank(s)"), std::string::npos) << out;
  // SIGKILL leaves no error of its own: the last line says so, and does
  // not point above.
  EXPECT_NE(
      out.find("it printed nothing: stopped from outside"), std::string::npos)
      << out;

  resumes_to_the_reference("killed");

  // Ctrl-C to the launcher alone: passed on, every rank finishes its step,
  // rank 0 saves, and the launcher exits as one process would (128 +
  // SIGINT), taking no rank's stop for a failure (none is sent SIGTERM).
  const auto [stopped, stopped_log] = start_until_mid_run("interrupted");
  ::kill(stopped, SIGINT);
  EXPECT_EQ(test::wait_child(stopped), 128 + SIGINT);
  const std::string said = test::read_text(stopped_log);
  EXPECT_NE(
      said.find("Stopped by SIGINT (Ctrl-C) after step"), std::string::npos)
      << said;
  EXPECT_NE(
      said.find("orchard launch: stopped by SIGINT (Ctrl-C), passed on to "
                "every rank; all 2 have exited."),
      std::string::npos)
      << said;
  EXPECT_EQ(said.find("stopping the other rank(s)"), std::string::npos) << said;
  EXPECT_EQ(said.find("SIGTERM"), std::string::npos) << said;
  resumes_to_the_reference("interrupted");

  // With --max-restarts the launcher starts the ranks again itself: they
  // resume from the newest checkpoint, resume=never notwithstanding, and
  // the run ends with the never-stopped run's weights.
  {
    const std::string log = c.dir.file("restarted.log");
    std::vector<std::string> a = {"launch", "--max-restarts", "1"};
    for (const auto& x : c.launch(free_port(), args("restarted")))
      if (x != "launch")
        a.push_back(x);
    a.push_back("resume=never");
    const pid_t restarting = test::spawn_orchard(a, c.env, log);
    ASSERT_TRUE(wait_for_checkpoint(c.dir.file("restarted"), 40))
        << test::read_text(log);
    const pid_t rank = rank_under(restarting, 1);
    ASSERT_GT(rank, 0);
    ::kill(rank, SIGKILL);
    ASSERT_EQ(wait_child_for(restarting, 300), 0) << test::read_text(log);
    expect_said(
        test::read_text(log),
        {"orchard launch: rank 1 was killed by signal 9",
         "orchard launch: restarting the ranks (restart 1 of 1, "
         "--max-restarts); they resume from the run's newest checkpoint.",
         kRestartResumes,
         "Resuming from",
         "orchard launch: the run finished after 1 restart(s)."});
    auto want = c.weights("ref", steps), got = c.weights("restarted", steps);
    for (const auto& [name, t] : want)
      EXPECT_TRUE(torch::equal(t, got.at(name))) << "restarted: " << name;
  }
}

// Two nodes (two `orchard launch --nnodes 2` groups on this host): starts
// both on a long run and returns their launchers once it has saved a
// checkpoint past step 20. Node 0 serves the rendezvous.
struct TwoNodes {
  pid_t node[2] = {-1, -1};
  std::string log[2];
};
TwoNodes start_two_nodes(
    const Corpus& c,
    const std::string& run,
    const std::map<std::string, std::string>& env,
    const std::vector<std::string>& launch_options = {}) {
  const int port = free_port();
  TwoNodes t;
  for (int r : {1, 0}) {
    t.log[r] = c.dir.file(run + "-node" + std::to_string(r) + ".log");
    t.node[r] = test::spawn_orchard(
        Corpus::node_launch(
            r,
            port,
            c.train(run, 100000, {"save_every=20", "device_batch_size=4"}),
            launch_options),
        env,
        t.log[r]);
  }
  bool mid_run = false;
  for (int i = 0; i < 6000 && !mid_run; ++i) {
    for (const auto& [step, dir] : runs::list_checkpoints(c.dir.file(run)))
      mid_run = mid_run || step >= 20;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(mid_run) << test::read_text(t.log[0]);
  return t;
}

// A rank failing on one node stops the other node's ranks at once, even
// one that is not in a collective to notice (here stopped with SIGSTOP, as
// a rank hangs; under NCCL a rank waits in its collective up to a 10-minute
// timeout): node 1's launcher says so in the store node 0's serves, and
// node 0's launcher reads it within a second.
TEST(Distributed, ARankFailingOnOneNodeStopsEveryNode) {
  REQUIRE_GLOO();
  Corpus c;
  TwoNodes t = start_two_nodes(c, "failing", c.env);
  const pid_t rank0 = rank_under(t.node[0], 0),
              rank1 = rank_under(t.node[1], 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ::kill(rank0, SIGSTOP);
  ::kill(rank1, SIGKILL);
  EXPECT_EQ(wait_child_for(t.node[1], 120), 128 + SIGKILL)
      << test::read_text(t.log[1]);
  // Node 0's rank never answers SIGTERM (it is stopped): SIGKILL after the
  // grace. Left alone, node 0 would wait for it for ever.
  const int code = wait_child_for(t.node[0], 120);
  if (code < 0)
    ::kill(rank0, SIGKILL); // its launcher, killed, takes it along
  EXPECT_EQ(code, 128 + SIGKILL) << test::read_text(t.log[0]);
  const std::string said = test::read_text(t.log[0]);
  EXPECT_NE(
      said.find("orchard launch: rank 1 (node 1) was killed by signal 9 "
                "(Killed); stopping this node's rank(s)."),
      std::string::npos)
      << said;
  EXPECT_NE(said.find("its error is in that node's output"), std::string::npos)
      << said;
  // The checkpoints written before are intact.
  for (const auto& [step, dir] : runs::list_checkpoints(c.dir.file("failing")))
    EXPECT_NO_THROW(runs::load_checkpoint(dir)) << dir;
}

// A node that falls silent (its launcher stopped here; its machine or
// network gone in life) is noticed by node 0's launcher, which stops its
// own ranks: they finish their step with the silent node's ranks (still
// running here), and rank 0 saves.
TEST(Distributed, ASilentNodeStopsTheOthersWhoSave) {
  REQUIRE_GLOO();
  Corpus c;
  auto env = c.env;
  env["ORCHARD_TEST_NODE_SILENCE_S"] = "3";
  TwoNodes t = start_two_nodes(c, "silent", env);
  ::kill(t.node[1], SIGSTOP);
  const int code = wait_child_for(t.node[0], 120);
  ::kill(t.node[1], SIGCONT);
  EXPECT_EQ(code, 1) << test::read_text(t.log[0]);
  const std::string said = test::read_text(t.log[0]);
  EXPECT_NE(
      said.find("orchard launch: node 1's launcher has not been heard from "
                "for 3 s"),
      std::string::npos)
      << said;
  EXPECT_NE(said.find("Stopped by SIGTERM after step"), std::string::npos)
      << said;
  const auto saved = runs::list_checkpoints(c.dir.file("silent"));
  ASSERT_FALSE(saved.empty());
  EXPECT_NO_THROW(runs::load_checkpoint(saved.back().second));
  // Node 1's rank stopped with node 0's, for the signal node 0's rank was
  // sent; node 1's launcher, woken, finds them ended and node 0 gone.
  EXPECT_EQ(wait_child_for(t.node[1], 120), 128 + SIGTERM)
      << test::read_text(t.log[1]);
  EXPECT_NE(
      test::read_text(t.log[1]).find(
          "orchard launch: the ranks stopped for SIGTERM, sent to a rank "
          "itself or to another node; every rank stopped after the same "
          "step, rank 0 saving a checkpoint; it has exited."),
      std::string::npos)
      << test::read_text(t.log[1]);
}

// --max-restarts on two nodes: a rank failing on node 1 makes both
// launchers start their ranks again, which meet in a new rendezvous and
// resume from the newest checkpoint; a failure once the restarts are used
// up ends the run on both nodes, saying so, its checkpoints intact.
TEST(Distributed, BothNodesRestartTheirRanksUntilTheRestartsAreUsedUp) {
  REQUIRE_GLOO();
  Corpus c;
  TwoNodes t = start_two_nodes(c, "restarts", c.env, {"--max-restarts=1"});
  const pid_t first = rank_under(t.node[1], 1);
  ASSERT_GT(first, 0);
  ::kill(first, SIGKILL);
  // The second attempt trains on past the first's newest checkpoint.
  bool restarted = false;
  for (int i = 0; i < 1200 && !restarted; ++i) {
    restarted = test::read_text(t.log[0]).find("restarting every node's") !=
        std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(restarted) << test::read_text(t.log[0]);
  int64_t newest = 0;
  for (const auto& [step, dir] : runs::list_checkpoints(c.dir.file("restarts")))
    newest = std::max(newest, step);
  ASSERT_TRUE(wait_for_checkpoint(c.dir.file("restarts"), newest + 20))
      << test::read_text(t.log[0]) << test::read_text(t.log[1]);
  pid_t second = -1;
  for (int i = 0; i < 100 && second <= 0; ++i) {
    second = rank_under(t.node[0], 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(second, 0);
  ::kill(second, SIGKILL);
  EXPECT_EQ(wait_child_for(t.node[0], 120), 128 + SIGKILL)
      << test::read_text(t.log[0]);
  // Node 1's rank either fails in its next collective (exit 1, a failure
  // of its own) or is stopped by its launcher, which read node 0's first.
  const int node1 = wait_child_for(t.node[1], 120);
  EXPECT_TRUE(node1 == 1 || node1 == 128 + SIGKILL)
      << node1 << "\n"
      << test::read_text(t.log[1]);
  for (const std::string& log : t.log)
    expect_said(
        test::read_text(log),
        {"orchard launch: restarting every node's ranks (restart 1 of 1, "
         "--max-restarts)",
         "orchard launch: not restarted: --max-restarts 1 used up."});
  EXPECT_NE(test::read_text(t.log[0]).find("Resuming from"), std::string::npos);
  for (const auto& [step, dir] : runs::list_checkpoints(c.dir.file("restarts")))
    EXPECT_NO_THROW(runs::load_checkpoint(dir)) << dir;
}

// `orchard pipeline` under the launcher: base, mid and sft each trained on
// two processes, ending where one process ends, its plan printed once.
TEST(Distributed, TwoProcessesRunThePipelineOneProcessRuns) {
  REQUIRE_GLOO();
  Corpus c;
  std::string chats;
  for (int i = 0; i < 80; ++i)
    chats +=
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What "
        "is number " +
        std::to_string(i) +
        "?\"}, {\"role\": \"assistant\", \"content\": \"It is " +
        std::to_string(i * 7 % 97) + ".\"}]}\n";
  c.dir.write("chats/c.jsonl", chats);
  std::filesystem::create_directories(c.dir.file("work"));
  auto pipeline = [&](const std::string& run) {
    return std::vector<std::string>{
        "pipeline",
        "--device",
        "cpu",
        "data_paths=[" + c.dir.file("corpus") + "]",
        "chat_data=[" + c.dir.file("chats") + "]",
        "depth=1",
        "max_seq_len=32",
        "total_batch_size=256",
        "device_batch_size=2",
        "num_iterations=4",
        "mid_iterations=2",
        "sft_iterations=2",
        "eval_every=0",
        "eval_tokens=256",
        "sample_every=0",
        "save_every=0",
        "run=" + run};
  };
  auto one = test::run_orchard(pipeline("one"), c.env, c.dir.file("work"));
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const int port = free_port();
  auto two = test::run_orchard(
      c.launch(port, pipeline("two")), c.env, c.dir.file("work"));
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  // Training further is started as this pipeline was.
  EXPECT_NE(
      two.out.find(
          std::string(ORCHARD_BIN) +
          " launch --nproc-per-node 2 --master-port " + std::to_string(port) +
          " -- pipeline mid_iterations=N"),
      std::string::npos)
      << two.out;
  const size_t plan = two.out.find("Pipeline for two:");
  EXPECT_NE(plan, std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("Pipeline for two:", plan + 1), std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("The pipeline is complete"), std::string::npos)
      << two.out;
  for (const auto& [stage, step] : std::vector<std::pair<std::string, int>>{
           {"base", 4}, {"mid", 2}, {"sft", 2}}) {
    char name[64];
    std::snprintf(name, sizeof name, "/checkpoints/step_%06d", step);
    auto weights = [&](const std::string& run) {
      return safetensors::load(c.dir.file(
          "work/runs/" + stage + "/" + run + name + "/model.safetensors"));
    };
    EXPECT_LT(max_difference(weights("one"), weights("two")), 2e-4) << stage;
  }
}

// Whether `err` holds `text` marked as one of two ranks' output: the
// launcher stops the other rank once the first has exited, so which rank's
// message comes first is a race.
bool from_a_rank(const std::string& err, const std::string& text) {
  return err.find("[rank 0] " + text) != std::string::npos ||
      err.find("[rank 1] " + text) != std::string::npos;
}

TEST(Distributed, BadLaunchesSayWhatIsWrong) {
  REQUIRE_GLOO();
  Corpus c;
  // One rank of two started by hand with torchrun's variables (no
  // MASTER_ADDR where `addr` is empty).
  auto by_hand =
      [&](const std::string& rank, const std::string& addr, int port) {
        std::map<std::string, std::string> env = {
            {"ORCHARD_HOME", c.dir.file("home")},
            {"WORLD_SIZE", "2"},
            {"RANK", rank},
            {"MASTER_PORT", std::to_string(port)}};
        if (!addr.empty())
          env["MASTER_ADDR"] = addr;
        return test::run_orchard(c.train("x", 1), env);
      };
  // torchrun's variables half set.
  auto r = by_hand("0", "", 29555);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("MASTER_ADDR is not set"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("orchard launch"), std::string::npos) << r.err;

  // A rendezvous host this machine cannot resolve (".invalid" never is):
  // refused at once, by a rank and by the launcher, rather than retried
  // for the rendezvous's 300 s with a warning a second.
  const std::string cannot =
      " nosuchhost.invalid: this machine cannot resolve that host name (";
  r = by_hand("1", "nosuchhost.invalid", 29555);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_said(r.err, {"error: MASTER_ADDR" + cannot, "`getent hosts"});
  auto unknown_host = c.launch(free_port(), c.train("x", 1));
  unknown_host.insert(
      unknown_host.begin() + 1,
      {"--nnodes=2", "--node-rank=1", "--master-addr=nosuchhost.invalid"});
  r = test::run_orchard(unknown_host, c.env);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_said(r.err, {"error: --master-addr" + cannot});
  EXPECT_EQ(r.err.find("[c10d]"), std::string::npos) << r.err;

  // A batch two processes cannot split: 192 = 2 x 32 x 3.
  r = test::run_orchard(
      c.launch(free_port(), c.train("x", 1, {"total_batch_size=192"})), c.env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(from_a_rank(r.err, "error: ")) << r.err;
  EXPECT_NE(r.err.find("× world size"), std::string::npos) << r.err;
  // With restarts allowed, bad input is still not restarted: a restart
  // would only repeat it.
  auto restarts =
      c.launch(free_port(), c.train("x", 1, {"total_batch_size=192"}));
  restarts.insert(restarts.begin() + 1, {"--max-restarts", "3"});
  r = test::run_orchard(restarts, c.env);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(
      r.err.find("orchard launch: not restarted: the rank exited with code "
                 "2, Orchard's answer to bad input"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
  // A count of restarts out of range: refused before any process starts.
  r = test::run_orchard(
      {"launch", "--max-restarts", "-1", "--", "train", "--device", "cpu"},
      c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("--max-restarts: Value -1 not in range 0 to 1000"),
      std::string::npos)
      << r.err;

  // The averaging settings out of range: what is allowed, before any
  // process starts.
  r = test::run_orchard(c.train("x", 1, {"bucket_cap_mb=0"}), c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("config key 'bucket_cap_mb' (command line 'bucket_cap_mb=0'): "
                 "invalid value '0', expected a number >= 1"),
      std::string::npos)
      << r.err;
  r = test::run_orchard(c.train("x", 1, {"grad_reduce_dtype=float16"}), c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("invalid value 'float16', expected one of float32|bfloat16"),
      std::string::npos)
      << r.err;

  r = test::run_orchard(c.train("x", 1, {"grad_average=sm"}), c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("invalid value 'sm', expected one of "
                 "auto|nccl|copy_engines"),
      std::string::npos)
      << r.err;
  // The copy engines asked for where they cannot average: on the CPU
  // (Gloo; sharded or not, they reduce-scatter on CUDA), and with settings
  // that rule them out whatever the device. Refused by every rank, saying
  // why and what to set instead; the launcher stops the others once the
  // first has exited, so the message shown is whichever rank's came first.
  for (const auto& [extra, why] :
       std::vector<std::pair<std::string, std::string>>{
           {"zero_stage=0", "(they are on cpu, where Gloo sends them"},
           {"zero_stage=1", "(they are on cpu, where Gloo sends them"},
           {"grad_reduce_dtype=bfloat16",
            "(grad_reduce_dtype=bfloat16 sends them in bfloat16)"}}) {
    r = test::run_orchard(
        c.launch(
            free_port(), c.train("x", 1, {"grad_average=copy_engines", extra})),
        c.env);
    EXPECT_NE(r.exit_code, 0) << extra;
    EXPECT_NE(
        r.err.find(
            "grad_average=copy_engines: the copy engines cannot "
            "average these gradients " +
            why),
        std::string::npos)
        << extra << ": " << r.err;
    EXPECT_TRUE(from_a_rank(r.err, "error: grad_average=copy_engines"))
        << r.err;
    EXPECT_NE(r.err.find("grad_average=auto"), std::string::npos) << r.err;
  }

  // The measurement switch set to what it does not know: refused, not
  // read as "average everything" while saying otherwise.
  auto skip_env = c.env;
  skip_env["ORCHARD_TEST_SKIP_BUCKETS"] = "some";
  r = test::run_orchard(c.launch(free_port(), c.train("x", 1)), skip_env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(
      r.err.find("ORCHARD_TEST_SKIP_BUCKETS=some is not a setting"),
      std::string::npos)
      << r.err;

  // A port already taken by another program.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  const int taken = ntohs(a.sin_port);
  // The launcher serves the rendezvous: it says so before starting any
  // rank.
  r = test::run_orchard(c.launch(taken, c.train("x", 1)), c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find(
          "orchard launch cannot serve the rendezvous on port " +
          std::to_string(taken)),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the port is taken"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[rank 0]"), std::string::npos) << r.err;
  // Started by hand (or by torchrun without its agent's store), rank 0
  // serves the rendezvous itself, and says the same.
  r = by_hand("0", "127.0.0.1", taken);
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find(
          "rank 0 cannot serve the rendezvous at 127.0.0.1:" +
          std::to_string(taken)),
      std::string::npos)
      << r.err;

  // Two nodes started with different settings: refused by both ranks,
  // naming the key and each rank's value (left alone, Gloo aborted in the
  // first all-reduce of differently sized buckets).
  const int port = free_port();
  auto node = [&](int r, const std::string& depth) {
    return Corpus::node_launch(
        r, port, c.train("mixed", 1, {"depth=" + depth}));
  };
  pid_t node1 = test::spawn_orchard(node(1, "2"), c.env, c.dir.file("n1.log"));
  r = test::run_orchard(node(0, "1"), c.env);
  EXPECT_EQ(test::wait_child(node1), 2)
      << test::read_text(c.dir.file("n1.log"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (const std::string& said : {r.err, test::read_text(c.dir.file("n1.log"))})
    EXPECT_NE(
        said.find("error: the processes were started with different "
                  "settings: depth is 1 on rank 0 but 2 on rank 1."),
        std::string::npos)
        << said;

  // Two nodes' launchers started with other counts (ranks numbered from
  // them would never meet): node 1's launcher refuses before starting its
  // ranks, and node 0's stops its own, both with exit 2, naming the
  // setting and both values.
  const int port2 = free_port();
  auto counts = [&](int r, const std::string& nproc) {
    return Corpus::node_launch(
        r, port2, c.train("unlike", 1), {"--nproc-per-node=" + nproc});
  };
  pid_t unlike0 =
      test::spawn_orchard(counts(0, "1"), c.env, c.dir.file("u0.log"));
  r = test::run_orchard(counts(1, "2"), c.env);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(test::wait_child(unlike0), 2)
      << test::read_text(c.dir.file("u0.log"));
  const std::string unlike =
      "node 1's orchard launch was started with other settings than node "
      "0's: --nproc-per-node is 1 on node 0 but 2 on node 1";
  expect_said(r.err, {"error: " + unlike + ". Start every node's"});
  expect_said(
      test::read_text(c.dir.file("u0.log")),
      {"orchard launch: " + unlike + "; stopping this node's rank(s)."});

  // A node whose launcher never joins: node 0's launcher says which, and
  // how to start it, rather than its ranks timing out at the rendezvous.
  auto alone_env = c.env;
  alone_env["ORCHARD_TEST_NODE_JOIN_S"] = "2";
  const int port3 = free_port();
  r = test::run_orchard(
      Corpus::node_launch(0, port3, c.train("alone", 1)), alone_env);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_said(
      r.err,
      {"orchard launch: node 1's launcher has not joined the rendezvous at "
       "127.0.0.1:" +
           std::to_string(port3) + " within 2 s: start `",
       " launch --nnodes 2 --nproc-per-node 1 --max-restarts 0 --node-rank 1 "
       "--master-addr 127.0.0.1 --master-port " +
           std::to_string(port3) + " -- ...` there"});

  // An option launch does not have (or the command's, put before it).
  r = test::run_orchard(
      {"launch", "--nproc-per-node", "2", "--device", "cpu", "train"}, c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("'--device' is not an option of orchard launch (its "
                 "options: --nproc-per-node, --nnodes, --node-rank"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("goes after the command"), std::string::npos) << r.err;

  // Several nodes without node 0's address; a node number out of range.
  r = test::run_orchard(
      {"launch", "--nnodes", "2", "--", "train", "--device", "cpu"}, c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--nnodes 2 needs --master-addr"), std::string::npos)
      << r.err;
  r = test::run_orchard(
      {"launch",
       "--nnodes",
       "2",
       "--node-rank",
       "2",
       "--master-addr",
       "h0",
       "--",
       "train"},
      c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("--node-rank 2 is not below --nnodes 2"), std::string::npos)
      << r.err;
  r = test::run_orchard(
      {"launch", "--standalone", "--master-port", "29500", "--", "train"},
      c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("--standalone picks a free port itself"), std::string::npos)
      << r.err;
  r = test::run_orchard(
      {"launch", "--standalone", "--nnodes=2", "--master-addr=h0", "train"},
      c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("--standalone is one node on this host"), std::string::npos)
      << r.err;
  r = test::run_orchard(
      {"launch", "--nproc-per-node", "0", "--", "train"}, c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.err.find("--nproc-per-node '0' is not a number from 1 to 1024, `gpu`"),
      std::string::npos)
      << r.err;
  // One process per GPU asked for where there is none (CI's machine).
  if (torch::cuda::device_count() == 0) {
    r = test::run_orchard(
        {"launch", "--nproc_per_node", "gpu", "train", "--device", "cpu"},
        c.env);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(
        r.err.find("--nproc-per-node gpu: this machine has no CUDA GPU"),
        std::string::npos)
        << r.err;
  }

  // Nothing to launch, and a command launch does not start.
  r = test::run_orchard({"launch", "--nproc-per-node", "2"}, c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("after `--`"), std::string::npos) << r.err;
  r = test::run_orchard({"launch", "--", "generate"}, c.env);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not 'generate'"), std::string::npos) << r.err;
}

} // namespace
} // namespace orchard
