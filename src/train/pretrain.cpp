#include "train/pretrain.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/torch_compat.h"
#include "data/loader.h"
#include "data/text_prep.h"
#include "dist/world.h"
#include "runs/load.h"
#include "runs/run_folder.h"
#include "text/tokenizer_io.h"
#include "train/data_cache.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/schedule.h"
#include "train/stage_data.h"
#include "train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace orchard::train {
namespace {
namespace fs = std::filesystem;

// Learning rates of the matrices when `lr` is auto.
constexpr double kAdamwMatrixLr = 3e-3;
constexpr double kMuonMatrixLr = 0.02; // nanochat's and modded-nanogpt's
// sft fine-tunes a model that already speaks the format: gentler steps.
constexpr double kSftLrScale = 0.2;

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

// Later sources win (config::source_precedence); a value never set is 0.
int source_rank(const config::Origins& origins, const std::string& key) {
  auto it = origins.find(key);
  return it == origins.end() ? 0 : config::source_precedence(it->second);
}

// The loss of every target token (float64), for exact sums over many
// batches.
torch::Tensor token_losses(
    models::Gpt& model,
    const torch::Tensor& x,
    const torch::Tensor& y) {
  auto logits = model->forward(x);
  return torch::nn::functional::cross_entropy(
             logits.view({-1, logits.size(-1)}).to(torch::kFloat32),
             y,
             torch::nn::functional::CrossEntropyFuncOptions().reduction(
                 torch::kNone))
      .to(torch::kFloat64);
}

struct SplitLoss {
  double loss = 0, bpb = 0;
};

// Mean loss and bits per byte over up to `tokens` tokens of `shards`, read
// in order from the start.
SplitLoss split_loss(
    models::Gpt& model,
    const std::vector<std::string>& shards,
    int64_t batch,
    int64_t seq_len,
    int64_t tokens,
    const torch::Tensor& byte_counts,
    const torch::Device& dev) {
  data::TokenLoader loader(shards, batch, seq_len, false, 0);
  const int64_t steps = std::max<int64_t>(
      1,
      std::min<int64_t>(
          tokens / (batch * seq_len), int64_t(loader.steps_per_epoch())));
  torch::Tensor nats = torch::zeros({}, torch::kFloat64).to(dev),
                bytes = torch::zeros({}, torch::kFloat64).to(dev),
                total = torch::zeros({}, torch::kFloat64).to(dev);
  int64_t count = 0;
  for (int64_t s = 0; s < steps; ++s) {
    auto b = loader.next();
    auto x = b.x.to(dev), y = b.y.to(dev).view({-1});
    auto loss = token_losses(model, x, y);
    auto nb = byte_counts.index_select(0, y);
    nats += (loss * (nb > 0)).sum();
    bytes += nb.sum();
    total += loss.sum();
    count += y.numel();
  }
  const double b = bytes.item<double>();
  return {
      total.item<double>() / double(count),
      b > 0 ? nats.item<double>() / (std::log(2.0) * b) : 0.0};
}

// Mean loss over the answer tokens of up to `tokens` tokens of held-out
// conversations, read in order from the start.
double answer_loss(
    models::Gpt& model,
    const data::ChatFile& file,
    int64_t batch,
    int64_t seq_len,
    bool pack,
    uint32_t pad_id,
    int64_t tokens,
    const torch::Device& dev) {
  data::ChatBatcher loader(file, batch, seq_len, pack, pad_id, false, 0);
  torch::Tensor nats = torch::zeros({}, torch::kFloat64).to(dev),
                count = torch::zeros({}, torch::kFloat64).to(dev);
  int64_t seen = 0;
  do {
    auto b = loader.next();
    if (loader.state().epoch > 0)
      break; // wrapped: every conversation was read
    auto x = b.x.to(dev), y = b.y.to(dev).view({-1});
    auto m = b.loss_mask.to(dev).view({-1}).to(torch::kFloat64);
    auto loss = token_losses(model, x, y);
    nats += (loss * m).sum();
    count += m.sum();
    seen += batch * seq_len;
  } while (seen < tokens);
  const double n = count.item<double>();
  if (n == 0)
    throw UserError(
        "the held-out conversations in " + file.path() +
        " have no answer tokens to evaluate; check the chat data.");
  return nats.item<double>() / n;
}

} // namespace

