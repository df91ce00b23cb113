#include "fuzz/fuzz_harness.h"

#include "core/error.h"
#include "core/json.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <typeinfo>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define ORCHARD_FUZZ_ASAN 1
// Sanitizer defaults for this binary (ASAN_OPTIONS / UBSAN_OPTIONS add to
// them): an allocation too large must come back as std::bad_alloc, which the
// harness reports with its input, rather than abort; libtorch's static
// allocations make the leak report noise.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=4096:"
         "detect_leaks=0";
}
extern "C" const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1";
}
#else
#define ORCHARD_FUZZ_ASAN 0
#endif

namespace orchard::fuzz {
namespace {

using json = nlohmann::json;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return *end == '\0' && d > 0 ? d : fallback;
}

// Defaults sized so the whole binary (13 campaigns) stays near a minute on a
// 2-core machine; sanitized code runs 2-5x slower, so its inputs get more
// time each (the budget per reader stays the same).
constexpr double kDefaultSecondsPerReader = 4;
constexpr double kDefaultInputSeconds = ORCHARD_FUZZ_ASAN ? 30 : 10;
// Address space for the unsanitized build, beyond what is mapped when the
// guards start: far above what any reader needs
// for these small inputs, far below what an unchecked size asks for.
constexpr double kDefaultMemoryGb = 16;
constexpr size_t kMaxFailuresReported = 5;
constexpr double kSlowInputSeconds = 1;

std::string out_dir() {
  const char* v = std::getenv("ORCHARD_FUZZ_OUT");
  return v && *v ? v : "fuzz-failures";
}

// The input being read, for the watchdog and the crash handlers. A fixed
// buffer: the signal handler may only read plain memory.
struct Current {
  std::mutex mutex;
  std::string input;
  char path[512] = {};
  std::atomic<double> started{0};
};
Current& current() {
  static auto* c =
      new Current(); // never destroyed: the watchdog outlives tests
  return *c;
}

void save_current_raw() {
  Current& c = current();
  if (!c.path[0])
    return;
  ::mkdir(out_dir().c_str(), 0755);
  int fd = ::open(c.path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    size_t done = 0;
    while (done < c.input.size()) {
      ssize_t n = ::write(fd, c.input.data() + done, c.input.size() - done);
      if (n <= 0)
        break;
      done += size_t(n);
    }
    ::close(fd);
  }
  const char msg[] = "\n[fuzz] the input being read was saved to ";
  (void)!::write(2, msg, sizeof msg - 1);
  (void)!::write(2, c.path, std::strlen(c.path));
  (void)!::write(2, "\n", 1);
}

#if !ORCHARD_FUZZ_ASAN
void on_crash(int sig) {
  save_current_raw();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}
#endif

void start_guards() {
  static std::once_flag once;
  std::call_once(once, [] {
#if ORCHARD_FUZZ_ASAN
    __sanitizer_set_death_callback(save_current_raw);
#else
    // A crash (stack overflow included: the handler runs on its own stack)
    // leaves the input behind before the process dies.
    static std::vector<char> alt(1 << 16);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    ::sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_handler = on_crash;
    sa.sa_flags = SA_ONSTACK;
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
      ::sigaction(sig, &sa, nullptr);
    // Unbounded allocation shows as std::bad_alloc instead of swapping:
    // the cap is what the process maps already plus ORCHARD_FUZZ_MEMORY_GB
    // (a CUDA build of libtorch maps many GB before any reader runs; a
    // fixed cap below that left no room to start a thread there).
    rlimit lim{};
    double mapped = 0;
    {
      std::ifstream statm("/proc/self/statm");
      statm >> mapped;
      mapped *= double(::sysconf(_SC_PAGESIZE));
    }
    const auto cap = rlim_t(
        mapped +
        env_number("ORCHARD_FUZZ_MEMORY_GB", kDefaultMemoryGb) * 1e9);
    if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur > cap) {
      lim.rlim_cur = cap;
      ::setrlimit(RLIMIT_AS, &lim);
    }
#endif
    // The watchdog: an input running past its limit is a hang; the process
    // cannot stop a hung reader, so it saves the input and exits.
    const double limit =
        env_number("ORCHARD_FUZZ_INPUT_SECONDS", kDefaultInputSeconds);
    std::thread([limit] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        double t = current().started.load();
        if (t > 0 && now_seconds() - t > limit) {
          std::fprintf(
              stderr,
              "\n[fuzz] HANG: one input ran for more than %.0f s "
              "(ORCHARD_FUZZ_INPUT_SECONDS).\n",
              limit);
          save_current_raw();
          std::fflush(stderr);
          std::_Exit(3);
        }
      }
    }).detach();
  });
}

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? d.get() : name;
}

