#include "core/machine.h"

#include "core/error.h"
#include "core/torch_compat.h"

#include <sched.h>
#include <sys/utsname.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__APPLE__)
#include <mach/mach.h>
#include <sys/sysctl.h>
#endif

#if defined(ORCHARD_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace orchard {
namespace {

namespace fs = std::filesystem;

// A cgroup "limit" at or above this is the kernel's way of saying "none"
// (v1 reports 2^63 rounded down to a page).
constexpr uint64_t kNoLimit = 1ull << 60;

std::optional<std::string> read_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in)
    return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> read_u64(const fs::path& path) {
  auto text = read_file(path);
  if (!text)
    return std::nullopt;
  std::string s = *text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.pop_back();
  if (s.empty() || s == "max")
    return std::nullopt;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (*end != '\0')
    return std::nullopt;
  return v;
}

// "MemTotal:       24576000 kB" -> bytes
std::optional<uint64_t> meminfo_field(
    const std::string& meminfo,
    const std::string& key) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0)
      continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t kb = 0;
    if (fields >> kb)
      return kb * 1024;
  }
  return std::nullopt;
}

struct CgroupMemory {
  std::optional<uint64_t> limit;
  std::optional<uint64_t> usage;
  std::string version;
};

// The memory limit of this process's cgroup: the smallest limit on the path
// from its cgroup up to the root (a parent's limit applies to its children).
CgroupMemory cgroup_memory(const fs::path& root) {
  CgroupMemory out;
  auto self = read_file(root / "proc/self/cgroup");
  std::string v2_path = "/", v1_path = "/";
  bool has_v1 = false;
  if (self) {
    std::istringstream in(*self);
    std::string line;
    while (std::getline(in, line)) {
      // "hierarchy-ID:controller-list:cgroup-path"
      auto a = line.find(':');
      auto b = line.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos)
        continue;
      std::string id = line.substr(0, a);
      std::string controllers = line.substr(a + 1, b - a - 1);
      std::string path = line.substr(b + 1);
      if (id == "0" && controllers.empty())
        v2_path = path;
      std::istringstream cs(controllers);
      std::string c;
      while (std::getline(cs, c, ','))
        if (c == "memory") {
          v1_path = path;
          has_v1 = true;
        }
    }
  }
  // Checks the limit at the process's cgroup and at every ancestor; the usage
  // is the process's own cgroup's.
  auto walk = [&](const fs::path& base,
                  const std::string& rel,
                  const char* limit_file,
                  const char* usage_file) {
    fs::path dir = base;
    if (!fs::path(rel).relative_path().empty())
      dir = (base / fs::path(rel).relative_path()).lexically_normal();
    out.usage = read_u64(dir / usage_file);
    for (;;) {
      if (auto v = read_u64(dir / limit_file); v && *v < kNoLimit)
        out.limit = std::min(out.limit.value_or(kNoLimit), *v);
      if (dir == base || dir.parent_path() == dir)
        break;
      dir = dir.parent_path();
    }
  };
  fs::path v2 = root / "sys/fs/cgroup";
  if (fs::exists(v2 / "cgroup.controllers")) {
    out.version = "v2";
    walk(v2, v2_path, "memory.max", "memory.current");
  } else if (has_v1 || fs::exists(v2 / "memory")) {
    out.version = "v1";
    walk(
        v2 / "memory",
        v1_path,
        "memory.limit_in_bytes",
        "memory.usage_in_bytes");
  }
  return out;
}

uint64_t parse_memory_size(const std::string& text) {
  char* end = nullptr;
  double gb = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(gb) || gb <= 0)
    throw UserError(
        "MEMORY_SIZE='" + text +
        "' is not a positive number of gigabytes.\n"
        "  Set it to the memory Orchard should plan for, e.g. MEMORY_SIZE=64, "
        "or unset it to detect the memory.");
  return static_cast<uint64_t>(gb * static_cast<double>(kGiB));
}

#if defined(__APPLE__)
template <class T>
std::optional<T> sysctl_value(const char* name) {
  T value{};
  size_t size = sizeof(value);
  if (sysctlbyname(name, &value, &size, nullptr, 0) != 0)
    return std::nullopt;
  return value;
}

std::string sysctl_string(const char* name) {
  size_t size = 0;
  if (sysctlbyname(name, nullptr, &size, nullptr, 0) != 0 || size == 0)
    return "";
  std::string s(size, '\0');
  if (sysctlbyname(name, s.data(), &size, nullptr, 0) != 0)
    return "";
  s.resize(std::strlen(s.c_str()));
  return s;
}
#endif

} // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v)
      return std::nullopt;
    return std::string(v);
  };
}

SystemMemory probe_system_memory(const MemoryProbeInputs& in) {
  SystemMemory mem;
#if defined(__APPLE__)
  if (in.root == "/") {
    mem.total_bytes = sysctl_value<uint64_t>("hw.memsize").value_or(0);
    mem.source = "sysctl hw.memsize";
    vm_statistics64_data_t vm{};
    mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
    if (host_statistics64(
            mach_host_self(),
            HOST_VM_INFO64,
            reinterpret_cast<host_info64_t>(&vm),
            &count) == KERN_SUCCESS) {
      uint64_t page = static_cast<uint64_t>(vm_kernel_page_size);
      mem.available_bytes =
          (uint64_t(vm.free_count) + vm.inactive_count + vm.purgeable_count) *
          page;
    }
  }
#endif
  if (mem.total_bytes == 0) {
    fs::path root(in.root);
    if (auto meminfo = read_file(root / "proc/meminfo")) {
      mem.total_bytes = meminfo_field(*meminfo, "MemTotal").value_or(0);
      mem.available_bytes =
          meminfo_field(*meminfo, "MemAvailable").value_or(mem.total_bytes);
      mem.source = "/proc/meminfo";
    }
    CgroupMemory cg = cgroup_memory(root);
    if (cg.limit && (mem.total_bytes == 0 || *cg.limit < mem.total_bytes)) {
      mem.total_bytes = *cg.limit;
      uint64_t used = std::min(cg.usage.value_or(0), *cg.limit);
      uint64_t left = *cg.limit - used;
      mem.available_bytes =
          mem.available_bytes == 0 ? left : std::min(mem.available_bytes, left);
      mem.source = "cgroup " + cg.version + " limit";
    }
  }
  if (auto override_gb = in.env("MEMORY_SIZE")) {
    mem.total_bytes = parse_memory_size(*override_gb);
    mem.available_bytes = mem.total_bytes;
    mem.source = "MEMORY_SIZE=" + *override_gb;
  }
  return mem;
}

