#include "train/report.h"

#include "core/files.h"
#include "core/machine.h"
#include "core/progress.h"
#include "core/version.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace orchard::train {
namespace {
namespace fs = std::filesystem;

std::string duration(double s) {
  if (s < 60)
    return fmt("%.1f s", s);
  const int64_t t = int64_t(std::llround(s));
  if (t < 3600)
    return std::to_string(t / 60) + " min " + std::to_string(t % 60) + " s";
  return std::to_string(t / 3600) + " h " + std::to_string(t % 3600 / 60) +
      " min";
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One line of Markdown: newlines become spaces; characters that would
// start formatting are escaped.
std::string md_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n' || c == '\r')
      c = ' ';
    if (c == '*' || c == '_' || c == '`' || c == '<' || c == '|' || c == '[' ||
        c == ']' || c == '\\')
      out += '\\';
    out += c;
  }
  return out;
}

// 1, 2 or 5 times a power of ten, giving about `count` ticks over the span.
double nice_step(double span, int count) {
  if (span <= 0)
    return 1;
  const double raw = span / count;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p)
      return m * p;
  return 10 * p;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string results_table(const StageReport& st) {
  const TrainResult& r = st.result;
  std::string md = "| | |\n|---|---|\n";
  auto row = [&](const std::string& k, const std::string& v) {
    md += "| " + k + " | " + v + " |\n";
  };
  row("Stage",
      r.stage +
          (r.init_dir.empty() ? " (from scratch)"
                              : " (from `" + r.init_dir + "`)"));
  row("Data", md_line(r.data_description));
  row("Steps", std::to_string(r.step) + " of " + std::to_string(r.total));
  row("Time", duration(r.train_seconds) + " (steps, evaluations, samples)");
  RunMetrics m = read_run_metrics(r.run_dir);
  if (m.median_tokens_per_s > 0)
    row("Throughput",
        fmt("%.0f", m.median_tokens_per_s) + " tokens/s (median step)");
  row("Peak memory", format_bytes(r.peak_memory_bytes));
  if (r.stage == "grpo")
    row("Held-out reward", fmt("%.4f", -r.val_loss));
  else
    row("Validation loss",
        fmt("%.4f", r.val_loss) +
            (r.stage == "sft" ? " (on the answers of held-out conversations)"
                              : ""));
  for (const auto& [k, v] : r.report_rows)
    row(md_line(k), md_line(v));
  if (r.val_bpb > 0)
    row("Bits per byte (validation)", fmt("%.4f", r.val_bpb));
  if (r.train_split_loss > 0)
    row("Final loss, train / val split",
        fmt("%.4f", r.train_split_loss) + " / " +
            fmt("%.4f", r.val_split_loss));
  if (r.unigram_loss > 0)
    row("Unigram baseline (validation)", fmt("%.4f", r.unigram_loss));
  row("Checkpoint", "`" + r.checkpoint_dir + "`");
  return md;
}

std::string samples_section(const StageReport& st) {
  if (st.samples.empty())
    return "";
  std::string md = "From the final weights: " + st.sample_note + ".\n\n";
  for (const auto& s : st.samples) {
    if (!s.reference.empty()) {
      md += "- **Q:** " + md_line(s.prompt) + "  \n  **Model:** " +
          md_line(s.output) + "  \n  *Reference:* " + md_line(s.reference) +
          "\n";
    } else {
      md += "- **" + md_line(s.prompt) + "**" + md_line(s.output) + "\n";
    }
  }
  return md + "\n";
}

std::string write_svg(const StageReport& st) {
  RunMetrics m = read_run_metrics(st.result.run_dir);
  std::vector<Curve> curves;
  if (!m.train_loss.empty()) {
    curves.push_back({"train (per step)", "#c8d3e6", m.train_loss});
    curves.push_back({"train (smoothed)", "#2f5fae", smooth(m.train_loss)});
  }
  if (!m.val_loss.empty())
    curves.push_back({"validation", "#d9541e", m.val_loss, true});
  atomic_write(
      st.result.run_dir + "/loss.svg",
      svg_chart(
          st.result.stage + " loss (" + st.result.run_dir + ")",
          curves,
          "step",
          "loss"));
  return "loss.svg";
}

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::localtime(&t));
  return buf;
}

} // namespace