// What escaped `read`, or "" for success / UserError; `user` says which.
std::string classify(const std::function<void()>& read, bool& user) {
  user = false;
  try {
    read();
    return "";
  } catch (const UserError&) {
    user = true;
    return "";
  } catch (const std::bad_alloc&) {
    return "std::bad_alloc (an allocation sized from the input, unchecked)";
  } catch (const std::exception& e) {
    return demangle(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

const std::vector<std::string>& invalid_utf8() {
  static const std::vector<std::string> v = {
      "\xff",
      "\x80",
      "\xc0\x80",         // overlong NUL
      "\xed\xa0\x80",     // a surrogate
      "\xf4\x90\x80\x80", // past U+10FFFF
      "\xe2\x96",         // cut short
      "\xf8\x88\x80\x80\x80"};
  return v;
}

// A JSON node and where it sits, for structural mutations.
struct Slot {
  json* node;
  json* parent; // nullptr for the root
  std::string key;
  size_t index = 0;
};

void collect(
    json& j,
    json* parent,
    const std::string& key,
    size_t index,
    std::vector<Slot>& out,
    int depth) {
  out.push_back({&j, parent, key, index});
  if (depth > 64)
    return;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      collect(*it, &j, it.key(), 0, out, depth + 1);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i)
      collect(j[i], &j, "", i, out, depth + 1);
}

std::string sentinel(size_t k) {
  return "@@fuzz-raw-" + std::to_string(k) + "@@";
}

std::string nested(Rng& rng) {
  static const size_t depths[] = {64, 600, 5000, 100000};
  size_t d = depths[rng.below(4)];
  if (rng.chance(0.5))
    return std::string(d, '[') + "1" + std::string(d, ']');
  std::string s;
  for (size_t i = 0; i < d; ++i)
    s += "{\"a\":";
  s += "1";
  return s + std::string(d, '}');
}

// Raw JSON text spliced in where a sentinel string was.
std::string raw_value(Rng& rng, const std::vector<Slot>& slots) {
  switch (rng.below(7)) {
    case 0:
      return nested(rng);
    case 1:
      return rng.pick(std::vector<std::string>{
          "1e999",
          "-1e999",
          "123456789012345678901234567890",
          "-123456789012345678901234567890",
          "-0",
          "1.7976931348623157e308",
          "4.9e-324"});
    case 2:
      return "\"a" + rng.pick(invalid_utf8()) + "b\"";
    case 3:
      return "\"\\ud800\"";
    case 4: // a copy of another key's name, making a duplicate key
      for (int tries = 0; tries < 8; ++tries) {
        const Slot& s = slots[rng.below(slots.size())];
        if (s.parent && s.parent->is_object())
          return json(s.key).dump();
      }
      return "\"model\"";
    case 5:
      return "\"" + std::string(1 + rng.below(200000), 'A') + "\"";
    default:
      return rng.pick(std::vector<std::string>{"NaN", "undefined", "0x10", ""});
  }
}

json scalar(Rng& rng) {
  switch (rng.below(12)) {
    case 0:
      return nullptr;
    case 1:
      return rng.chance(0.5);
    case 2:
      return rng.pick(interesting_integers());
    case 3:
      return int64_t(rng.pick(interesting_integers()));
    case 4:
      return rng.pick(std::vector<double>{1e308, -1e308, 0.5, -0.0, 1e-300});
    case 5:
      return "";
    case 6:
      return std::string(1 + rng.below(64), char('a' + rng.below(26)));
    case 7:
      return json::array();
    case 8:
      return json::object();
    case 9:
      return json::array({1, "x", nullptr});
    case 10:
      return std::string(1 + rng.below(100000), 'x');
    default:
      return -1;
  }
}

void mutate_node(json& root, Rng& rng, std::vector<std::string>& raws) {
  std::vector<Slot> slots;
  collect(root, nullptr, "", 0, slots, 0);
  Slot s = slots[rng.below(slots.size())];
  json& n = *s.node;
  switch (rng.below(9)) {
    case 0:
    case 1:
      n = scalar(rng);
      return;
    case 2: { // raw text: deep nesting, huge numbers, invalid UTF-8
      raws.push_back(raw_value(rng, slots));
      n = sentinel(raws.size() - 1);
      return;
    }
    case 3: // delete
      if (s.parent && s.parent->is_object())
        s.parent->erase(s.key);
      else if (s.parent && s.parent->is_array())
        s.parent->erase(s.index);
      else
        n = json::object();
      return;
    case 4: // rename or duplicate a key
      if (s.parent && s.parent->is_object()) {
        json v = n;
        if (rng.chance(0.5)) {
          raws.push_back(raw_value(rng, slots));
          (*s.parent)[sentinel(raws.size() - 1)] = v;
        } else {
          s.parent->erase(s.key);
          (*s.parent)[s.key + char('a' + rng.below(26))] = v;
        }
        return;
      }
      n = scalar(rng);
      return;
    case 5: // grow an array
      if (n.is_array() && !n.empty()) {
        json item = n[rng.below(n.size())];
        size_t k = 1 + rng.below(rng.chance(0.1) ? 2000 : 8);
        for (size_t i = 0; i < k; ++i)
          n.push_back(item);
        return;
      }
      n = json::array({n, n});
      return;
    case 6: { // another node's value
      json other = *slots[rng.below(slots.size())].node;
      n = std::move(other);
      return;
    }
    case 7: // wrap
      n = rng.chance(0.5) ? json::array({n}) : json{{"value", n}};
      return;
    default: // shuffle an array / object's order stays; swap two items
      if (n.is_array() && n.size() > 1)
        std::swap(n[rng.below(n.size())], n[rng.below(n.size())]);
      else
        n = scalar(rng);
      return;
  }
}

} // namespace

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const std::vector<uint64_t>& interesting_integers() {
  static const std::vector<uint64_t> v = {
      0,
      1,
      2,
      7,
      255,
      256,
      0x7fff,
      0xffff,
      0x10000,
      0x7fffffff,
      0x80000000,
      0xffffffff,
      0x100000000,
      0x20000000000000, // 2^53
      0x7fffffffffffffff,
      0x8000000000000000,
      0xffffffffffffffff, // -1
      0xfffffffffffffffe,
      0xffffffff80000000, // INT32_MIN as int64
  };
  return v;
}

void put_le(std::string& s, size_t at, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes && at + i < s.size(); ++i)
    s[at + i] = char((v >> (8 * i)) & 0xff);
}