MachineFacts probe_machine() {
  MachineFacts m;
  struct utsname u {};
  if (uname(&u) == 0) {
    m.arch = u.machine;
    std::string sys = u.sysname;
    m.os = sys == "Darwin" ? "macos" : sys == "Linux" ? "linux" : sys;
  }
  SystemMemory mem = probe_system_memory();
  m.ram_total_bytes = mem.total_bytes;
  m.ram_available_bytes = mem.available_bytes;
  m.ram_source = mem.source;

  m.cuda_built = torch::cuda::is_available() || at::hasCUDA();
  if (torch::cuda::is_available()) {
    int n = static_cast<int>(torch::cuda::device_count());
    for (int i = 0; i < n; ++i) {
      GpuFacts g;
      g.name = "CUDA device " + std::to_string(i);
#if defined(ORCHARD_WITH_CUDA)
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
        g.name = prop.name;
        g.total_bytes = prop.totalGlobalMem;
        g.compute_capability = prop.major * 10 + prop.minor;
      }
      int previous = 0;
      cudaGetDevice(&previous);
      size_t free_b = 0, total_b = 0;
      if (cudaSetDevice(i) == cudaSuccess &&
          cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        g.free_bytes = free_b;
        g.total_bytes = total_b;
      }
      cudaSetDevice(previous);
#endif
      m.cuda.push_back(g);
    }
  }

  m.mps_available = compat::mps_available();
  m.mps_built = compat::mps_built();
  if (auto v = std::getenv("PYTORCH_ENABLE_MPS_FALLBACK"))
    m.mps_fallback = std::string(v) == "1";
#if defined(__APPLE__)
  m.mps_chip = sysctl_string("machdep.cpu.brand_string");
  m.rosetta = sysctl_value<int>("sysctl.proc_translated").value_or(0) == 1;
#endif
  return m;
}

MachineFacts simulated_machine(const std::string& kind, double memory_gb) {
  if (!(memory_gb > 0))
    throw UserError(
        "--memory-gb must be a positive number of gigabytes (got " +
        std::to_string(memory_gb) + ").");
  MachineFacts m;
  m.simulated = true;
  uint64_t bytes = static_cast<uint64_t>(memory_gb * double(kGiB));
  if (kind == "mps") {
    m.os = "macos";
    m.arch = "arm64";
    m.mps_available = m.mps_built = true;
    m.mps_chip = "Apple Silicon (simulated)";
    m.ram_total_bytes = m.ram_available_bytes = bytes;
    m.ram_source = "--memory-gb (unified memory)";
  } else if (kind == "cuda") {
    m.os = "linux";
    m.arch = "x86_64";
    m.cuda_built = true;
    m.cuda.push_back({"CUDA GPU (simulated)", bytes, bytes});
    // The host is not what the plan is about; give it as much as the GPU.
    m.ram_total_bytes = m.ram_available_bytes = bytes;
    m.ram_source = "--memory-gb (host assumed equal to GPU)";
  } else if (kind == "cpu") {
    m.os = "linux";
    m.arch = "x86_64";
    m.ram_total_bytes = m.ram_available_bytes = bytes;
    m.ram_source = "--memory-gb";
  } else {
    throw UserError(
        "--assume-device must be cuda, mps or cpu (got '" + kind + "').");
  }
  return m;
}

std::string default_data_dir(const EnvLookup& env) {
  if (auto v = env("ORCHARD_HOME"); v && !v->empty())
    return *v;
  if (auto v = env("XDG_CACHE_HOME"); v && !v->empty())
    return *v + "/orchard";
  if (auto v = env("HOME"); v && !v->empty())
    return *v + "/.cache/orchard";
  return ".orchard-cache";
}

int configure_cpu_threads(const EnvLookup& env) {
  int n = 0;
  if (auto v = env("OMP_NUM_THREADS"))
    n = std::atoi(v->c_str());
  if (n <= 0) {
    n = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
      n = CPU_COUNT(&set);
#endif
    // Several processes on this node (orchard launch, torchrun, Slurm's
    // LOCAL_WORLD_SIZE as torchrun sets it): each takes its share.
    if (auto v = env("LOCAL_WORLD_SIZE"); v && std::atoi(v->c_str()) > 1)
      n /= std::atoi(v->c_str());
  }
  n = std::max(n, 1);
  torch::set_num_threads(n);
  return n;
}

bool configure_allocator() {
#if defined(__GLIBC__)
  // Setting either turns off glibc's own threshold that moves up as large
  // blocks are freed; setting only the trim threshold would leave every
  // block over 128 KiB to mmap.
  return mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1 &&
      mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#else
  return false;
#endif
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

} // namespace orchard