RunMetrics read_run_metrics(const std::string& run_dir) {
  RunMetrics m;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::map<int64_t, double> train, val, tps;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number())
      continue;
    const int64_t step = j["step"].get<int64_t>();
    if (j.contains("loss") && j["loss"].is_number())
      train[step] = j["loss"].get<double>();
    if (j.contains("val_loss") && j["val_loss"].is_number())
      val[step] = j["val_loss"].get<double>();
    if (j.contains("tokens_per_s") && j["tokens_per_s"].is_number())
      tps[step] = j["tokens_per_s"].get<double>();
  }
  for (const auto& [s, v] : train)
    if (std::isfinite(v))
      m.train_loss.push_back({double(s), v});
  for (const auto& [s, v] : val)
    if (std::isfinite(v))
      m.val_loss.push_back({double(s), v});
  std::vector<double> t;
  for (const auto& [s, v] : tps)
    if (s > 1) // the first step includes warm-up work
      t.push_back(v);
  if (t.empty())
    for (const auto& [s, v] : tps)
      t.push_back(v);
  if (!t.empty()) {
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    m.median_tokens_per_s = t[t.size() / 2];
  }
  return m;
}

std::vector<MetricPoint> smooth(
    const std::vector<MetricPoint>& points,
    double beta) {
  std::vector<MetricPoint> out;
  double avg = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    avg = beta * avg + (1 - beta) * points[i].value;
    out.push_back({points[i].step, avg / (1 - std::pow(beta, double(i + 1)))});
  }
  return out;
}

std::string svg_chart(
    const std::string& title,
    const std::vector<Curve>& curves,
    const std::string& x_label,
    const std::string& y_label) {
  const double W = 720, H = 360, left = 64, right = 170, top = 36, bottom = 48;
  const double pw = W - left - right, ph = H - top - bottom;
  double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& c : curves)
    for (const auto& p : c.points) {
      x1 = std::max(x1, p.step);
      y0 = std::min(y0, p.value);
      y1 = std::max(y1, p.value);
    }
  if (!std::isfinite(y0)) {
    y0 = 0;
    y1 = 1;
  }
  if (y1 - y0 < 1e-9) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  const double ys = nice_step(y1 - y0, 5), xs = nice_step(x1 - x0, 6);
  y0 = std::floor(y0 / ys) * ys;
  y1 = std::ceil(y1 / ys) * ys;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << left << "\" y=\"22\" font-size=\"14\">"
    << xml_escape(title) << "</text>\n";
  for (double y = y0; y <= y1 + ys / 2; y += ys)
    o << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << Y(y)
      << "\" y2=\"" << Y(y) << "\" stroke=\"#e5e5e5\"/>\n"
      << "<text x=\"" << left - 6 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\">" << fmt("%g", std::round(y * 1e6) / 1e6)
      << "</text>\n";
  for (double x = x0; x <= x1 + xs / 2; x += xs)
    o << "<line x1=\"" << X(x) << "\" x2=\"" << X(x) << "\" y1=\"" << top
      << "\" y2=\"" << top + ph << "\" stroke=\"#f0f0f0\"/>\n"
      << "<text x=\"" << X(x) << "\" y=\"" << top + ph + 16
      << "\" text-anchor=\"middle\">" << fmt("%g", x) << "</text>\n";
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw
    << "\" height=\"" << ph << "\" fill=\"none\" stroke=\"#888\"/>\n"
    << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 8
    << "\" text-anchor=\"middle\">" << xml_escape(x_label) << "</text>\n"
    << "<text x=\"16\" y=\"" << top + ph / 2
    << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " << top + ph / 2
    << ")\">" << xml_escape(y_label) << "</text>\n";
  int legend = 0;
  for (const auto& c : curves) {
    if (c.points.empty())
      continue;
    o << "<polyline fill=\"none\" stroke=\"" << c.color << "\" stroke-width=\""
      << (c.dots ? 2 : 1.5) << "\" points=\"";
    for (const auto& p : c.points)
      o << fmt("%.1f", X(p.step)) << "," << fmt("%.1f", Y(p.value)) << " ";
    o << "\"/>\n";
    if (c.dots)
      for (const auto& p : c.points)
        o << "<circle cx=\"" << fmt("%.1f", X(p.step)) << "\" cy=\""
          << fmt("%.1f", Y(p.value)) << "\" r=\"3\" fill=\"" << c.color
          << "\"/>\n";
    const double ly = top + 12 + 18 * legend++;
    o << "<line x1=\"" << left + pw + 12 << "\" x2=\"" << left + pw + 32
      << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\"" << c.color
      << "\" stroke-width=\"3\"/>\n"
      << "<text x=\"" << left + pw + 38 << "\" y=\"" << ly + 4 << "\">"
      << xml_escape(c.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string system_section(const DeviceInfo& device) {
  SystemMemory ram = probe_system_memory();
  std::string md = "| | |\n|---|---|\n";
  md += "| Device | " + md_line(device.name) + " (" + device.kind + ") |\n";
  md += "| Memory | " + format_bytes(ram.total_bytes) + " RAM" +
      (device.kind == "cuda"
           ? ", " + format_bytes(device.total_memory) + " on the GPU"
           : "") +
      " |\n";
  md += "| Threads | " + std::to_string(torch::get_num_threads()) +
      " CPU threads |\n";
  md += std::string("| libtorch | ") + TORCH_VERSION + " |\n";
  md += "| Orchard | " + orchard_version() + " (" + compiler_version() + ", " +
      build_type() + ") |\n";
  return md;
}

// With defaults: result.json files written before a field existed still
// read.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    TrainResult,
    stage,
    run_dir,
    tokenizer_dir,
    step,
    total,
    val_loss,
    val_bpb,
    unigram_loss,
    train_split_loss,
    val_split_loss,
    train_seconds,
    peak_memory_bytes,
    checkpoint_dir,
    init_dir,
    data_description,
    val_shards,
    chat_val,
    output_dir,
    micro_batch,
    trainable_parameters,
    parameters,
    report_rows)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Sample, prompt, output, reference)