PlanSettings plan_settings(
    const PretrainConfig& cfg,
    const Precision& precision,
    const DeviceInfo& device) {
  PlanSettings s;
  s.seq_len = cfg.max_seq_len;
  s.compute = precision.compute;
  s.muon = cfg.optimizer == "muon";
  s.gradient_checkpointing = cfg.gradient_checkpointing == "true";
  s.device = device.device.type();
  s.no_attention_scores = attention_keeps_no_scores(s.device);
  s.processes = dist::size();
  s.shard_optimizer = cfg.zero_stage >= 1;
  s.reduce_in_bfloat16 =
      s.device == c10::DeviceType::CUDA && cfg.grad_reduce_dtype == "bfloat16";
  if (s.device == c10::DeviceType::CUDA && s.processes > 1 &&
      copy_engines_may_average(
          /*float32_gradients=*/true, cfg.grad_reduce_dtype, cfg.grad_average))
    s.copy_engine_bucket = double(cfg.bucket_cap_mb << 20) *
        (cfg.zero_stage >= 1 ? s.processes : 1);
  return s;
}

BatchPlan plan_for(
    const PretrainConfig& cfg,
    const models::GptConfig& mc,
    const Precision& precision,
    const DeviceInfo& device) {
  grad_accum_steps( // the known message when a set batch does not divide
      cfg.total_batch_size,
      cfg.device_batch_size.value_or(1),
      cfg.max_seq_len,
      dist::size());
  const std::optional<bool> ckpt = cfg.gradient_checkpointing == "auto"
      ? std::nullopt
      : std::optional<bool>(cfg.gradient_checkpointing == "true");
  BatchPlan plan = plan_batch(
      plan_model_of(mc),
      plan_settings(cfg, precision, device),
      cfg.total_batch_size / dist::size(), // each rank's share
      memory_budget(device, cfg.memory_fraction),
      cfg.device_batch_size ? std::optional<bool>(ckpt.value_or(false)) : ckpt);
  if (!cfg.device_batch_size)
    return plan;
  for (const auto& c : plan.candidates)
    if (c.batch == *cfg.device_batch_size) {
      plan.choice = c;
      plan.why = "device_batch_size=" + std::to_string(c.batch) +
          " is set; its predicted peak (" + format_mb(c.estimate.total()) +
          (c.fits ? ") fits" : ") does NOT fit") + " the budget (" +
          format_mb(double(plan.budget.bytes)) + ")";
    }
  return plan;
}

BatchSchedule resolve_batch_schedule(
    PretrainConfig& cfg,
    const config::Origins& origins) {
  BatchSchedule schedule =
      BatchSchedule::parse(cfg.batch_schedule, cfg.batch_schedule_steps);
  if (!schedule.on())
    return schedule;
  // Both set: the later source wins, as for the length of training; from
  // one source they must agree (a run's config.yaml holds the schedule and
  // its unit).
  const int tbs = source_rank(origins, "total_batch_size"),
            bs = source_rank(origins, "batch_schedule");
  if (tbs > bs)
    return {};
  if (tbs == bs && cfg.total_batch_size != schedule.unit())
    throw UserError(
        "both total_batch_size and batch_schedule (" +
        origins.at("batch_schedule") +
        ") set the tokens of a step; keep one of them.");
  // Every stage a whole number of micro-steps on every process.
  const int64_t world = dist::size();
  const int64_t micro = cfg.device_batch_size.value_or(1);
  const int64_t per_micro = micro * cfg.max_seq_len * world;
  for (size_t k = 0; k < schedule.stages(); ++k)
    if (schedule.tokens()[k] % per_micro != 0)
      throw UserError(
          "batch_schedule[" + std::to_string(k) +
          "] = " + std::to_string(schedule.tokens()[k]) +
          " tokens is not a whole number of micro-steps of " +
          std::to_string(per_micro) + " tokens (device_batch_size " +
          (cfg.device_batch_size ? std::to_string(micro) : "at least 1") +
          " x max_seq_len " + std::to_string(cfg.max_seq_len) +
          (world > 1 ? " x " + std::to_string(world) + " processes" : "") +
          "); make every entry a multiple of " + std::to_string(per_micro) +
          ".");
  cfg.total_batch_size = schedule.unit();
  return schedule;
}

