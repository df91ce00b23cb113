#include "core/doctor.h"
#include "core/blas_kernels.h"
#include "core/clock.h"

#include "core/error.h"
#include "core/torch_compat.h"
#include "core/version.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

namespace orchard {
namespace {

constexpr int64_t kMatmulSize = 1024;
constexpr double kMatmulMinSeconds = 0.25; // long enough to time reliably

// The tiny model of the step check. Deliberately plain: an embedding (index
// gather/scatter), two matrix products with a nonlinearity, cross-entropy
// (log-softmax), so a broken kernel on any of them shows up.
struct TinyNetImpl : torch::nn::Module {
  static constexpr int64_t kVocab = 64, kDim = 32, kHidden = 64;
  torch::nn::Embedding wte{nullptr};
  torch::nn::Linear fc{nullptr}, head{nullptr};
  TinyNetImpl() {
    wte = register_module("wte", torch::nn::Embedding(kVocab, kDim));
    fc = register_module("fc", torch::nn::Linear(kDim, kHidden));
    head = register_module("head", torch::nn::Linear(kHidden, kVocab));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    return head(torch::relu(fc(wte(ids)))); // (B, T, V)
  }
};
TORCH_MODULE(TinyNet);

struct StepResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> params; // after the AdamW step, on the CPU
};

StepResult tiny_step(const c10::Device& device) {
  torch::manual_seed(1234);
  TinyNet net;
  auto ids = torch::randint(0, TinyNetImpl::kVocab, {4, 16}, torch::kLong);
  auto targets = torch::randint(0, TinyNetImpl::kVocab, {4, 16}, torch::kLong);
  net->to(device);
  torch::optim::AdamW opt(
      net->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  auto logits = net->forward(ids.to(device));
  auto loss = torch::nn::functional::cross_entropy(
      logits.view({-1, TinyNetImpl::kVocab}), targets.to(device).view({-1}));
  opt.zero_grad();
  loss.backward();
  opt.step();
  StepResult r;
  r.loss = loss.detach().to(torch::kCPU);
  for (const auto& p : net->parameters())
    r.params.push_back(p.detach().to(torch::kCPU));
  return r;
}

void add(DoctorReport& r, std::string what, std::string fix, bool blocking) {
  r.problems.push_back({std::move(what), std::move(fix), blocking});
}

} // namespace

std::string detect_blas() {
  std::ifstream maps("/proc/self/maps");
  if (!maps)
    return "built into libtorch (Accelerate or MKL)";
  // libblas.so.3 is what libtorch links; on Debian it resolves to whichever
  // implementation update-alternatives selected, so its real path decides.
  // libopenblas may be mapped too (through liblapack) without serving BLAS.
  std::string line, blas, openblas, mkl;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos)
      continue;
    std::string path = line.substr(slash);
    if (path.find("libblas.so") != std::string::npos)
      blas = path;
    else if (path.find("libopenblas") != std::string::npos)
      openblas = path;
    else if (path.find("libmkl") != std::string::npos)
      mkl = path;
  }
  auto flavour = [](const std::string& p) {
    return p.find("openmp") != std::string::npos ? "openmp"
        : p.find("pthread") != std::string::npos ? "pthread"
                                                 : "serial";
  };
  // OpenBLAS's kernels, picked by the CPU's model (core/blas_kernels.h).
  const std::string core =
      blas_core().empty() ? "" : ", " + blas_core() + " kernels";
  if (!blas.empty())
    return blas.find("openblas") != std::string::npos
        ? "OpenBLAS (" + std::string(flavour(blas)) + ", " + blas + core + ")"
        : "reference BLAS (" + blas + ")";
  if (!openblas.empty())
    return "OpenBLAS (" + std::string(flavour(openblas)) + ", " + openblas +
        core + ")";
  if (!mkl.empty())
    return "MKL (" + mkl + ")";
  return "built into libtorch (MKL)";
}