std::string mutate_bytes(std::string s, Rng& rng) {
  auto pos = [&](size_t extra) {
    return s.size() + extra == 0 ? 0 : size_t(rng.below(s.size() + extra));
  };
  switch (rng.below(10)) {
    case 0:
      if (!s.empty())
        s[pos(0)] ^= char(1 << rng.below(8));
      break;
    case 1:
      if (!s.empty())
        s[pos(0)] = rng.pick(std::vector<char>{
            0,
            char(0xff),
            0x7f,
            char(0x80),
            '"',
            '{',
            '}',
            '[',
            ']',
            ',',
            ':',
            '\\',
            '\n',
            ' ',
            '0',
            '9',
            '-',
            '%',
            '\''});
      break;
    case 2: {
      std::string ins;
      for (size_t k = 1 + rng.below(8); k > 0; --k)
        ins += char(rng.below(256));
      s.insert(pos(1), ins);
      break;
    }
    case 3:
      if (!s.empty()) {
        size_t a = pos(0);
        s.erase(a, 1 + rng.below(64));
      }
      break;
    case 4:
      if (!s.empty()) {
        size_t a = pos(0);
        std::string run = s.substr(a, 1 + rng.below(256));
        s.insert(pos(1), run);
      }
      break;
    case 5:
      s.resize(pos(0));
      break;
    case 6:
      s.insert(pos(1), rng.pick(invalid_utf8()));
      break;
    case 7:
    case 8:
      if (!s.empty())
        put_le(
            s,
            pos(0),
            rng.pick(interesting_integers()),
            rng.chance(0.5) ? 4 : 8);
      break;
    default:
      s.insert(pos(1), std::string(1 + rng.below(4096), char(rng.below(256))));
      break;
  }
  return s;
}

