#include "train/pretrain.h"

#include "core/error.h"
#include "core/files.h"
#include "core/progress.h"
#include "data/loader.h"
#include "models/gpt.h"
#include "text/tokenizer_io.h"
#include "train/checkpoint.h"
#include "train/data_cache.h"
#include "train/schedule.h"
#include "train/train_state.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace orchard::train {
namespace {
namespace fs = std::filesystem;

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

// SIGINT/SIGTERM set a flag; the loop finishes its step, saves and exits.
struct SignalGuard {
  struct sigaction old_int {
  }, old_term{};
  SignalGuard() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

// Prints to the terminal and appends to train.log.
struct RunLog {
  std::ofstream file;
  explicit RunLog(const std::string& path) : file(path, std::ios::app) {}
  void operator()(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    file << line << "\n";
    file.flush();
  }
};

// A number from state.json, or `fallback` when it is absent or null (NaN
// and infinity are written as null).
double number_or(const nlohmann::json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>()
                                               : fallback;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Until the memory planner lands: the largest of 8, 4, 2, 1 sequences that
// divides the batch.
int64_t auto_device_batch(int64_t total, int64_t seq_len) {
  for (int64_t b : {8, 4, 2, 1})
    if (total % (b * seq_len) == 0 && total >= b * seq_len)
      return b;
  return 1;
}

// Bytes each token stands for (0 for special tokens), for bits per byte.
torch::Tensor token_byte_counts(const text::Tokenizer& tok, int64_t vocab) {
  auto counts = torch::zeros({vocab}, torch::kFloat64);
  auto acc = counts.accessor<double, 1>();
  std::string bytes;
  for (int64_t id = 0; id < vocab; ++id)
    if (tok.token_bytes(text::TokenId(id), bytes))
      acc[id] = double(bytes.size());
  for (const auto& [text, id] : tok.special_tokens())
    if (id < vocab)
      acc[id] = 0;
  return counts;
}

// Cross-entropy of the validation tokens under the training tokens' unigram
// distribution (add-one smoothed): what a model that ignores context gets.
double unigram_loss(
    const std::vector<std::string>& train,
    const std::vector<std::string>& val,
    int64_t vocab) {
  std::vector<double> count(vocab, 1.0);
  double total = double(vocab);
  for (const auto& p : train) {
    auto s = data::Shard::open(p);
    for (size_t i = 0; i < s.size(); ++i) {
      count[s[i]] += 1;
      total += 1;
    }
  }
  double nll = 0;
  size_t n = 0;
  for (const auto& p : val) {
    auto s = data::Shard::open(p);
    for (size_t i = 1; i < s.size(); ++i, ++n)
      nll -= std::log(count[s[i]] / total);
  }
  return n ? nll / double(n) : 0;
}

} // namespace

PretrainResult run_pretraining(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    const DeviceInfo& device) {
  if (cfg.dtype != "auto" && cfg.dtype != "float32")
    throw UserError(
        "dtype=" + cfg.dtype +
        ": `orchard train` runs in float32 for now (mixed precision is not "
        "built yet); use dtype=float32 or auto.");
  const torch::Device dev = device.device;
  // Batch arithmetic first: a batch that does not divide fails before any
  // data is prepared.
  const int64_t B = cfg.device_batch_size.value_or(
      auto_device_batch(cfg.total_batch_size, cfg.max_seq_len));
  const int64_t T = cfg.max_seq_len;
  const int64_t accum = grad_accum_steps(cfg.total_batch_size, B, T);
  auto say_early = [](const std::string& s) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  };
  PreparedData data = prepare_pretraining_data(cfg, say_early);
  text::Tokenizer tok = text::load_tokenizer(data.tokenizer_dir);

  models::GptConfig mc =
      models::resolve_gpt_config(cfg, int64_t(tok.vocab_size()));
  PretrainResult result;
  result.run_dir = !cfg.run_dir.empty()
      ? cfg.run_dir
      : "runs/" + (cfg.run.empty() ? mc.tag() : cfg.run);
  fs::create_directories(result.run_dir);
  RunLog log(result.run_dir + "/train.log");
  PretrainConfig resolved = cfg;
  resolved.device_batch_size = B;
  config::write_yaml(
      result.run_dir + "/config.yaml", pretrain_schema(), &resolved, origins);

