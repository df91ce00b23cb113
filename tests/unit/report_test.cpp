// Run reports: metrics read back as a resumed run wrote them, the SVG
// chart, and report.md's sections.
#include "train/report.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace orchard {
namespace {

TEST(Report, MetricsKeepTheLaterRowOfAStepAndSkipATornLine) {
  test::TempDir dir;
  // Steps 1-3, a crash (torn last line), a resume from step 2.
  dir.write(
      "run/metrics.jsonl",
      "{\"step\":1,\"loss\":5.0,\"tokens_per_s\":10}\n"
      "{\"step\":2,\"loss\":4.0,\"tokens_per_s\":100}\n"
      "{\"step\":2,\"val_loss\":4.5}\n"
      "{\"step\":3,\"loss\":3.9,\"tokens_per_s\":100}\n"
      "{\"step\":4,\"lo\n"
      "{\"step\":3,\"loss\":3.5,\"tokens_per_s\":200}\n"
      "{\"step\":4,\"loss\":3.0,\"tokens_per_s\":300}\n");
  auto m = train::read_run_metrics(dir.file("run"));
  ASSERT_EQ(m.train_loss.size(), 4u);
  EXPECT_DOUBLE_EQ(m.train_loss[2].value, 3.5); // the resumed run's
  EXPECT_DOUBLE_EQ(m.train_loss[3].value, 3.0);
  ASSERT_EQ(m.val_loss.size(), 1u);
  EXPECT_DOUBLE_EQ(m.val_loss[0].value, 4.5);
  // Median over steps after the first: {100, 200, 300}.
  EXPECT_DOUBLE_EQ(m.median_tokens_per_s, 200);
  auto none = train::read_run_metrics(dir.file("missing"));
  EXPECT_TRUE(none.train_loss.empty());
}

TEST(Report, SmoothingIsADebiasedMovingAverage) {
  std::vector<train::MetricPoint> p = {{1, 4}, {2, 2}};
  auto s = train::smooth(p, 0.5);
  EXPECT_DOUBLE_EQ(s[0].value, 4); // debiased: the first point itself
  // (0.5 * (0.5 * 4) + 0.5 * 2) / (1 - 0.25) = 2 / 0.75
  EXPECT_NEAR(s[1].value, 2.0 / 0.75, 1e-12);
}

TEST(Report, SvgChartDrawsEachCurveWithinItsBox) {
  std::vector<train::Curve> curves = {
      {"train", "#123456", {{0, 5}, {10, 3}, {20, 2}}},
      {"val <b>", "#654321", {{10, 3.5}, {20, 2.5}}, true}};
  auto svg = train::svg_chart("loss & more", curves, "step", "loss");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t lines = 0, dots = 0;
  for (size_t at = 0; (at = svg.find("<polyline", at)) != std::string::npos;
       ++at)
    ++lines;
  for (size_t at = 0; (at = svg.find("<circle", at)) != std::string::npos; ++at)
    ++dots;
  EXPECT_EQ(lines, 2u);
  EXPECT_EQ(dots, 2u);
  EXPECT_NE(svg.find("loss &amp; more"), std::string::npos); // escaped
  EXPECT_NE(svg.find("val &lt;b&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  // Every plotted x lies inside the plot box (64 .. 550).
  size_t at = svg.find("points=\"");
  double x = std::stod(svg.substr(at + 8));
  EXPECT_NEAR(x, 64, 1e-6); // step 0 on the left edge
}

TEST(Report, StageReportHoldsEverySection) {
  test::TempDir dir;
  dir.write("run/config.yaml", "depth: 1\n");
  dir.write(
      "run/metrics.jsonl",
      "{\"step\":1,\"loss\":5.0}\n{\"step\":2,\"loss\":4.0}\n");
  train::StageReport st;
  st.result.stage = "sft";
  st.result.run_dir = dir.file("run");
  st.result.step = st.result.total = 2;
  st.result.val_loss = 3.25;
  st.result.peak_memory_bytes = 3u << 20;
  st.result.train_seconds = 75;
  st.result.init_dir = "runs/mid/d1/checkpoints/step_000002";
  st.samples = {{"What is *x*?", "a | b", "ref"}};
  st.sample_note = "answers to held-out questions";
  DeviceInfo d;
  d.kind = "cpu";
  d.name = "CPU (test)";
  train::write_stage_report(d, st);
  auto md = test::read_text(dir.file("run/report.md"));
  for (const char* part :
       {"## System",
        "CPU (test)",
        "libtorch",
        "## Results",
        "1 min 15 s",
        "3.0 MiB",
        "3.2500",
        "runs/mid/d1/checkpoints/step_000002",
        "![loss curves](loss.svg)",
        "What is \\*x\\*?",
        "a \\| b",
        "```yaml\ndepth: 1\n```"})
    EXPECT_NE(md.find(part), std::string::npos) << part << "\n" << md;
  EXPECT_NE(
      test::read_text(dir.file("run/loss.svg")).find("<polyline"),
      std::string::npos);
}

} // namespace
} // namespace orchard
