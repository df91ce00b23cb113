// Run reports: report.md and loss.svg in every run folder, and one
// combined report for a pipeline.
//
// A report holds the system (device, memory, libtorch, Orchard), each
// stage's config (its config.yaml), time (steps, evaluations and samples,
// summed over every resume), throughput (median tokens/s of the logged
// steps), peak memory, final metrics, the loss curves as SVG (drawn from
// metrics.jsonl: training loss per step, smoothed, and validation loss at
// each evaluation; when a resumed run logged a step twice, the later row
// counts), and sample generations.
#pragma once

#include "core/device.h"
#include "train/pretrain.h"

#include <optional>
#include <string>
#include <vector>

namespace orchard::train {

struct Sample {
  std::string prompt, output;
  std::string reference; // the held-out answer, when there is one
};

struct StageReport {
  TrainResult result;
  std::vector<Sample> samples;
  std::string sample_note; // "continuations of held-out documents"
};

struct MetricPoint {
  double step = 0, value = 0;
};

struct RunMetrics {
  std::vector<MetricPoint> train_loss, val_loss;
  double median_tokens_per_s = 0;
};

// metrics.jsonl of a run folder (empty curves when it is missing). A line
// that is not JSON (the tail of a write cut short by a crash) is skipped.
RunMetrics read_run_metrics(const std::string& run_dir);

struct Curve {
  std::string name, color;
  std::vector<MetricPoint> points;
  bool dots = false; // markers at each point (evaluations)
};

// A self-contained SVG line chart (no scripts, fonts or styles from
// elsewhere).
std::string svg_chart(
    const std::string& title,
    const std::vector<Curve>& curves,
    const std::string& x_label,
    const std::string& y_label);

// Exponential moving average of `points` (debiased), for a readable
// training-loss curve.
std::vector<MetricPoint> smooth(
    const std::vector<MetricPoint>& points,
    double beta = 0.9);

// The system lines of a report.
std::string system_section(const DeviceInfo& device);

// <run_dir>/result.json: a finished stage's result and samples, so a
// rerun of a complete run (or a pipeline passing over a done stage) reports
// the same numbers instead of empty ones.
void save_stage_result(const StageReport& stage);

// The saved result of the run's checkpoint at `step`; nullopt when there
// is none (a run from before result.json existed), it is unreadable, or it
// is of another step.
std::optional<StageReport> saved_stage_result(
    const std::string& run_dir,
    int64_t step);

// Writes <run_dir>/loss.svg and <run_dir>/report.md for one stage.
void write_stage_report(const DeviceInfo& device, const StageReport& stage);

// Writes `path` (and each stage's loss.svg): every stage of a pipeline in
// one report, with total time.
void write_pipeline_report(
    const std::string& path,
    const DeviceInfo& device,
    const std::vector<StageReport>& stages,
    const std::string& preamble);

} // namespace orchard::train