  torch::manual_seed(cfg.seed);
  models::Gpt model(mc);
  model->to(dev);
  data::TokenLoader train(
      data.train_shards, B, T, /*shuffle=*/true, uint64_t(cfg.seed));
  const int64_t total = cfg.num_iterations.value_or(
      std::max<int64_t>(1, int64_t(train.steps_per_epoch()) / accum));
  result.total = total;
  result.val_shards = data.val_shards;

  // AdamW with three groups: matrices (decayed), embedding, lm_head.
  std::vector<torch::Tensor> matrices, embedding = {model->wte->weight},
                                       head = {model->lm_head->weight};
  for (const auto& p : model->blocks->parameters())
    matrices.push_back(p);
  auto group = [&](std::vector<torch::Tensor> params, double lr, double wd) {
    return torch::optim::OptimizerParamGroup(
        std::move(params),
        std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(lr)
                .betas({0.8, 0.95})
                .eps(1e-10)
                .weight_decay(wd)));
  };
  std::vector<double> base_lr = {cfg.lr, cfg.embedding_lr, cfg.unembedding_lr};
  torch::optim::AdamW opt(
      {group(matrices, cfg.lr, cfg.weight_decay),
       group(embedding, cfg.embedding_lr, 0.0),
       group(head, cfg.unembedding_lr, 0.0)},
      torch::optim::AdamWOptions(cfg.lr));

  // EMA of the weights, for evaluation and the final model.
  std::vector<torch::Tensor> ema;
  if (cfg.ema)
    for (const auto& p : model->parameters())
      ema.push_back(p.detach().clone());

  // Resume.
  int64_t start = 0;
  double best_val = std::numeric_limits<double>::infinity();
  int64_t best_step = -1;
  std::optional<Checkpoint> ckpt;
  if (cfg.resume == "auto") {
    std::vector<std::string> skipped;
    ckpt = latest_checkpoint(result.run_dir, &skipped);
    for (const auto& s : skipped)
      log("Warning: " + s);
  } else if (cfg.resume != "never") {
    ckpt = load_checkpoint(cfg.resume);
  }
  if (ckpt) {
    torch::NoGradGuard no_grad;
    auto params = model->named_parameters();
    for (auto& named : params) {
      auto it = ckpt->model.find(named.key());
      if (it == ckpt->model.end() ||
          it->second.sizes() != named.value().sizes())
        throw UserError(
            "checkpoint " + ckpt->dir + " does not fit this model ('" +
            named.key() +
            "' missing or of another shape): the architecture settings changed. "
            "Use the original settings, another run name, or resume=never.");
      named.value().copy_(it->second);
    }
    for (size_t i = 0; i < ema.size(); ++i) {
      auto it = ckpt->model.find("ema." + params[i].key());
      if (it != ckpt->model.end())
        ema[i].copy_(it->second);
    }
    load_adamw_state(opt, *model, ckpt->optimizer);
    load_rng_state(ckpt->optimizer);
    const auto& ld = ckpt->state.at("loader");
    train.restore(
        {ld.at("epoch").get<uint64_t>(), ld.at("step").get<uint64_t>()});
    start = ckpt->step;
    best_val = number_or(ckpt->state, "best_val_loss", best_val);
    best_step = int64_t(number_or(ckpt->state, "best_step", -1));
    log("Resuming from " + ckpt->dir + " (step " + std::to_string(start) +
        " of " + std::to_string(total) + ").");
    if (start >= total) {
      result.already_done = true;
      result.step = start;
      result.val_loss = number_or(ckpt->state, "val_loss", 0.0);
      result.val_bpb = number_or(ckpt->state, "val_bpb", 0.0);
      log("This run is already complete at step " + std::to_string(start) +
          "; raise num_iterations to train further, or use another run name.");
      return result;
    }
  }