void save_stage_result(const StageReport& st) {
  nlohmann::json j = {
      {"result", st.result},
      {"samples", st.samples},
      {"sample_note", st.sample_note}};
  // Samples from a barely trained model can hold bytes that are not UTF-8.
  atomic_write(
      st.result.run_dir + "/result.json",
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::optional<StageReport> saved_stage_result(
    const std::string& run_dir,
    int64_t step) {
  std::ifstream in(run_dir + "/result.json");
  if (!in)
    return std::nullopt;
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  try {
    StageReport st;
    st.result = j.at("result").get<TrainResult>();
    st.samples = j.at("samples").get<std::vector<Sample>>();
    st.sample_note = j.at("sample_note").get<std::string>();
    if (st.result.step != step)
      return std::nullopt;
    st.result.run_dir = run_dir;
    return st;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt; // damaged: the caller reports afresh
  }
}

void write_stage_report(const DeviceInfo& device, const StageReport& st) {
  const TrainResult& r = st.result;
  std::string svg = write_svg(st);
  std::string md = "# Orchard run report: " + r.run_dir + "\n\nWritten " +
      now_text() + ".\n\n## System\n\n" + system_section(device) +
      "\n## Results\n\n" + results_table(st) + "\n## Loss\n\n![loss curves](" +
      svg + ")\n\n";
  std::string samples = samples_section(st);
  if (!samples.empty())
    md += "## Samples\n\n" + samples;
  md += "## Config\n\n```yaml\n" + file_text(r.run_dir + "/config.yaml") +
      "```\n";
  atomic_write(r.run_dir + "/report.md", md);
}

void write_pipeline_report(
    const std::string& path,
    const DeviceInfo& device,
    const std::vector<StageReport>& stages,
    const std::string& preamble) {
  const fs::path where = fs::absolute(fs::path(path)).parent_path();
  std::string md = "# Orchard pipeline report\n\nWritten " + now_text() +
      ".\n\n" + preamble + "\n## System\n\n" + system_section(device) +
      "\n## Summary\n\n| stage | steps | time | tokens/s | peak memory | "
      "validation loss |\n|---|---|---|---|---|---|\n";
  double total = 0;
  for (const auto& st : stages) {
    const TrainResult& r = st.result;
    total += r.train_seconds;
    md += "| " + r.stage + " | " + std::to_string(r.step) + " | " +
        duration(r.train_seconds) + " | " +
        fmt("%.0f", read_run_metrics(r.run_dir).median_tokens_per_s) + " | " +
        format_bytes(r.peak_memory_bytes) + " | " +
        (r.stage == "grpo" ? "reward " + fmt("%.4f", -r.val_loss)
                           : fmt("%.4f", r.val_loss)) +
        " |\n";
  }
  md += "| total | | " + duration(total) + " | | | |\n\n";
  for (const auto& st : stages) {
    const TrainResult& r = st.result;
    std::string svg = write_svg(st);
    write_stage_report(device, st);
    std::string rel =
        fs::relative(fs::absolute(r.run_dir) / svg, where).generic_string();
    md += "## " + r.stage + "\n\n" + results_table(st) + "\n![" + r.stage +
        " loss](" + rel + ")\n\n" + samples_section(st);
  }
  atomic_write(path, md);
}

} // namespace orchard::train
