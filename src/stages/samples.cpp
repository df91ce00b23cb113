#include "stages/samples.h"

#include "dist/world.h"
#include "infer/chat.h"
#include "infer/engine.h"

#include <cstdio>
#include <filesystem>

namespace orchard::stages {
namespace {

// Short answers: samples show what the model says, not how long it goes on.
constexpr int64_t kAnswerTokens = 48;
constexpr int64_t kContinuationTokens = 32;
constexpr int64_t kDocumentPromptTokens = 6;
constexpr double kSampleTemperature = 0.7;

infer::SamplingOptions sample_options(int64_t seed, int64_t max_new) {
  infer::SamplingOptions opt;
  opt.max_new_tokens = max_new;
  opt.temperature = kSampleTemperature;
  opt.seed = uint64_t(seed);
  return opt;
}

} // namespace

std::vector<train::Sample> draw_samples(
    const runs::LoadedModel& model,
    const SampleSource& source,
    int count,
    int64_t seed,
    std::string* note) {
  std::vector<train::Sample> out;
  if (!source.chat_val.empty()) {
    if (note)
      *note =
          "answers to held-out questions (the model never trained on "
          "these conversations)";
    for (auto& s : infer::sample_chat_answers(
             model,
             source.chat_val,
             count,
             sample_options(seed, kAnswerTokens)))
      out.push_back({s.question, s.answer, s.reference});
  } else {
    if (note)
      *note = "continuations of held-out documents (the prompt in bold)";
    for (auto& [prompt, text] : infer::sample_validation_documents(
             model,
             source.val_shards,
             count,
             kDocumentPromptTokens,
             sample_options(seed, kContinuationTokens)))
      out.push_back({prompt, text, ""});
  }
  return out;
}

void print_samples(const std::vector<train::Sample>& samples) {
  for (const auto& s : samples) {
    if (s.reference.empty()) {
      std::printf("  [%s]%s\n", s.prompt.c_str(), s.output.c_str());
    } else {
      std::printf(
          "  Q: %s\n  A: %s\n     (reference: %s)\n",
          s.prompt.c_str(),
          s.output.c_str(),
          s.reference.c_str());
    }
  }
  std::fflush(stdout);
}

train::StageReport finish_stage(
    train::StageReport report,
    const DeviceInfo& device,
    const std::function<void(train::StageReport&)>& draw) {
  const train::TrainResult& r = report.result;
  if (r.interrupted || !dist::leader()) // rank 0 alone samples and reports
    return report;
  if (r.already_done) {
    if (auto saved = train::saved_stage_result(r.run_dir, r.step)) {
      saved->result.already_done = true;
      return *saved;
    }
  }
  draw(report);
  const bool has_report = std::filesystem::exists(r.run_dir + "/report.md");
  if (r.already_done && has_report)
    return report; // from before result.json: keep its full report
  std::printf("\nSamples: %s\n", report.sample_note.c_str());
  print_samples(report.samples);
  train::write_stage_report(device, report);
  if (!r.already_done)
    train::save_stage_result(report);
  std::printf("Report: %s/report.md\n", r.run_dir.c_str());
  return report;
}

} // namespace orchard::stages
