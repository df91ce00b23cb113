// The progress line (terminal and plain modes, with a fake clock) and the
// metrics.jsonl writer.
#include "core/progress.h"
#include "core/error.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace orchard {
namespace {

// Collects what a ProgressLine prints (through a memory stream).
struct Captured {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = ::open_memstream(&buf, &size);
  ~Captured() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

TEST(Progress, TextHasEveryField) {
  ProgressStats s;
  s.step = 120;
  s.total = 500;
  s.loss = 3.41234;
  s.lr = 6e-4;
  s.tokens_per_s = 41234;
  s.s_per_it = 0.4;
  s.memory_bytes = 3ull * 1024 * 1024 * 1024;
  EXPECT_EQ(
      progress_text(s),
      "step 120/500 | loss 3.4123 | lr 6.00e-04 | 41.2K tok/s | 0.40 s/it | "
      "ETA 2m32s | mem 3.0 GiB");
  ProgressStats bare;
  bare.step = 7;
  EXPECT_EQ(progress_text(bare), "step 7");
}

TEST(Progress, Durations) {
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(152), "2m32s");
  EXPECT_EQ(format_duration(3840), "1h04m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_rate(1.3e6), "1.30M");
  EXPECT_EQ(format_rate(12.25), "12.2");
}

TEST(Progress, TerminalRedrawsInPlace) {
  Captured cap;
  double t = 0;
  {
    ProgressLine line(cap.f, true, 10, [&] { return t; });
    for (int i = 1; i <= 3; ++i) {
      t += 2;
      line.update({.step = i, .total = 3});
    }
  }
  EXPECT_EQ(
      cap.text(),
      "\r\033[Kstep 1/3 | 2.00 s/it | ETA 4s"
      "\r\033[Kstep 2/3 | 2.00 s/it | ETA 2s"
      "\r\033[Kstep 3/3 | 2.00 s/it | ETA 0s\n");
}

TEST(Progress, PlainOutputPrintsFirstLastAndEveryInterval) {
  Captured cap;
  double t = 0;
  {
    ProgressLine line(cap.f, false, 10, [&] { return t; });
    for (int i = 1; i <= 30; ++i) {
      t += 1;
      line.update({.step = i, .total = 30});
    }
  }
  std::string text = cap.text();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  // Step 1 at t=1, then every 10 s: steps 11 and 21, then the last.
  EXPECT_EQ(
      text,
      "step 1/30 | 1.00 s/it | ETA 29s\n"
      "step 11/30 | 1.00 s/it | ETA 19s\n"
      "step 21/30 | 1.00 s/it | ETA 9s\n"
      "step 30/30 | 1.00 s/it | ETA 0s\n");
}

TEST(Progress, ResumedRunMeasuresFromItsFirstStep) {
  Captured cap;
  double t = 100;
  ProgressLine line(cap.f, false, 1000, [&] { return t; });
  t += 3;
  line.update({.step = 501, .total = 600}); // resumed at 500
  EXPECT_EQ(cap.text(), "step 501/600 | 3.00 s/it | ETA 4m57s\n");
}

TEST(Progress, MessagesKeepTheLineIntact) {
  Captured cap;
  double t = 0;
  ProgressLine line(cap.f, true, 10, [&] { return t; });
  t = 1;
  line.update({.step = 1, .total = 2});
  line.message("saved checkpoint");
  EXPECT_EQ(
      cap.text(),
      "\r\033[Kstep 1/2 | 1.00 s/it | ETA 1s"
      "\r\033[Ksaved checkpoint\nstep 1/2 | 1.00 s/it | ETA 1s");
}

TEST(Metrics, OneJsonObjectPerLine) {
  test::TempDir dir;
  std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter w(path);
    w.write({{"step", 1}, {"loss", 3.25}});
    w.write({{"step", 2}, {"loss", std::nan("")}});
  }
  std::istringstream in(test::read_text(path));
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line))
    rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0]["step"].is_number_integer());
  EXPECT_EQ(rows[0]["step"], 1);
  EXPECT_DOUBLE_EQ(rows[0]["loss"].get<double>(), 3.25);
  EXPECT_TRUE(rows[1]["loss"].is_null());
  // Appends: a resumed run continues the same file.
  MetricsWriter again(path);
  again.write({{"step", 3}});
  std::string all = test::read_text(path);
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 3);
  EXPECT_THROW(MetricsWriter(dir.file("no/such/dir/m.jsonl")), UserError);
}

} // namespace
} // namespace orchard