std::string mutate_json(const std::string& text, Rng& rng) {
  // A document an earlier mutation nested deeply is mutated as bytes: the
  // tree operations below copy recursively.
  constexpr size_t kMaxTreeDepth = 200;
  json j = json_nesting(text) > kMaxTreeDepth
      ? json(json::value_t::discarded)
      : json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return mutate_bytes(text, rng);
  std::vector<std::string> raws;
  for (size_t k = 1 + rng.below(3); k > 0; --k)
    mutate_node(j, rng, raws);
  std::string out = j.dump(
      rng.chance(0.5) ? -1 : 2, ' ', false, json::error_handler_t::replace);
  for (size_t k = 0; k < raws.size(); ++k) {
    std::string quoted = "\"" + sentinel(k) + "\"";
    size_t at = out.find(quoted);
    if (at != std::string::npos)
      out.replace(at, quoted.size(), raws[k]);
  }
  if (rng.chance(0.2))
    out = mutate_bytes(std::move(out), rng);
  return out;
}

std::string mutate_with(
    const std::string& text,
    const std::vector<std::string>& dictionary,
    Rng& rng) {
  std::string s = text;
  for (size_t k = 1 + rng.below(4); k > 0; --k) {
    const std::string& word = rng.pick(dictionary);
    size_t at = rng.below(s.size() + 1);
    switch (rng.below(4)) {
      case 0:
      case 1:
        s.insert(at, word);
        break;
      case 2:
        s.replace(at, rng.below(16), word);
        break;
      default:
        if (!s.empty()) {
          std::string run = s.substr(rng.below(s.size()), 1 + rng.below(128));
          s.insert(at, run);
        }
        break;
    }
  }
  if (rng.chance(0.2))
    s = mutate_bytes(std::move(s), rng);
  return s;
}

Campaign::Campaign(std::string reader)
    : reader_(std::move(reader)),
      seed_(uint64_t(env_number("ORCHARD_FUZZ_SEED", 17))),
      seconds_(env_number("ORCHARD_FUZZ_SECONDS", kDefaultSecondsPerReader)),
      start_(now_seconds()) {
  start_guards();
}

Campaign::~Campaign() {
  std::printf(
      "[fuzz] %-14s %7zu inputs in %5.1f s (seed %llu): %zu read, %zu "
      "UserError, %zu failed\n",
      reader_.c_str(),
      tried_,
      now_seconds() - start_,
      (unsigned long long)seed_,
      ok_,
      user_errors_,
      failures_);
  std::fflush(stdout);
}

bool Campaign::more(size_t seeds) {
  if (failures_ >= kMaxFailuresReported)
    return false;
  if (tried_ < seeds)
    return true;
  if (budget_start_ == 0)
    budget_start_ = now_seconds();
  return now_seconds() - budget_start_ < seconds_;
}

Rng Campaign::next_rng() {
  Rng mix(seed_ * 0x100000001B3ull + tried_);
  return Rng(mix.next());
}

void Campaign::run(
    const std::string& input,
    const std::function<void()>& read) {
  Current& c = current();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.input = input;
    std::snprintf(
        c.path,
        sizeof c.path,
        "%s/%s-seed%llu-input%zu.bin",
        out_dir().c_str(),
        reader_.c_str(),
        (unsigned long long)seed_,
        tried_);
  }
  const double started = now_seconds();
  c.started = started;
  bool user = false;
  std::string escaped = classify(read, user);
  c.started = 0;
  // Slow but finished: worth knowing before it becomes a hang.
  if (now_seconds() - started > kSlowInputSeconds)
    std::printf(
        "[fuzz] %s: input %zu took %.1f s\n",
        reader_.c_str(),
        tried_,
        now_seconds() - started);
  c.path[0] = '\0'; // a crash between inputs is the harness's own
  ++tried_;
  if (escaped.empty()) {
    ++(user ? user_errors_ : ok_);
    return;
  }
  ++failures_;
  const std::string path = out_dir() + "/" + reader_ + "-seed" +
      std::to_string(seed_) + "-input" + std::to_string(tried_ - 1) + ".bin";
  std::filesystem::create_directories(out_dir());
  std::ofstream(path, std::ios::binary) << input;
  ADD_FAILURE() << "[fuzz] " << reader_ << ": input " << tried_ - 1 << " (seed "
                << seed_ << ") ended in " << escaped << "\n  saved to " << path
                << "\n  input: " << printable(input);
}

std::string outcome_of(const std::function<void()>& read) {
  bool user = false;
  return classify(read, user);
}

std::string printable(const std::string& input, size_t limit) {
  std::string out;
  for (size_t i = 0; i < input.size() && i < limit; ++i) {
    unsigned char c = input[i];
    if (c == '\n' || (c >= 0x20 && c < 0x7f)) {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (input.size() > limit)
    out += "... (" + std::to_string(input.size()) + " bytes)";
  return out;
}

} // namespace orchard::fuzz
