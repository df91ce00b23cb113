#include "core/progress.h"

#include "core/files.h"

#include "core/error.h"

#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/machine.h"

namespace orchard {

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string progress_text(const ProgressStats& s) {
  char buf[64];
  std::string line = "step " + std::to_string(s.step);
  if (s.total > 0)
    line += "/" + std::to_string(s.total);
  if (s.loss) {
    std::snprintf(buf, sizeof buf, " | loss %.4f", *s.loss);
    line += buf;
  }
  if (s.lr) {
    std::snprintf(buf, sizeof buf, " | lr %.2e", *s.lr);
    line += buf;
  }
  if (s.tokens_per_s)
    line += " | " + format_rate(*s.tokens_per_s) + " tok/s";
  if (s.s_per_it) {
    std::snprintf(buf, sizeof buf, " | %.2f s/it", *s.s_per_it);
    line += buf;
    if (s.total > 0 && s.step <= s.total)
      line += " | ETA " + format_duration(*s.s_per_it * (s.total - s.step));
  }
  if (!s.note.empty())
    line += " | " + s.note;
  if (s.memory_bytes)
    line += " | mem " + format_bytes(*s.memory_bytes);
  return line;
}

ProgressLine::ProgressLine(
    std::FILE* out,
    std::optional<bool> is_terminal,
    double plain_interval_s,
    Clock clock)
    : out_(out),
      tty_(is_terminal ? *is_terminal : ::isatty(::fileno(out)) == 1),
      interval_(plain_interval_s),
      clock_(std::move(clock)) {
  if (!clock_) {
    clock_ = [] {
      using namespace std::chrono;
      return duration<double>(steady_clock::now().time_since_epoch()).count();
    };
  }
  start_ = last_step_time_ = clock_();
}

ProgressLine::~ProgressLine() {
  finish();
}

void ProgressLine::update(ProgressStats s) {
  double now = clock_();
  if (first_step_ < 0)
    first_step_ = s.step - 1;
  if (!s.s_per_it && s.step > first_step_)
    s.s_per_it = (now - start_) / static_cast<double>(s.step - first_step_);
  last_step_time_ = now;
  std::string text = progress_text(s);
  last_text_ = text;
  bool last = s.total > 0 && s.step >= s.total;
  if (tty_) {
    // \r back to column 0, ESC[K clears what a longer previous line left.
    std::fprintf(out_, "\r\033[K%s", text.c_str());
    line_open_ = true;
    if (last)
      finish();
  } else if (
      s.step == first_step_ + 1 || last || now - last_print_ >= interval_) {
    std::fprintf(out_, "%s\n", text.c_str());
    last_print_ = now;
  }
  std::fflush(out_);
}

void ProgressLine::message(const std::string& text) {
  if (line_open_) {
    std::fprintf(out_, "\r\033[K%s\n%s", text.c_str(), last_text_.c_str());
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (line_open_) {
    std::fprintf(out_, "\n");
    std::fflush(out_);
    line_open_ = false;
  }
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resume_step)
    : path_(path) {
  if (resume_step >= 0) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::string line, kept;
      bool dropped = false;
      while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        const bool later = j.is_object() && j.contains("step") &&
            j["step"].is_number() && j["step"].get<double>() > resume_step;
        if (j.is_discarded() || later) {
          dropped = true;
          continue;
        }
        kept += line + "\n";
      }
      in.close();
      if (dropped)
        atomic_write(path, kept);
    }
  }
  file_ = std::fopen(path.c_str(), "a");
  if (!file_)
    throw UserError(
        "cannot open metrics file '" + path + "': " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_)
    std::fclose(file_);
}

void MetricsWriter::write(const std::map<std::string, double>& values) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : values) {
    if (!std::isfinite(v))
      j[k] = nullptr;
    else if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0)
      j[k] = static_cast<int64_t>(v); // steps and counts stay integers
    else
      j[k] = v;
  }
  std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
      std::fflush(file_) != 0)
    throw UserError(
        "cannot write metrics to '" + path_ + "': " + std::strerror(errno));
}

} // namespace orchard
