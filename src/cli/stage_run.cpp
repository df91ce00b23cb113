// One training stage as `orchard train` and `orchard pipeline` run it:
// samples while training, samples at the end, the run report.
#include "cli/common.h"
#include "infer/chat.h"
#include "infer/engine.h"

#include <cstdio>

namespace orchard::cli {
namespace {

infer::SamplingOptions sample_options(int64_t seed, int64_t max_new) {
  infer::SamplingOptions opt;
  opt.max_new_tokens = max_new;
  opt.temperature = 0.7;
  opt.seed = uint64_t(seed);
  return opt;
}

std::vector<train::Sample> draw_samples(
    const infer::LoadedModel& model,
    const train::SampleSource& source,
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
             model, source.chat_val, count, sample_options(seed, 48)))
      out.push_back({s.question, s.answer, s.reference});
  } else {
    if (note)
      *note = "continuations of held-out documents (the prompt in bold)";
    for (auto& [prompt, text] : infer::sample_validation_documents(
             model, source.val_shards, count, 6, sample_options(seed, 32)))
      out.push_back({prompt, text, ""});
  }
  return out;
}

} // namespace

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

train::StageReport run_stage(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device,
    int final_samples) {
  // Samples during training (sample_every), with the weights evaluation
  // uses.
  auto hook = [&cfg](
                  const models::Gpt& model,
                  const std::string& tokenizer_dir,
                  const train::SampleSource& source,
                  int64_t step) {
    infer::LoadedModel loaded;
    loaded.model = model.ptr();
    loaded.tokenizer_dir = tokenizer_dir;
    std::printf("Samples at step %lld:\n", (long long)step);
    print_samples(draw_samples(loaded, source, 2, cfg.seed, nullptr));
  };
  train::StageReport report;
  report.result = train::run_training(cfg, origins, device, hook);
  const train::TrainResult& r = report.result;
  if (r.interrupted)
    return report;
  infer::LoadedModel model = infer::load_trained_model(r.run_dir);
  model.model->to(device.device);
  report.samples = draw_samples(
      model,
      {r.val_shards, r.chat_val},
      final_samples,
      cfg.seed,
      &report.sample_note);
  if (!r.already_done) {
    std::printf("\nSamples: %s\n", report.sample_note.c_str());
    print_samples(report.samples);
  }
  train::write_stage_report(device, report);
  if (!r.already_done)
    std::printf("Report: %s/report.md\n", r.run_dir.c_str());
  return report;
}

} // namespace orchard::cli