  log("Data: " + data.description + "; tokenizer " + data.tokenizer_dir + " (" +
      std::to_string(tok.vocab_size()) + " tokens)");
  log("Model: " + mc.tag() + ", " + std::to_string(model->num_parameters()) +
      " parameters (" + std::to_string(mc.n_layer) + " layers, width " +
      std::to_string(mc.n_embd) + ", " + std::to_string(mc.n_head) +
      " heads, " + std::to_string(mc.n_kv_head) + " kv heads)");
  log("Batch: " + std::to_string(B) + " x " + std::to_string(T) +
      " tokens per micro-step" + (cfg.device_batch_size ? "" : " (auto)") +
      ", " + std::to_string(accum) + " accumulation step(s), " +
      std::to_string(cfg.total_batch_size) + " tokens per step; " +
      std::to_string(total) + " steps; run folder " + result.run_dir);

  // Evaluation batches: the micro-batch, or fewer rows when the validation
  // split is small. Checked now, not after training.
  const int64_t eval_batch = std::min<int64_t>(
      B, int64_t(data::TokenLoader::count_windows(data.val_shards, T)));
  if (eval_batch < 1)
    throw UserError(
        "the validation split holds fewer than max_seq_len + 1 = " +
        std::to_string(T + 1) +
        " tokens; give more text or a shorter max_seq_len.");
  auto byte_counts = token_byte_counts(tok, mc.vocab_size).to(dev);
  auto evaluate = [&]() -> std::pair<double, double> {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> saved;
    if (!ema.empty()) { // evaluate the EMA weights
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        saved.push_back(params[i].detach().clone());
        params[i].copy_(ema[i]);
      }
    }
    data::TokenLoader val(data.val_shards, eval_batch, T, false, 0);
    int64_t steps = std::max<int64_t>(
        1,
        std::min<int64_t>(
            cfg.eval_tokens / (eval_batch * T),
            int64_t(val.steps_per_epoch())));
    double nats = 0, bytes = 0, loss_total = 0, count = 0;
    for (int64_t s = 0; s < steps; ++s) {
      auto b = val.next();
      auto x = b.x.to(dev), y = b.y.to(dev);
      auto logits = model->forward(x);
      auto loss =
          torch::nn::functional::cross_entropy(
              logits.view({-1, logits.size(-1)}),
              y.view({-1}),
              torch::nn::functional::CrossEntropyFuncOptions().reduction(
                  torch::kNone))
              .to(torch::kFloat64);
      auto nb = byte_counts.index_select(0, y.view({-1}));
      nats += (loss * (nb > 0)).sum().item<double>();
      bytes += nb.sum().item<double>();
      loss_total += loss.sum().item<double>();
      count += double(y.numel());
    }
    double mean_loss = loss_total / count;
    if (!saved.empty()) {
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        params[i].copy_(saved[i]);
    }
    return {mean_loss, bytes > 0 ? nats / (std::log(2.0) * bytes) : 0.0};
  };

  auto save =
      [&](int64_t step, double val_loss, double val_bpb, bool complete) {
        NamedTensors model_t, opt_t;
        auto params = model->named_parameters();
        for (auto& p : params)
          model_t.push_back({p.key(), p.value()});
        for (size_t i = 0; i < ema.size(); ++i)
          model_t.push_back({"ema." + params[i].key(), ema[i]});
        opt_t = adamw_state(opt, *model);
        for (auto& r : rng_state())
          opt_t.push_back(r);
        auto ls = train.state();
        nlohmann::json state = {
            {"total_steps", total},
            {"loader", {{"epoch", ls.epoch}, {"step", ls.step}}},
            {"val_loss", val_loss},
            {"val_bpb", val_bpb},
            {"best_val_loss", best_val},
            {"best_step", best_step},
            {"complete", complete},
            {"model",
             {{"n_layer", mc.n_layer},
              {"n_embd", mc.n_embd},
              {"n_head", mc.n_head},
              {"n_kv_head", mc.n_kv_head},
              {"vocab_size", mc.vocab_size},
              {"max_seq_len", mc.max_seq_len}}},
            {"tokenizer", data.tokenizer_dir}};
        std::string dir =
            save_checkpoint(result.run_dir, step, model_t, opt_t, state);
        prune_checkpoints(
            result.run_dir,
            cfg.save_total_limit,
            cfg.keep_best && best_step >= 0 ? std::optional<int64_t>(best_step)
                                            : std::nullopt);
        return dir;
      };

  MetricsWriter metrics(result.run_dir + "/metrics.jsonl");
  SignalGuard signals;
  ProgressLine progress;
  double val_loss = std::nan(""), val_bpb = std::nan("");
  int64_t last_saved = start;
  for (int64_t step = start; step < total; ++step) {
    double t0 = now_s();
    double mult =
        lr_multiplier(step, total, cfg.warmup_steps, cfg.warmdown_ratio);
    for (size_t g = 0; g < opt.param_groups().size(); ++g)
      static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[g].options())
          .lr(base_lr[g] * mult);
    opt.zero_grad();
    double loss_sum = 0;
    for (int64_t m = 0; m < accum; ++m) {
      auto b = train.next();
      auto loss = model->loss(b.x.to(dev), b.y.to(dev)) / double(accum);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    if (cfg.grad_clip > 0)
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
    opt.step();
    if (!ema.empty()) {
      torch::NoGradGuard no_grad;
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        ema[i].mul_(cfg.ema_rate).add_(params[i].detach(), 1.0 - cfg.ema_rate);
    }
    const int64_t done = step + 1;
    double dt = now_s() - t0;
    double tok_s = double(cfg.total_batch_size) / std::max(dt, 1e-9);
    progress.update(
        {.step = done,
         .total = total,
         .loss = loss_sum,
         .lr = cfg.lr * mult,
         .tokens_per_s = tok_s});
    metrics.write(
        {{"step", double(done)},
         {"loss", loss_sum},
         {"lr", cfg.lr * mult},
         {"tokens_per_s", tok_s}});
    if (cfg.eval_every > 0 && done % cfg.eval_every == 0 && done != total) {
      std::tie(val_loss, val_bpb) = evaluate();
      if (val_loss < best_val) {
        best_val = val_loss;
        best_step = done;
      }
      progress.message(
          "step " + std::to_string(done) + ": val loss " +
          fmt("%.4f", val_loss) + ", " + fmt("%.4f", val_bpb) +
          " bits per byte");
      log.file << "step " << done << ": val loss " << val_loss << ", bpb "
               << val_bpb << "\n";
      metrics.write(
          {{"step", double(done)},
           {"val_loss", val_loss},
           {"val_bpb", val_bpb}});
    }
    bool stop = g_stop_signal != 0;
    if ((cfg.save_every > 0 && done % cfg.save_every == 0 && done != total) ||
        stop) {
      save(done, val_loss, val_bpb, false);
      last_saved = done;
    }
    if (stop) {
      progress.finish();
      log(std::string("Stopped by ") +
          (g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM") + " after step " +
          std::to_string(done) +
          "; saved a checkpoint. Run the same "
          "command again to resume from step " +
          std::to_string(done) + ".");
      result.step = done;
      result.interrupted = true;
      return result;
    }
  }
  (void)last_saved;
  progress.finish();
  std::tie(val_loss, val_bpb) = evaluate();
  if (val_loss < best_val) {
    best_val = val_loss;
    best_step = total;
  }
  metrics.write(
      {{"step", double(total)}, {"val_loss", val_loss}, {"val_bpb", val_bpb}});
  std::string dir = save(total, val_loss, val_bpb, true);
  result.step = total;
  result.val_loss = val_loss;
  result.val_bpb = val_bpb;
  result.unigram_loss =
      unigram_loss(data.train_shards, data.val_shards, mc.vocab_size);
  log("Done: step " + std::to_string(total) + ", validation loss " +
      fmt("%.4f", val_loss) + " (" + fmt("%.4f", val_bpb) +
      " bits per byte); a unigram model scores " +
      fmt("%.4f", result.unigram_loss) + ". Final checkpoint: " + dir);
  return result;
}

} // namespace orchard::train