int64_t resolve_num_steps(
    const PretrainConfig& cfg,
    const config::Origins& origins,
    int64_t windows_per_epoch,
    int64_t sequences_per_step,
    const BatchSchedule& schedule) {
  struct Length {
    const char* key;
    bool set;
  };
  std::vector<Length> lengths = {
      {"num_iterations", cfg.num_iterations.has_value()},
      {"target_tokens", cfg.target_tokens.has_value()},
      {"epochs", cfg.epochs.has_value()}};
  const Length* chosen = nullptr;
  for (const auto& l : lengths) {
    if (!l.set)
      continue;
    if (!chosen ||
        source_rank(origins, l.key) > source_rank(origins, chosen->key)) {
      chosen = &l;
    } else if (
        source_rank(origins, l.key) == source_rank(origins, chosen->key)) {
      auto where = [&](const char* k) {
        auto it = origins.find(k);
        return it == origins.end() ? std::string("default") : it->second;
      };
      throw UserError(
          std::string("both ") + chosen->key + " (" + where(chosen->key) +
          ") and " + l.key + " (" + where(l.key) +
          ") set the length of training; keep one of them.");
    }
  }
  const int64_t tokens_per_step = sequences_per_step * cfg.max_seq_len;
  const std::string key = chosen ? chosen->key : "epochs";
  if (key == "num_iterations")
    return *cfg.num_iterations;
  if (key == "target_tokens")
    return schedule.on()
        ? schedule.steps_for(*cfg.target_tokens)
        : std::max<int64_t>(
              1, (*cfg.target_tokens + tokens_per_step - 1) / tokens_per_step);
  const double epochs = cfg.epochs.value_or(1.0);
  if (epochs <= 0)
    throw UserError(
        "epochs=" + fmt("%g", epochs) + ": train for more than 0 epochs.");
  if (schedule.on())
    return schedule.steps_for(int64_t(std::ceil(
        epochs * double(windows_per_epoch) * double(cfg.max_seq_len))));
  return std::max<int64_t>(
      1,
      int64_t(std::ceil(
          epochs * double(windows_per_epoch) / double(sequences_per_step))));
}

void copy_trainer_result(const TrainerResult& from, TrainResult& to) {
  to.step = from.step;
  to.interrupted = from.interrupted;
  to.already_done = from.already_done;
  to.train_seconds = from.train_seconds;
  to.peak_memory_bytes = from.peak_memory_bytes;
  to.val_loss = from.final_eval.loss;
  to.micro_batch = from.micro_batch;
  to.checkpoint_dir = from.checkpoint_dir;
}

