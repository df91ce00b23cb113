// The progress line of long work, and metrics.jsonl.
//
// In a terminal the line is redrawn in place:
//   step 120/500 | loss 3.412 | lr 6.0e-04 | 41.2K tok/s | 0.40 s/it | ETA
//   2m32s | mem 3.1 GiB
// When the output is a file or a pipe (CI, nohup, `| tee`), the same line is
// printed whole at most every `plain_interval_s` seconds and always for the
// first and the last step, so logs stay readable and short.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace orchard {

struct ProgressStats {
  int64_t step = 0;  // steps done (1-based after the first step)
  int64_t total = 0; // 0 when unknown
  std::optional<double> loss;
  std::optional<double> lr;
  std::optional<double> tokens_per_s;
  std::optional<double> s_per_it;
  std::optional<uint64_t> memory_bytes;
  std::string note; // a stage's own figures ("reward 0.42 (group std 0.31)")
};

// "2m32s", "1h04m", "45s"
std::string format_duration(double seconds);
// One number through a printf format: fmt("%.4f", 1.5) == "1.5000".
std::string fmt(const char* format, double value);
// "41.2K", "1.30M"
std::string format_rate(double per_second);
// The line itself, without any terminal control codes.
std::string progress_text(const ProgressStats& s);

class ProgressLine {
 public:
  using Clock = std::function<double()>; // seconds, monotonic

  // `out` receives the text; `is_terminal` chooses redrawing. Defaults: stdout
  // and isatty(stdout).
  explicit ProgressLine(
      std::FILE* out = stdout,
      std::optional<bool> is_terminal = std::nullopt,
      double plain_interval_s = 10.0,
      Clock clock = {});
  ~ProgressLine();

  // Reports a finished step. s_per_it and ETA come from the clock when not
  // given.
  void update(ProgressStats stats);
  // Prints a message on its own line without garbling the progress line.
  void message(const std::string& text);
  // Ends the redrawn line with a newline (called by the destructor).
  void finish();

 private:
  std::FILE* out_;
  bool tty_;
  double interval_;
  Clock clock_;
  double start_ = 0, last_print_ = -1e30, last_step_time_ = 0;
  int64_t first_step_ = -1;
  bool line_open_ = false;
  std::string last_text_;
};

// Appends one JSON object per line to a file, flushed per line so a crash
// loses nothing already reported. A run resumed from step N first drops the
// rows of steps after N (they are trained again) and any line a crash cut
// short, so every step appears once.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path, int64_t resume_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Numbers only; names are JSON-escaped. Non-finite values become null.
  void write(const std::map<std::string, double>& values);
  const std::string& path() const {
    return path_;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

} // namespace orchard