double measure_matmul_gflops(const c10::Device& device) {
  torch::NoGradGuard no_grad;
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto a = torch::randn({kMatmulSize, kMatmulSize}, opts);
  auto b = torch::randn({kMatmulSize, kMatmulSize}, opts);
  for (int i = 0; i < 2; ++i) // warm-up: kernels, thread pools, caches
    a.mm(b);
  compat::synchronize(device);
  int iters = 0;
  double start = now_s(), elapsed = 0;
  do {
    a.mm(b);
    ++iters;
    if (iters % 4 == 0 || !device.is_cpu())
      compat::synchronize(device);
    elapsed = now_s() - start;
  } while (elapsed < kMatmulMinSeconds && iters < 10000);
  compat::synchronize(device);
  elapsed = now_s() - start;
  double flops = 2.0 * kMatmulSize * kMatmulSize * kMatmulSize * iters;
  return flops / elapsed / 1e9;
}

void check_training_step(DeviceCheck& check) {
  try {
    StepResult cpu = tiny_step(torch::kCPU);
    StepResult dev = tiny_step(check.info.device);
    double diff = (cpu.loss - dev.loss).abs().max().item<double>();
    for (size_t i = 0; i < cpu.params.size(); ++i)
      diff = std::max(
          diff, (cpu.params[i] - dev.params[i]).abs().max().item<double>());
    check.step_ran = std::isfinite(cpu.loss.item<double>());
    check.max_diff_vs_cpu = diff;
  } catch (const std::exception& e) {
    check.step_ran = false;
    std::string msg = e.what();
    check.error = msg.substr(0, msg.find('\n'));
  }
}

void diagnose(DoctorReport& r, const std::string& requested) {
  const MachineFacts& m = r.machine;
  r.problems.clear();
  r.ready.reset();

  if (m.rosetta)
    add(r,
        "Orchard runs under Rosetta 2 (an x86_64 build on Apple Silicon): the "
        "GPU (MPS) is unreachable and the CPU path is 2-3x slower.",
        "install the arm64 Homebrew in /opt/homebrew, then rebuild natively: "
        "`rm -rf build && arch -arm64 ./orchard.sh build`",
        true);
  else if (m.os == "macos" && m.arch == "arm64" && !m.mps_available)
    add(r,
        "No MPS device: this libtorch cannot use the Apple GPU, so training "
        "would run on the CPU.",
        m.mps_built
            ? "update macOS to 12.3 or later"
            : "install Homebrew's pytorch (built with MPS) and rebuild: "
              "`brew install pytorch && ./orchard.sh build`",
        true);

  std::string try_device;
  for (const auto& d : r.devices) {
    if (!d.error.empty() || !d.step_ran)
      add(r,
          "The training step failed on " + d.info.name + ": " +
              (d.error.empty() ? "the loss was not finite" : d.error),
          d.info.kind == "mps"
              ? "set PYTORCH_ENABLE_MPS_FALLBACK=1 for missing operations, "
                "and update macOS and PyTorch"
              : "check the driver (`nvidia-smi`) and that libtorch matches it",
          true);
    else if (d.max_diff_vs_cpu > kStepTolerance)
      add(r,
          "The training step on " + d.info.name +
              " differs from the CPU's by " +
              std::to_string(d.max_diff_vs_cpu) + " (allowed " +
              std::to_string(kStepTolerance) + ")",
          "a kernel gives wrong results: update the driver and PyTorch, and "
          "report it with this output",
          true);
  }

  // The device training would use, unless something above makes it unusable.
  DeviceInfo chosen;
  try {
    chosen = resolve_device(requested, m);
  } catch (const UserError& e) {
    add(r, e.what(), "pick one of the available devices with --device", true);
    return;
  }
  const DeviceCheck* cpu = nullptr;
  for (const auto& d : r.devices)
    if (d.info.kind == "cpu")
      cpu = &d;
  if (cpu && cpu->matmul_gflops && *cpu->matmul_gflops < kSlowCpuGflops) {
    std::ostringstream what;
    what.precision(3);
    what << "Matrix products on the CPU run at " << *cpu->matmul_gflops
         << " GFLOP/s (" << r.blas
         << "); OpenBLAS runs them 20-40x faster, so training on the CPU "
            "would crawl.";
    add(r,
        what.str(),
        "install the OpenMP OpenBLAS and make it the system BLAS: "
        "`sudo apt-get install libopenblas0-openmp && sudo update-alternatives "
        "--set libblas.so.3-$(uname -m)-linux-gnu "
        "/usr/lib/$(uname -m)-linux-gnu/openblas-openmp/libblas.so.3` "
        "(`./orchard.sh setup` does both)",
        chosen.kind == "cpu");
  }
  for (const auto& p : r.problems)
    if (p.blocking)
      return;
  r.ready = chosen;
}

