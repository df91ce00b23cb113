#include "infer/engine.h"

#include "core/error.h"
#include "data/shards.h"
#include "text/tokenizer_io.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <filesystem>

namespace orchard::infer {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

} // namespace

int64_t sample_token(
    const torch::Tensor& logits_in,
    const SamplingOptions& opt,
    torch::Generator& gen) {
  auto logits = logits_in.to(torch::kCPU, torch::kFloat32).view({-1});
  if (opt.temperature <= 0)
    return logits.argmax().item<int64_t>();
  logits = logits / opt.temperature;
  if (opt.top_k > 0 && opt.top_k < logits.size(0)) {
    auto kth = std::get<0>(logits.topk(opt.top_k)).min();
    logits = logits.masked_fill(
        logits < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, -1);
  if (opt.top_p < 1.0) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    auto before =
        sorted.cumsum(-1) - sorted; // mass of strictly likelier tokens
    sorted = sorted.masked_fill(before >= opt.top_p, 0.0); // keeps at least one
    probs = torch::zeros_like(probs).scatter(0, order, sorted);
  }
  return torch::multinomial(probs, 1, /*replacement=*/false, gen)
      .item<int64_t>();
}

std::string sampling_problem(const SamplingOptions& o) {
  if (o.temperature >= 0 && o.temperature <= kMaxTemperature && o.top_p > 0 &&
      o.top_p <= 1 && o.top_k >= 0 && o.top_k <= kMaxTopK &&
      o.max_new_tokens >= 1)
    return "";
  return "--temperature must be in [0, " +
      std::to_string(int(kMaxTemperature)) +
      "], --top-p in (0, 1], --top-k in [0, " + std::to_string(kMaxTopK) +
      "] and --max-new-tokens >= 1.";
}

Engine::Engine(
    std::shared_ptr<models::LanguageModel> model,
    torch::Device device)
    : model_(std::move(model)), device_(device) {
  model_->to(device_);
  model_->eval();
}

std::vector<int64_t> Engine::generate(
    const std::vector<int64_t>& prompt,
    const SamplingOptions& opt,
    const std::function<bool(int64_t)>& on_token,
    bool use_cache,
    GenerationStats* stats) {
  if (prompt.empty())
    throw UserError("the prompt is empty.");
  const int64_t max_len = model_->max_seq_len();
  if (int64_t(prompt.size()) >= max_len)
    throw UserError(
        "the prompt is " + std::to_string(prompt.size()) +
        " tokens; the model reads at most " + std::to_string(max_len) +
        ". Shorten it.");
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  std::vector<int64_t> seq = prompt, out;
  models::KvCache cache;
  auto ids = [&](const std::vector<int64_t>& v, size_t from) {
    return torch::tensor(
               std::vector<int64_t>(v.begin() + from, v.end()), torch::kInt64)
        .view({1, -1})
        .to(device_);
  };
  double t0 = now_s();
  torch::Tensor logits = use_cache ? model_->forward(ids(seq, 0), &cache)
                                   : model_->forward(ids(seq, 0));
  double t1 = now_s();
  while (int64_t(out.size()) < opt.max_new_tokens &&
         int64_t(seq.size()) < max_len) {
    int64_t next = sample_token(logits[0][logits.size(1) - 1], opt, gen);
    seq.push_back(next);
    out.push_back(next);
    bool keep_going = !on_token || on_token(next);
    if (!keep_going ||
        std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), next) !=
            opt.stop_tokens.end())
      break;
    if (int64_t(out.size()) >= opt.max_new_tokens ||
        int64_t(seq.size()) >= max_len)
      break;
    logits = use_cache ? model_->forward(ids(seq, seq.size() - 1), &cache)
                       : model_->forward(ids(seq, 0));
  }
  if (stats) {
    stats->prompt_tokens = int64_t(prompt.size());
    stats->new_tokens = int64_t(out.size());
    stats->prefill_seconds = t1 - t0;
    stats->decode_seconds = now_s() - t1;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> sample_validation_documents(
    const runs::LoadedModel& loaded,
    const std::vector<std::string>& val_shards,
    int count,
    int64_t prompt_tokens,
    const SamplingOptions& opt) {
  const text::Tokenizer& tok = *loaded.tokenizer;
  auto bos = tok.document_start();
  std::vector<std::pair<std::string, std::string>> out;
  if (!bos || val_shards.empty())
    return out;
  // On the device the weights are on (the GPU while training samples).
  Engine engine(loaded.model, loaded.model->device());
  SamplingOptions o = opt;
  o.stop_tokens.push_back(*bos);
  data::Shard shard = data::Shard::open(val_shards.front());
  for (size_t i = 0; i < shard.size() && int(out.size()) < count; ++i) {
    if (shard[i] != *bos || i + 1 + size_t(prompt_tokens) > shard.size())
      continue;
    std::vector<int64_t> prompt;
    std::vector<text::TokenId> prompt_ids;
    for (int64_t k = 0; k <= prompt_tokens; ++k) {
      prompt.push_back(shard[i + k]);
      if (k > 0)
        prompt_ids.push_back(shard[i + k]);
    }
    auto ids = engine.generate(prompt, o);
    std::vector<text::TokenId> gen;
    for (auto id : ids)
      if (id != int64_t(*bos))
        gen.push_back(text::TokenId(id));
    out.push_back({tok.decode(prompt_ids), tok.decode(gen)});
  }
  return out;
}

} // namespace orchard::infer