TrainResult run_training(
    const PretrainConfig& given,
    const config::Origins& origins,
    const DeviceInfo& device,
    const SampleHook& sample) {
  PretrainConfig cfg = given;
  const BatchSchedule schedule = resolve_batch_schedule(cfg, origins);
  const torch::Device dev = device.device;
  const Precision precision = resolve_precision(cfg.dtype, device);
  const bool base = cfg.stage == "base", sft = cfg.stage == "sft";
  // Batch arithmetic first: a batch that does not divide fails before any
  // data is prepared (with auto, one sequence must divide).
  const int64_t T = cfg.max_seq_len;
  const int world = dist::size(), rank = dist::rank();
  grad_accum_steps(
      cfg.total_batch_size, cfg.device_batch_size.value_or(1), T, world);
  auto say_early = [](const std::string& s) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  };
  TrainResult result;
  result.stage = cfg.stage;

  // The model to start from (mid, sft): init, or the previous stage's run
  // of the same name.
  std::optional<runs::TrainedGpt> init;
  if (!base) {
    const std::string name = !cfg.run.empty()
        ? cfg.run
        : "d" + std::to_string(cfg.arch.n_layer.value_or(cfg.depth));
    const std::string from = cfg.init != "auto"
        ? cfg.init
        : runs::stage_run_dir(runs::previous_stage(cfg.stage), name);
    if (cfg.init == "auto" && runs::list_checkpoints(from).empty())
      throw UserError(
          "stage=" + cfg.stage + " starts from " + from +
          ", which holds no checkpoint: train stage=" +
          runs::previous_stage(cfg.stage) +
          " first (or run `orchard pipeline`), "
          "or name a run or checkpoint folder with init=PATH.");
    init = runs::load_gpt(from, /*prefer_ema=*/true);
    result.init_dir = init->checkpoint_dir;
  }

  // Data: text shards (base), conversations mixed with text (mid), or
  // conversations (sft).
  std::vector<std::string> train_shards, val_shards;
  std::shared_ptr<data::ChatFile> chat_train, chat_val;
  // With several processes rank 0 prepares (and caches) the data first; the
  // others then find it in the cache.
  dist::leader_first("preparing the data", [&] {
    if (base) {
      PreparedData data = prepare_pretraining_data(cfg, say_early);
      result.tokenizer_dir = data.tokenizer_dir;
      result.data_description = data.description;
      train_shards = data.train_shards;
      val_shards = data.val_shards;
    } else {
      result.tokenizer_dir = init->tokenizer_dir;
      ChatData chats = prepare_chat_data(
          {.files = cfg.chat_data,
           .data_dir = cfg.data_dir,
           .max_seq_len = T,
           .tokenizer_dir = result.tokenizer_dir},
          say_early);
      result.chat_val = chats.val;
      if (sft) {
        chat_train =
            std::make_shared<data::ChatFile>(data::ChatFile::open(chats.train));
        chat_val =
            std::make_shared<data::ChatFile>(data::ChatFile::open(chats.val));
        result.data_description = chats.description + "; " +
            std::to_string(chat_train->size()) + " conversations, " +
            std::to_string(chat_val->size()) + " held out; loss on answers";
      } else {
        PretrainConfig text_cfg = cfg;
        text_cfg.tokenizer = result.tokenizer_dir;
        PreparedData text = prepare_pretraining_data(text_cfg, say_early);
        MidData mid = prepare_mid_data(cfg, chats, text, say_early);
        train_shards = mid.train_shards;
        val_shards = mid.val_shards;
        result.data_description = chats.description + ", mixed with " +
            text.description + " (" + fmt("%.0f", cfg.mid_text_ratio * 100) +
            " % of the tokens)";
      }
    }
  });
  result.val_shards = val_shards;
  text::Tokenizer tok = text::load_tokenizer(result.tokenizer_dir);

  models::GptConfig mc;
  if (base) {
    mc = resolve_gpt_config(cfg, int64_t(tok.vocab_size()));
  } else {
    mc = init->config;
    mc.max_seq_len = T;
  }
  // The micro-batch and checkpointing: as set, or the planner's choice.
  BatchPlan plan = plan_for(cfg, mc, precision, device);
  if (!plan.choice)
    throw UserError(plan.why + " (`orchard plan` shows the whole table.)");
  if (cfg.device_batch_size) {
    std::optional<int64_t> largest;
    for (const auto& c : plan.candidates)
      if (c.checkpointing == plan.choice->checkpointing && c.fits)
        largest = c.batch;
    refuse_beyond_memory(
        device,
        "device_batch_size",
        plan.choice->batch,
        plan.choice->estimate.total(),
        plan.budget,
        largest);
  }
  // Every rank takes the same micro-batch: the smallest any chose.
  const int64_t B = dist::min_over_ranks(plan.choice->batch);
  mc.gradient_checkpointing = plan.choice->checkpointing;
  const std::string plan_line =
      std::string(plan.choice->fits ? "" : "Warning: ") +
      "Memory plan: " + plan.why + "; budget " + plan.budget.why +
      (plan.choice->fits ? ""
                         : ". Training starts anyway; if it runs out of memory "
                           "the micro-batch is lowered and the step redone.") +
      (B != plan.choice->batch
           ? ". Another process planned a smaller micro-batch, so every "
             "process takes " +
               std::to_string(B)
           : "");
  const int64_t accum = grad_accum_steps(cfg.total_batch_size, B, T, world);
  result.run_dir = !cfg.run_dir.empty()
      ? cfg.run_dir
      : runs::stage_run_dir(cfg.stage, cfg.run.empty() ? mc.tag() : cfg.run);
  // A run trained from an older version of its starting model is stale:
  // it is kept aside and trained anew.
  if (init && cfg.resume == "auto" && dist::leader())
    if (auto moved = runs::set_aside_if_stale(
            result.run_dir, result.init_dir, cfg.stage);
        !moved.empty())
      say_early(moved);
  make_run_folder(result.run_dir);
  RunLog log(result.run_dir + "/train.log");

  torch::manual_seed(cfg.seed);
  models::Gpt model(mc);
  if (init) {
    torch::NoGradGuard no_grad;
    auto from = init->model->named_parameters();
    for (auto& p : model->named_parameters())
      p.value().copy_(from[p.key()]);
    init.reset(); // the weights now live in `model`
  }
  model->to(dev);

  // Sequences in one pass over the training data (for epochs), and the
  // rows evaluation reads at once.
  std::shared_ptr<data::TokenLoader> train_loader;
  std::shared_ptr<data::ChatBatcher> chat_loader;
  int64_t windows_per_epoch = 0, eval_batch = B;
  const uint32_t pad_id = data::bos_id(tok);
  if (sft) {
    chat_loader = std::make_shared<data::ChatBatcher>(
        *chat_train,
        B,
        T,
        cfg.pack,
        pad_id,
        true,
        uint64_t(cfg.seed),
        rank,
        world);
    windows_per_epoch = cfg.pack
        ? std::max<int64_t>(1, int64_t(chat_train->total_tokens()) / (T + 1))
        : int64_t(chat_train->size());
  } else {
    // Rank r reads the r-th B of each world * B windows: together the
    // ranks read what one process would in world micro-steps.
    train_loader = std::make_shared<data::TokenLoader>(
        train_shards, B, T, /*shuffle=*/true, uint64_t(cfg.seed), rank, world);
    windows_per_epoch = int64_t(train_loader->steps_per_epoch()) * B * world;
    // Fewer rows when the validation split is small. Checked now, not
    // after training.
    eval_batch = std::min<int64_t>(
        B, int64_t(data::TokenLoader::count_windows(val_shards, T)));
    if (eval_batch < 1)
      throw UserError(
          "the validation split holds fewer than max_seq_len + 1 = " +
          std::to_string(T + 1) +
          " tokens; give more text or a shorter max_seq_len.");
  }
  const int64_t total = resolve_num_steps(
      cfg, origins, windows_per_epoch, B * accum * world, schedule);
  result.total = total;

  PretrainConfig resolved = cfg;
  resolved.device_batch_size = B;
  const bool muon = cfg.optimizer == "muon";
  resolved.lr_scale = cfg.lr_scale.value_or(sft ? kSftLrScale : 1.0);
  const double scale = *resolved.lr_scale;
  resolved.lr = cfg.lr.value_or(muon ? kMuonMatrixLr : kAdamwMatrixLr);
  if (!cfg.num_iterations && !cfg.epochs && !cfg.target_tokens)
    resolved.num_iterations = total; // what auto (one epoch) came to
  if (!base)
    resolved.init = result.init_dir;
  if (dist::leader())
    config::write_yaml(
        result.run_dir + "/config.yaml", pretrain_schema(), &resolved, origins);

  // Parameter groups: the blocks' matrices, the embedding, lm_head.
  NamedTensors matrices;
  for (const auto& p : model->named_parameters())
    if (p.key().rfind("blocks.", 0) == 0)
      matrices.push_back({p.key(), p.value()});
  std::vector<ParamGroup> groups = {
      {"matrices", matrices, *resolved.lr * scale, cfg.weight_decay, muon},
      {"embedding",
       {{"wte.weight", model->wte->weight}},
       cfg.embedding_lr * scale,
       0.0},
      {"lm_head",
       {{"lm_head.weight", model->lm_head->weight}},
       cfg.unembedding_lr * scale,
       0.0}};
  OptimizerOptions oo;
  oo.newton_schulz_dtype = precision.compute == torch::kBFloat16
      ? torch::kBFloat16
      : torch::kFloat32;
  Optimizers optimizers(std::move(groups), oo);
  auto byte_counts = token_byte_counts(tok, mc.vocab_size).to(dev);

  TrainingTask task;
  task.model = model.ptr();
  // The projections and lm_head are read only by products, which autocast
  // feeds their compute-dtype rounding; the embedding's rows are read as
  // they are.
  for (const auto& [name, proj] : model->projections())
    task.read_in_compute_dtype.push_back(proj->weight);
  task.read_in_compute_dtype.push_back(model->lm_head->weight);
  task.embeddings = {model->wte->weight};
  if (sft) {
    task.micro_step = [&, chat_loader] {
      auto b = chat_loader->next();
      auto y = torch::where(b.loss_mask > 0, b.y, torch::full_like(b.y, -1));
      return model->loss(
          compat::to_device_async(b.x, dev), compat::to_device_async(y, dev));
    };
    task.evaluate = [&] {
      double loss = answer_loss(
          model,
          *chat_val,
          eval_batch,
          T,
          cfg.pack,
          pad_id,
          cfg.eval_tokens,
          dev);
      return EvalResult{
          loss, {}, "val loss on held-out answers " + fmt("%.4f", loss)};
    };
    task.data_state = [chat_loader] {
      return nlohmann::json(chat_loader->state());
    };
    task.restore_data = [chat_loader](const nlohmann::json& j) {
      chat_loader->restore(j.get<data::LoaderState>());
    };
    task.set_micro_batch = [chat_loader](int64_t b) {
      chat_loader->set_batch_size(b);
    };
  } else {
    task.next_inputs = [train_loader, dev] {
      auto b = train_loader->next();
      // Copied without waiting for the previous step's optimizer.
      return std::vector<torch::Tensor>{
          compat::to_device_async(b.x, dev), compat::to_device_async(b.y, dev)};
    };
    task.loss_of = [model](const std::vector<torch::Tensor>& in) mutable {
      return model->loss(in.at(0), in.at(1));
    };
    // B x T windows, B the same on every rank (device_batch_size=auto
    // takes the smallest any rank planned).
    task.same_shapes_on_every_rank = true;
    task.micro_step = [next = task.next_inputs, loss = task.loss_of] {
      return loss(next());
    };
    task.evaluate = [&] {
      SplitLoss s = split_loss(
          model, val_shards, eval_batch, T, cfg.eval_tokens, byte_counts, dev);
      return EvalResult{
          s.loss,
          {{"val_bpb", s.bpb}},
          "val loss " + fmt("%.4f", s.loss) + ", " + fmt("%.4f", s.bpb) +
              " bits per byte"};
    };
    // The position counts steps of world * B windows: saved with the world
    // size, and converted when a run resumes with another.
    task.data_state = [train_loader, world] {
      nlohmann::json j = train_loader->state();
      j["world_size"] = world;
      return j;
    };
    task.set_micro_batch = [train_loader](int64_t b) {
      train_loader->set_batch_size(b);
    };
    task.restore_data = [train_loader, world](const nlohmann::json& j) {
      data::LoaderState s = j.get<data::LoaderState>();
      const int saved = j.value("world_size", 1);
      if (saved != world) {
        const uint64_t b = uint64_t(train_loader->batch_size());
        const uint64_t served = s.step * b * uint64_t(saved);
        if (served % uint64_t(world) != 0)
          throw UserError(
              "cannot resume with " + std::to_string(world) +
              " processes: the checkpoint's run (" + std::to_string(saved) +
              ") had served " + std::to_string(served) +
              " sequences of this epoch, which do not divide between " +
              std::to_string(world) + " processes. Resume with " +
              std::to_string(saved) + " process(es).");
        // In steps of one sequence a rank; the trainer then goes on to
        // this run's micro-batch (set_micro_batch, which says so where the
        // position does not divide into it).
        train_loader->set_batch_size(1);
        s.step = served / uint64_t(world);
        std::printf(
            "Resuming with %d process(es) where the checkpoint's run had "
            "%d: the data position (%llu sequences into epoch %llu) carries "
            "over.\n",
            world,
            saved,
            (unsigned long long)served,
            (unsigned long long)s.epoch);
      }
      train_loader->restore(s);
    };
  }
  const SampleSource sample_source{val_shards, result.chat_val};
  if (sample)
    task.sample = [&](int64_t step) {
      sample(model, result.tokenizer_dir, sample_source, step);
    };
  task.describe = {
      {"model",
       {{"n_layer", mc.n_layer},
        {"n_embd", mc.n_embd},
        {"n_head", mc.n_head},
        {"n_kv_head", mc.n_kv_head},
        {"vocab_size", mc.vocab_size},
        {"max_seq_len", mc.max_seq_len}}},
      {"tokenizer", result.tokenizer_dir},
      {"stage", cfg.stage}};
  if (!base)
    task.describe["init"] = result.init_dir;

  TrainerOptions to{
      .run_dir = result.run_dir,
      .device = dev,
      .precision = precision,
      .total_steps = total,
      .micro_batch = B,
      .grad_accum = accum,
      .tokens_per_step = cfg.total_batch_size,
      .batch_schedule = schedule,
      .grad_clip = cfg.grad_clip,
      .zero_stage = int(cfg.zero_stage),
      .grad_reduce_dtype =
          *parse_dtype(cfg.grad_reduce_dtype, "grad_reduce_dtype"),
      .bucket_cap_mb = cfg.bucket_cap_mb,
      .grad_average = dist::mover_named(cfg.grad_average),
      .warmup_steps = cfg.warmup_steps,
      .warmdown_ratio = cfg.warmdown_ratio,
      .ema = cfg.ema,
      .ema_rate = cfg.ema_rate,
      .eval_every = cfg.eval_every,
      .sample_every = cfg.sample_every,
      .save_every = cfg.save_every,
      .save_total_limit = cfg.save_total_limit,
      .keep_best = cfg.keep_best,
      .resume = cfg.resume,
      .cuda_graphs = cfg.cuda_graphs};
  Trainer trainer(to, task, optimizers, log);
  const int64_t start = trainer.resume();
  const int64_t micro = trainer.micro_batch(),
                steps_accum = trainer.grad_accum();
  if (start < total) {
    log("Stage: " + cfg.stage +
        (base ? " (pretraining from scratch)"
              : " (from " + result.init_dir + ")"));
    log("Data: " + result.data_description + "; tokenizer " +
        result.tokenizer_dir + " (" + std::to_string(tok.vocab_size()) +
        " tokens)");
    log("Model: " + mc.tag() + ", " + std::to_string(model->num_parameters()) +
        " parameters (" + std::to_string(mc.n_layer) + " layers, width " +
        std::to_string(mc.n_embd) + ", " + std::to_string(mc.n_head) +
        " heads, " + std::to_string(mc.n_kv_head) + " kv heads)");
    log("Precision: " + precision.name + " (" + precision.why + ")");
    log(plan_line);
    log("Optimizer: " + optimizers.describe() +
        (scale != 1.0 ? " (learning rates x " + fmt("%g", scale) + ")" : ""));
    log("Batch: " + std::to_string(micro) + " x " + std::to_string(T) +
        " tokens per micro-step" + (cfg.device_batch_size ? "" : " (auto)") +
        (mc.gradient_checkpointing ? ", gradient checkpointing" : "") + ", " +
        std::to_string(steps_accum) + " accumulation step(s)" +
        (world > 1 ? " on each of " + std::to_string(world) + " processes"
                   : "") +
        (schedule.on() ? " per " + std::to_string(cfg.total_batch_size) +
                 " tokens; batch schedule " + schedule.describe(total)
                       : ", " + std::to_string(cfg.total_batch_size) +
                 " tokens per step") +
        "; " + std::to_string(total) + " steps (" +
        fmt("%.2f",
            double(
                schedule.on()
                    ? schedule.tokens_through(total, total) / cfg.max_seq_len
                    : total * B * accum * world) /
                double(std::max<int64_t>(1, windows_per_epoch))) +
        " epochs); run folder " + result.run_dir);
  }
  TrainerResult tr = trainer.run();
  copy_trainer_result(tr, result);
  if (tr.interrupted || tr.already_done || !dist::leader())
    return result;
  for (const auto& [name, v] : tr.final_eval.metrics)
    if (name == "val_bpb")
      result.val_bpb = v;
  if (sft) {
    log("Done: step " + std::to_string(total) +
        ", validation loss on held-out answers " +
        fmt("%.4f", result.val_loss) +
        ". Final checkpoint: " + tr.checkpoint_dir);
    return result;
  }

  // The final loss on each split (nanochat's base_loss), then the baseline.
  const int64_t split_tokens = cfg.split_tokens.value_or(cfg.eval_tokens);
  trainer.with_eval_weights([&] {
    result.train_split_loss =
        split_loss(
            model, train_shards, eval_batch, T, split_tokens, byte_counts, dev)
            .loss;
    result.val_split_loss =
        split_loss(
            model, val_shards, eval_batch, T, split_tokens, byte_counts, dev)
            .loss;
  });
  result.unigram_loss = unigram_loss(train_shards, val_shards, mc.vocab_size);
  log("Done: step " + std::to_string(total) + ", validation loss " +
      fmt("%.4f", result.val_loss) + " (" + fmt("%.4f", result.val_bpb) +
      " bits per byte); a unigram model scores " +
      fmt("%.4f", result.unigram_loss) + ".");
  log("Loss on " + std::to_string(split_tokens) +
      " tokens of each split: train " + fmt("%.4f", result.train_split_loss) +
      ", val " + fmt("%.4f", result.val_split_loss) +
      ". Final checkpoint: " + tr.checkpoint_dir);
  return result;
}

} // namespace orchard::train