DoctorReport run_doctor(
    const MachineFacts& machine,
    const std::string& requested) {
  DoctorReport r;
  r.machine = machine;
  r.blas = detect_blas();
  std::vector<DeviceInfo> targets;
  for (size_t i = 0; i < machine.cuda.size(); ++i)
    targets.push_back(resolve_device("cuda:" + std::to_string(i), machine));
  if (machine.mps_available)
    targets.push_back(resolve_device("mps", machine));
  targets.push_back(resolve_device("cpu", machine));
  for (auto& info : targets) {
    DeviceCheck c;
    c.info = info;
    try {
      c.matmul_gflops = measure_matmul_gflops(info.device);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      c.error = "matrix product failed: " + msg.substr(0, msg.find('\n'));
    }
    if (c.error.empty())
      check_training_step(c);
    r.devices.push_back(c);
  }
  diagnose(r, requested);
  return r;
}

std::string render(const DoctorReport& r) {
  const MachineFacts& m = r.machine;
  std::ostringstream out;
  out << "Orchard " << orchard_version() << "\n"
      << "  libtorch " << compat::torch_version() << ", " << compiler_version()
      << ", " << build_type() << " build\n"
      << "  system: " << m.os << " " << m.arch << ", memory "
      << format_bytes(m.ram_total_bytes) << " ("
      << format_bytes(m.ram_available_bytes) << " available; " << m.ram_source
      << ")\n"
      << "  BLAS: " << r.blas << "\n"
      << (blas_core_switch_note().empty()
              ? ""
              : "    " + blas_core_switch_note() + "\n")
      << "  CPU threads for tensor work: " << torch::get_num_threads()
      << " (OMP_NUM_THREADS sets it)\n";
  if (m.mps_available)
    out << "  PYTORCH_ENABLE_MPS_FALLBACK="
        << (m.mps_fallback ? "1 (missing MPS ops run on the CPU)"
                           : "unset (a missing MPS op stops the run)")
        << "\n";
  out << "\nDevices:\n";
  for (const auto& d : r.devices) {
    out << "  " << d.info.device.str() << "  " << d.info.name;
    if (d.info.total_memory)
      out << ", " << format_bytes(d.info.total_memory)
          << (d.info.unified_memory ? " unified" : "") << " ("
          << format_bytes(d.info.free_memory) << " free)";
    out << "\n";
    if (d.matmul_gflops) {
      char buf[96];
      std::snprintf(
          buf,
          sizeof buf,
          "    matmul 1024x1024 fp32: %.1f GFLOP/s\n",
          *d.matmul_gflops);
      out << buf;
    }
    if (d.step_ran && d.error.empty()) {
      char buf[128];
      std::snprintf(
          buf,
          sizeof buf,
          "    forward/backward/AdamW step: ok (max |diff| vs CPU %.2e)\n",
          d.max_diff_vs_cpu);
      out << buf;
    } else {
      out << "    forward/backward/AdamW step: FAILED"
          << (d.error.empty() ? "" : ": " + d.error) << "\n";
    }
  }
  for (const auto& note : platform_notes(m))
    out << "\n" << note << "\n";
  if (!r.problems.empty()) {
    out << "\n";
    for (const auto& p : r.problems)
      out << (p.blocking ? "Problem: " : "Warning: ") << p.what
          << "\n  Fix: " << p.fix << "\n";
  }
  if (r.ready)
    out << "\nReady to train on " << r.ready->name << " ("
        << r.ready->device.str() << ")\n";
  else
    out << "\nNot ready: fix the problems above, then run `orchard doctor` "
           "again.\n";
  return out.str();
}

} // namespace orchard
