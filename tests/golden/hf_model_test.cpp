// Hugging Face Llama-family models and PEFT adapters against transformers
// and peft: tests/fixtures/hf, made by tests/reference/make_hf_fixtures.py on
// the CUDA machine (tiny random LlamaForCausalLM with llama3 rope scaling
// and tied embeddings, Qwen2ForCausalLM sharded with q/k/v biases,
// MistralForCausalLM; a peft LoRA adapter with random A and B).
#include "core/error.h"
#include "core/safetensors.h"
#include "infer/engine.h"
#include "lora_test_util.h"
#include "models/hf/family.h"
#include "models/hf/model.h"
#include "models/lora.h"
#include "test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace orchard {
namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;
using test::TempDir;

const std::string kHf = std::string(ORCHARD_FIXTURES) + "/hf";

std::map<std::string, torch::Tensor> reference(const std::string& dir) {
  return safetensors::load(dir + "/reference.safetensors");
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64))
      .abs()
      .max()
      .item<double>();
}

models::Llama load(
    const std::string& arch,
    std::optional<torch::ScalarType> dtype = std::nullopt) {
  models::LoadOptions opt;
  opt.dtype = dtype;
  return models::load_hf_model(kHf + "/" + arch, opt);
}

// Targets for next-token prediction: ids shifted left, the last ignored
// (-1), as transformers shifts its labels.
torch::Tensor next_tokens(const torch::Tensor& ids) {
  auto targets = torch::full_like(ids, -1);
  targets.narrow(1, 0, ids.size(1) - 1)
      .copy_(ids.narrow(1, 1, ids.size(1) - 1));
  return targets;
}

class HfArch : public ::testing::TestWithParam<std::string> {};

TEST_P(HfArch, Float32LogitsEqualTransformers) {
  auto model = load(GetParam());
  model->eval();
  auto ref = reference(kHf + "/" + GetParam());
  torch::NoGradGuard no_grad;
  auto logits = model->forward(ref["input_ids"]);
  EXPECT_EQ(logits.sizes(), ref["logits_fp32"].sizes());
  EXPECT_LT(max_diff(logits, ref["logits_fp32"]), 1e-4) << GetParam();
}

TEST_P(HfArch, Bfloat16LogitsEqualTransformers) {
  auto model = load(GetParam(), torch::kBFloat16);
  model->eval();
  EXPECT_EQ(model->model->embed_tokens->weight.scalar_type(), torch::kBFloat16);
  auto ref = reference(kHf + "/" + GetParam());
  torch::NoGradGuard no_grad;
  auto logits = model->forward(ref["input_ids"]);
  // transformers ran on the GPU, whose bf16 matrix products accumulate in
  // another order: a logit may differ by a bfloat16 rounding step (2^-8
  // relative), rarely two, never more.
  const auto& want = ref["logits_bf16"];
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LE(max_diff(logits, want), 2 * scale / 256) << GetParam();
  // Most logits agree to a step: the mean difference is a fraction of one.
  const double mean = (logits.to(torch::kFloat64) - want.to(torch::kFloat64))
                          .abs()
                          .mean()
                          .item<double>();
  EXPECT_LT(mean, scale / 512) << GetParam();
}

TEST_P(HfArch, LossAndGradientsEqualTransformers) {
  auto model = load(GetParam());
  model->train();
  auto ref = reference(kHf + "/" + GetParam());
  auto ids = ref["input_ids"];
  auto loss = model->loss(ids, next_tokens(ids));
  EXPECT_NEAR(loss.item<double>(), ref["loss"].item<double>(), 1e-5);
  loss.backward();
  auto params = model->named_parameters();
  int checked = 0;
  for (const auto& [key, want] : ref) {
    if (key.rfind("grad.", 0) != 0)
      continue;
    std::string name = key.substr(5);
    if (name == "lm_head.weight" && model->lm_head.is_empty())
      name = "model.embed_tokens.weight";
    auto* p = params.find(name);
    ASSERT_NE(p, nullptr) << name;
    ASSERT_TRUE(p->grad().defined()) << name;
    EXPECT_LT(
        max_diff(p->grad(), want),
        1e-5 + 1e-3 * want.abs().max().item<double>())
        << name;
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

// A float64 model's loss is float64 all the way (the tests that compare
// gradients in float64 rely on it).
TEST_P(HfArch, Float64LossIsComputedInFloat64) {
  auto model = load(GetParam(), torch::kFloat64);
  model->train();
  auto ids = reference(kHf + "/" + GetParam())["input_ids"];
  auto targets = next_tokens(ids);
  auto loss = model->loss(ids, targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat64);
  torch::NoGradGuard no_grad;
  auto logits = model->forward(ids);
  auto want = F::cross_entropy(
      logits.reshape({-1, logits.size(-1)}),
      targets.reshape({-1}),
      F::CrossEntropyFuncOptions().ignore_index(-1));
  EXPECT_LT(std::abs(loss.item<double>() - want.item<double>()), 1e-12);
}

TEST_P(HfArch, CheckpointingGivesTheSameGradients) {
  auto ref = reference(kHf + "/" + GetParam());
  auto ids = ref["input_ids"];
  auto grads = [&](bool ckpt) {
    auto model = load(GetParam(), torch::kFloat64);
    model->gradient_checkpointing = ckpt;
    model->train();
    model->loss(ids, ids).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : model->parameters())
      g.push_back(p.grad().clone());
    return g;
  };
  auto plain = grads(false), recomputed = grads(true);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_LT(max_diff(plain[i], recomputed[i]), 1e-12) << i;
}

void check_decoding(const std::string& arch, bool half) {
  auto model = load(arch, half ? torch::kBFloat16 : torch::kFloat64);
  if (half) {
    models::LoraSpec spec;
    spec.r = 2;
    spec.alpha = 2;
    test::add_random_lora(model, spec, torch::kFloat32, 6);
  }
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = reference(kHf + "/" + arch)["input_ids"];
  auto full = model->forward(ids);
  const double tol = half ? 0.03 * full.abs().max().item<double>() : 1e-10;
  // Prefill 10 tokens, then one at a time with the cache.
  models::KvCache cache;
  auto first = model->forward(ids.narrow(1, 0, 10), &cache);
  EXPECT_LT(max_diff(first, full.narrow(1, 0, 10)), tol);
  for (int64_t t = 10; t < ids.size(1); ++t) {
    auto step = model->forward(ids.narrow(1, t, 1), &cache);
    EXPECT_LT(max_diff(step.squeeze(1), full.select(1, t)), tol) << t;
  }
  // Batched: rows at different positions in fixed-size caches.
  models::BatchKvCache batch;
  const int64_t Tmax = model->max_seq_len();
  std::vector<int64_t> lens = {7, 12};
  for (int64_t b = 0; b < 2; ++b) {
    models::KvCache kv;
    model->forward(ids.narrow(0, b, 1).narrow(1, 0, lens[b]), &kv);
    for (size_t l = 0; l < kv.k.size(); ++l) {
      auto pad = [&](const torch::Tensor& t) {
        auto row = torch::zeros({1, t.size(1), Tmax, t.size(3)}, t.options());
        row.narrow(2, 0, t.size(2)).copy_(t);
        return row;
      };
      if (b == 0) {
        batch.k.push_back(pad(kv.k[l]));
        batch.v.push_back(pad(kv.v[l]));
      } else {
        batch.k[l] = torch::cat({batch.k[l], pad(kv.k[l])});
        batch.v[l] = torch::cat({batch.v[l], pad(kv.v[l])});
      }
    }
  }
  auto idx = torch::stack({ids[0][lens[0]], ids[1][lens[1]]});
  auto pos = torch::tensor({lens[0], lens[1]}, torch::kInt64);
  auto logits = model->decode_batch(idx, pos, batch);
  EXPECT_LT(max_diff(logits[0], full[0][lens[0]]), tol);
  EXPECT_LT(max_diff(logits[1], full[1][lens[1]]), tol);
}

// float64, and a bfloat16 base with float32 adapters (the path that casts
// each layer's adapters once), to bfloat16's accuracy there.
TEST_P(HfArch, CachedAndBatchedDecodingEqualTheFullForward) {
  for (bool half : {false, true})
    check_decoding(GetParam(), half);
}

// prepare_inference() (adapters merged into the weights, q/k/v and
// gate/up stacked into views of one matrix) keeps the numbers: float64
// logits within 1e-10 of the adapted model's, the same greedy tokens from
// the engine, and no memory added (the projections are views of the
// stacked matrices).
TEST_P(HfArch, PreparedForInferenceKeepsTheNumbers) {
  auto model = load(GetParam(), torch::kFloat64);
  models::LoraSpec spec;
  spec.r = 2;
  spec.alpha = 4;
  test::add_random_lora(model, spec, torch::kFloat64, 9);
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = reference(kHf + "/" + GetParam())["input_ids"];
  auto before = model->forward(ids);
  infer::SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 12;
  std::vector<int64_t> prompt = {1, 5, 9};
  auto tokens =
      infer::Engine(model.ptr(), torch::kCPU).generate(prompt, greedy);
  EXPECT_EQ(model->prepare_inference(), 7 * model->config.num_hidden_layers);
  for (auto& [name, proj] : model->projections())
    EXPECT_FALSE(proj->has_lora()) << name;
  auto* layer = model->model->layers[0]->as<models::LlamaLayerImpl>();
  auto& attn = *layer->self_attn;
  ASSERT_TRUE(attn.qkv_weight.defined());
  EXPECT_EQ(attn.q_proj->weight.data_ptr(), attn.qkv_weight.data_ptr());
  EXPECT_TRUE(layer->mlp->gate_up_weight.defined());
  EXPECT_LT(max_diff(model->forward(ids), before), 1e-10);
  EXPECT_EQ(
      infer::Engine(model.ptr(), torch::kCPU).generate(prompt, greedy), tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Transformers,
    HfArch,
    ::testing::Values("llama", "qwen2", "mistral", "mistral_sp"));

TEST(HfModel, ConfigFacts) {
  auto llama = models::read_hf_config(kHf + "/llama");
  EXPECT_EQ(llama.rope_type, "llama3");
  EXPECT_TRUE(llama.tie_word_embeddings);
  EXPECT_EQ(llama.num_key_value_heads, 2);
  auto qwen = models::read_hf_config(kHf + "/qwen2");
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_bias);
  // The index names 12 shards; all are read.
  EXPECT_EQ(safetensors::Reader::open(kHf + "/qwen2").num_files(), 12u);
  // llama3 scaling: the highest frequency is kept, the lowest divided by
  // the factor (wavelength above original_max_position_embeddings).
  auto inv = models::rope_inv_freq(llama);
  EXPECT_DOUBLE_EQ(inv[0].item<double>(), 1.0);
  const double lowest = 1.0 / std::pow(500000.0, 14.0 / 16.0);
  EXPECT_NEAR(inv[7].item<double>(), lowest / 8.0, 1e-12);
}

// Each family's projection shapes, read from config.json alone (what the
// memory estimate counts), are the shapes of the weights transformers
// saved; and the model's parameters are what the estimate's count is built
// from (projections, two norms a layer, final norm, embedding, head).
TEST(HfModel, FamilyProjectionShapesAreTheSavedOnes) {
  for (const std::string arch : {"llama", "qwen2", "mistral", "mistral_sp"}) {
    const auto cfg = models::read_hf_config(kHf + "/" + arch);
    const auto shapes = models::family_of(cfg).layer_projections(cfg);
    auto model = load(arch);
    int64_t checked = 0;
    for (const auto& [name, proj] : model->projections()) {
      const std::string leaf = name.substr(name.rfind('.') + 1);
      auto it = std::find_if(shapes.begin(), shapes.end(), [&](const auto& p) {
        return p.name == leaf;
      });
      ASSERT_NE(it, shapes.end()) << arch << " " << name;
      EXPECT_EQ(proj->weight.size(0), it->out) << arch << " " << name;
      EXPECT_EQ(proj->weight.size(1), it->in) << arch << " " << name;
      ++checked;
    }
    EXPECT_EQ(checked, int64_t(shapes.size()) * cfg.num_hidden_layers) << arch;
  }
  EXPECT_THROW(
      models::family_of(models::HfModelConfig{}), std::invalid_argument);
}

// mistral_sp has a SentencePiece-style tokenizer.json (byte fallback, the
// legacy "▁" normalizer) and a Mistral [INST] template: the conversation is
// encoded in pieces, and each must start with "▁" exactly where
// transformers' encoding of the whole rendered text has one.
TEST(HfModel, ChatTemplatesEqualTransformers) {
  for (const std::string arch : {"llama", "qwen2", "mistral_sp"}) {
    SCOPED_TRACE(arch);
    const std::string dir = kHf + "/" + arch;
    auto tok = text::load_tokenizer(dir);
    auto family = text::detect_chat_family(dir, tok);
    text::ChatTemplate tmpl(family, tok);
    std::ifstream in(dir + "/chat_reference.json");
    auto j = nlohmann::json::parse(in);
    std::vector<text::Message> messages;
    for (const auto& m : j["messages"])
      messages.push_back({m["role"], m["content"]});
    auto r = tmpl.render(messages);
    std::vector<int64_t> got(r.ids.begin(), r.ids.end());
    EXPECT_EQ(got, j["ids"].get<std::vector<int64_t>>()) << arch;
    if (!j.contains("prompt_ids"))
      continue;
    messages.resize(2);
    auto prompt = tmpl.generation_prompt(messages);
    EXPECT_EQ(
        std::vector<int64_t>(prompt.begin(), prompt.end()),
        j["prompt_ids"].get<std::vector<int64_t>>());
    // A plain text as transformers encodes it: <s>, then the text with its
    // leading "▁" (uppercase letters and "é" are byte tokens here).
    std::vector<text::TokenId> ids{*tok.document_start()};
    tok.encode_ordinary(j["text"].get<std::string>(), ids);
    EXPECT_EQ(ids, j["text_ids"].get<std::vector<text::TokenId>>());
  }
}

// --- errors ----------------------------------------------------------------

std::string copy_model(const TempDir& tmp, const std::string& arch) {
  const std::string dir = tmp.file(arch);
  fs::copy(kHf + "/" + arch, dir, fs::copy_options::recursive);
  return dir;
}

void edit_json(
    const std::string& file,
    const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  {
    std::ifstream in(file);
    j = nlohmann::json::parse(in);
  }
  edit(j);
  std::ofstream(file) << j.dump(2);
}

template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HfModel, BadFoldersSayWhatAndHow) {
  TempDir tmp;
  EXPECT_NE(
      error_of([&] {
        models::read_hf_config(tmp.file("nope"));
      }).find("does not exist"),
      std::string::npos);
  auto dir = copy_model(tmp, "mistral");
  edit_json(dir + "/config.json", [](auto& j) {
    j["architectures"] = {"GPTNeoXForCausalLM"};
  });
  auto msg = error_of([&] { models::read_hf_config(dir); });
  EXPECT_NE(msg.find("GPTNeoXForCausalLM"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Qwen2ForCausalLM"), std::string::npos) << msg;
  // A weight of another shape than config.json implies.
  edit_json(dir + "/config.json", [](auto& j) {
    j["architectures"] = {"MistralForCausalLM"};
    j["intermediate_size"] = 128;
  });
  msg = error_of([&] { models::load_hf_model(dir, {}); });
  EXPECT_NE(msg.find("gate_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  // No weights at all.
  fs::remove(dir + "/model.safetensors");
  edit_json(dir + "/config.json", [](auto& j) { j["intermediate_size"] = 96; });
  msg = error_of([&] { models::load_hf_model(dir, {}); });
  EXPECT_NE(msg.find("safetensors"), std::string::npos) << msg;
}

// --- LoRA ------------------------------------------------------------------

TEST(Lora, PeftAdapterGivesPeftsLogitsLossAndGradients) {
  auto model = load("llama");
  models::load_adapter(model, kHf + "/llama_lora");
  auto ref = reference(kHf + "/llama_lora");
  model->eval();
  {
    torch::NoGradGuard no_grad;
    EXPECT_LT(
        max_diff(model->forward(ref["input_ids"]), ref["logits_fp32"]), 1e-4);
  }
  model->train();
  auto ids = ref["input_ids"];
  auto loss = model->loss(ids, next_tokens(ids));
  EXPECT_NEAR(loss.item<double>(), ref["loss"].item<double>(), 1e-5);
  loss.backward();
  int checked = 0;
  for (auto& [key, t] : models::adapter_tensors(model)) {
    auto it = ref.find("grad." + key);
    if (it == ref.end())
      continue;
    EXPECT_LT(
        max_diff(t.grad(), it->second),
        1e-6 + 1e-3 * it->second.abs().max().item<double>())
        << key;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  // Only the adapters train.
  for (const auto& p : model->named_parameters())
    EXPECT_EQ(
        p.value().requires_grad(), p.key().find(".lora_") != std::string::npos)
        << p.key();
}

TEST(Lora, MergedModelGivesPeftsMergedLogits) {
  TempDir tmp;
  auto model = load("llama");
  models::load_adapter(model, kHf + "/llama_lora");
  models::write_merged_model(model, kHf + "/llama", tmp.file("merged"));
  auto merged = models::load_hf_model(tmp.file("merged"), {});
  merged->eval();
  auto ref = reference(kHf + "/llama_lora");
  torch::NoGradGuard no_grad;
  EXPECT_LT(
      max_diff(merged->forward(ref["input_ids"]), ref["merged_logits_fp32"]),
      1e-4);
  // Tied embeddings stay tied: no lm_head.weight is written.
  EXPECT_FALSE(
      safetensors::Reader::open(tmp.file("merged")).contains("lm_head.weight"));
  EXPECT_TRUE(fs::exists(tmp.file("merged/tokenizer.json")));
}

TEST(Lora, SavedAdapterRoundTripsInPeftsLayout) {
  TempDir tmp;
  torch::manual_seed(3);
  auto model = load("qwen2");
  models::LoraSpec spec;
  spec.r = 2;
  spec.alpha = 6;
  spec.target_modules = {"q", "v", "down"};
  EXPECT_EQ(model->add_lora(spec, torch::kFloat32), 6);
  {
    torch::NoGradGuard no_grad;
    for (auto& [k, t] : models::adapter_tensors(model))
      t.normal_(0, 0.1); // B starts at zero; make it count
  }
  models::save_adapter(model, spec, tmp.file("adapter"), kHf + "/qwen2");
  auto f =
      safetensors::File::open(tmp.file("adapter/adapter_model.safetensors"));
  EXPECT_TRUE(f.contains(
      "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_EQ(f.tensors().size(), 12u);
  auto spec2 = models::read_adapter_config(tmp.file("adapter"));
  EXPECT_EQ(spec2.r, 2);
  EXPECT_DOUBLE_EQ(spec2.scaling(), 3.0);
  auto again = load("qwen2");
  models::load_adapter(again, tmp.file("adapter"));
  auto ids = reference(kHf + "/qwen2")["input_ids"];
  torch::NoGradGuard no_grad;
  model->eval();
  again->eval();
  EXPECT_LT(max_diff(model->forward(ids), again->forward(ids)), 1e-6);
  EXPECT_GT(max_diff(model->forward(ids), load("qwen2")->forward(ids)), 1e-3);

  // The adapter records its data's checksum: a byte changed in place (same
  // size, still a valid file) is found on loading, naming the file.
  const std::string file = tmp.file("adapter/adapter_model.safetensors");
  std::string bytes = test::read_text(file);
  bytes[bytes.size() - 2] ^= 0x10;
  std::ofstream(file, std::ios::binary) << bytes;
  auto msg = error_of([&] {
    auto third = load("qwen2");
    models::load_adapter(third, tmp.file("adapter"));
  });
  EXPECT_NE(msg.find("is damaged: its bytes changed"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("adapter_model.safetensors"), std::string::npos) << msg;
}

TEST(Lora, AdaptersOrchardCannotApplyAreRefused) {
  TempDir tmp;
  fs::copy(kHf + "/llama_lora", tmp.file("a"), fs::copy_options::recursive);
  edit_json(
      tmp.file("a/adapter_config.json"), [](auto& j) { j["use_dora"] = true; });
  auto msg = error_of([&] { models::read_adapter_config(tmp.file("a")); });
  EXPECT_NE(msg.find("DoRA"), std::string::npos) << msg;
  edit_json(tmp.file("a/adapter_config.json"), [](auto& j) {
    j["use_dora"] = false;
    j["r"] = 8; // the tensors have r = 4
  });
  auto model = load("llama");
  msg = error_of([&] { models::load_adapter(model, tmp.file("a")); });
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  edit_json(tmp.file("a/adapter_config.json"), [](auto& j) { j["r"] = 4; });
  EXPECT_NO_THROW(models::load_adapter(model = load("llama"), tmp.file("a")));
  // Tensors the config does not account for.
  edit_json(tmp.file("a/adapter_config.json"), [](auto& j) {
    j["target_modules"] = {"q_proj"};
  });
  msg = error_of(
      [&] { models::load_adapter(model = load("llama"), tmp.file("a")); });
  EXPECT_NE(msg.find("another model"), std::string::npos) << msg;
  msg = error_of([&] { models::normalize_target_modules({"qkv"}); });
  EXPECT_NE(msg.find("q_proj"), std::string::npos) << msg;
}

TEST(Lora, Bfloat16BaseGivesTheFloat32ResultsWithinRounding) {
  // The half-precision path (adapters cast to the base's dtype, one addmm)
  // against the float32 one, with peft's adapter: logits and the adapters'
  // gradients agree to bfloat16 accuracy.
  auto ref = reference(kHf + "/llama_lora");
  auto ids = ref["input_ids"];
  auto run = [&](torch::ScalarType dtype) {
    auto model = load("llama", dtype);
    models::load_adapter(model, kHf + "/llama_lora");
    model->train();
    auto logits = model->forward(ids);
    auto loss = F::cross_entropy(
        logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, logits.size(-1)}),
        ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
    loss.backward();
    std::vector<torch::Tensor> out = {logits.detach()};
    for (auto& [k, t] : models::adapter_tensors(model)) {
      EXPECT_EQ(t.scalar_type(), torch::kFloat32) << k;
      out.push_back(t.grad().clone());
    }
    return out;
  };
  auto full = run(torch::kFloat32), half = run(torch::kBFloat16);
  EXPECT_LT(max_diff(full[0], ref["logits_fp32"]), 1e-4);
  const double scale = full[0].abs().max().item<double>();
  EXPECT_LT(max_diff(half[0], full[0]), 0.05 * scale);
  for (size_t i = 1; i < full.size(); ++i) {
    auto a = full[i].flatten().to(torch::kFloat64),
         b = half[i].flatten().to(torch::kFloat64);
    const double cos =
        (a.dot(b) / (a.norm() * b.norm() + 1e-30)).item<double>();
    EXPECT_GT(cos, 0.99) << i;
  }
}

TEST(Lora, DropoutUnderCheckpointingGivesThePlainGradients) {
  // The recomputation must draw the same dropout masks as the forward.
  auto ids = reference(kHf + "/llama")["input_ids"];
  auto grads = [&](bool ckpt) {
    auto model = load("llama", torch::kFloat64);
    models::LoraSpec spec;
    spec.r = 2;
    spec.dropout = 0.3;
    test::add_random_lora(model, spec, torch::kFloat64, 5);
    model->gradient_checkpointing = ckpt;
    model->train();
    torch::manual_seed(9);
    model->loss(ids, ids).backward();
    return test::adapter_grads(model);
  };
  auto plain = grads(false), recomputed = grads(true);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_LT(max_diff(plain[i], recomputed[i]), 1e-12) << i;
}

// The half-precision base's fused path (one cast per layer, q/k/v and
// gate/up sharing one A product where all carry adapters) with only some
// projections targeted: the same logits and adapter gradients as the float32
// base to bfloat16 accuracy; with dropout, checkpointing recomputes the same
// masks there too.
TEST(Lora, HalfBaseFusedPathWithSomeTargetsAndDropout) {
  auto ids = reference(kHf + "/llama")["input_ids"];
  auto run = [&](torch::ScalarType dtype,
                 std::vector<std::string> targets,
                 double dropout,
                 bool ckpt) {
    auto model = load("llama", dtype);
    models::LoraSpec spec;
    spec.r = 2;
    spec.alpha = 2; // scaling 1: the adapters' share stays moderate
    spec.dropout = dropout;
    spec.target_modules = targets;
    test::add_random_lora(model, spec, torch::kFloat32, 5);
    model->gradient_checkpointing = ckpt;
    model->train();
    torch::manual_seed(9);
    auto logits = model->forward(ids);
    auto loss = model->loss(ids, ids);
    loss.backward();
    std::vector<torch::Tensor> out = {logits.detach()};
    for (auto& g : test::adapter_grads(model))
      out.push_back(g);
    return out;
  };
  for (auto targets : std::vector<std::vector<std::string>>{
           {"q_proj", "v_proj", "up_proj", "down_proj"},
           {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}}) {
    auto full = run(torch::kFloat32, targets, 0, false);
    auto half = run(torch::kBFloat16, targets, 0, false);
    ASSERT_EQ(full.size(), 1 + 2 * targets.size() * 2); // 2 layers
    const double scale = full[0].abs().max().item<double>();
    EXPECT_LT(max_diff(half[0], full[0]), 0.05 * scale);
    for (size_t i = 1; i < full.size(); ++i) {
      auto a = full[i].flatten().to(torch::kFloat64),
           b = half[i].flatten().to(torch::kFloat64);
      EXPECT_GT((a.dot(b) / (a.norm() * b.norm() + 1e-30)).item<double>(), 0.99)
          << i;
    }
    auto plain = run(torch::kBFloat16, targets, 0.3, false);
    auto recomputed = run(torch::kBFloat16, targets, 0.3, true);
    for (size_t i = 1; i < plain.size(); ++i)
      EXPECT_TRUE(torch::equal(plain[i], recomputed[i])) << i;
  }
}

// A frozen head (LoRA) takes the loss's gradient with respect to the hidden
// states in the forward, chunk by chunk: the loss and the adapters'
// gradients equal plain autograd through the full logits, ignored targets
// included, whatever the chunk size.
TEST(Lora, FrozenHeadLossEqualsPlainCrossEntropy) {
  auto ids = reference(kHf + "/llama")["input_ids"];
  auto targets = next_tokens(ids);
  targets.index_put_({0, 2}, -1);
  for (int64_t chunk : {0, 5, 7}) {
    auto run = [&](bool fused) {
      auto model = load("llama", torch::kFloat64);
      models::LoraSpec spec;
      spec.r = 2;
      test::add_random_lora(model, spec, torch::kFloat64, 4);
      model->train();
      model->loss_chunk_rows = chunk;
      torch::Tensor loss;
      if (fused) {
        loss = model->loss(ids, targets);
      } else {
        auto logits = model->forward(ids);
        loss = F::cross_entropy(
            logits.reshape({-1, logits.size(-1)}),
            targets.reshape({-1}),
            F::CrossEntropyFuncOptions().ignore_index(-1));
      }
      loss.backward();
      std::vector<torch::Tensor> out = {loss.detach()};
      for (auto& g : test::adapter_grads(model))
        out.push_back(g);
      return out;
    };
    auto fused = run(true), plain = run(false);
    ASSERT_EQ(fused.size(), plain.size());
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_LT(max_diff(fused[i], plain[i]), 1e-10) << chunk << " " << i;
  }
}

// GRPO's per-token log-probabilities through the chunked head
// (ops::linear_logprobs) equal the base class's, from the whole logits:
// values and the gradients of every trained tensor, for LoRA (frozen head)
// and for full training (the head trained too), rows starting at different
// columns, at temperature 1 and 0.7.
TEST(HfModel, ChunkedTokenLogprobsEqualTheWholeLogits) {
  auto ids = reference(kHf + "/llama")["input_ids"];
  const int64_t B = ids.size(0), W = 3;
  auto cols = torch::tensor({2, 4}, torch::kLong).unsqueeze(1).expand({B, W}) +
      torch::arange(W, torch::kLong).unsqueeze(0);
  ASSERT_EQ(B, 2);
  auto targets = ids.gather(1, cols + 1);
  for (bool lora : {true, false})
    for (double t : {1.0, 0.7}) {
      auto run = [&](bool chunked) {
        auto model = load("llama", torch::kFloat64);
        if (lora) {
          models::LoraSpec spec;
          spec.r = 2;
          test::add_random_lora(model, spec, torch::kFloat64, 4);
        }
        model->train();
        model->logprob_chunk_rows = 2;
        auto lp = chunked ? model->token_logprobs(ids, 2, cols, targets, t)
                          : model->models::LanguageModel::token_logprobs(
                                ids, 2, cols, targets, t);
        (lp * torch::linspace(-1, 2, lp.numel(), lp.options()).view_as(lp))
            .sum()
            .backward();
        std::vector<torch::Tensor> out = {lp.detach()};
        for (const auto& p : model->parameters())
          if (p.requires_grad() && p.grad().defined())
            out.push_back(p.grad().clone());
        return out;
      };
      auto chunked = run(true), plain = run(false);
      ASSERT_EQ(chunked.size(), plain.size());
      ASSERT_GT(chunked.size(), 1u);
      for (size_t i = 0; i < chunked.size(); ++i)
        EXPECT_LT(max_diff(chunked[i], plain[i]), 1e-10)
            << (lora ? "lora " : "full ") << t << " " << i;
    }
}

// With ORCHARD_PEFT_GOLDEN=DIR: writes an Orchard adapter (random, B
// non-zero), Orchard's logits with it, and the merged model folder, for
// tests/reference/make_hf_fixtures.py --verify-adapter / --verify-merged to
// load with peft and transformers on the CUDA machine.
TEST(Lora, WritesGoldenForPeftWhenAsked) {
  const char* out = std::getenv("ORCHARD_PEFT_GOLDEN");
  if (!out)
    GTEST_SKIP() << "set ORCHARD_PEFT_GOLDEN=DIR to write the files";
  const std::string dir = out;
  torch::manual_seed(11);
  auto model = load("llama");
  models::LoraSpec spec;
  spec.r = 3;
  spec.alpha = 5;
  spec.target_modules = {"q", "k", "v", "o", "gate", "up", "down"};
  model->add_lora(spec, torch::kFloat32);
  {
    torch::NoGradGuard no_grad;
    for (auto& [k, t] : models::adapter_tensors(model))
      t.normal_(0, 0.2);
  }
  models::save_adapter(model, spec, dir + "/adapter", kHf + "/llama");
  auto ids = reference(kHf + "/llama")["input_ids"];
  model->eval();
  torch::NoGradGuard no_grad;
  safetensors::save(
      dir + "/adapter_logits.safetensors",
      {{"input_ids", ids}, {"logits", model->forward(ids)}});
  models::write_merged_model(model, kHf + "/llama", dir + "/merged");
}

} // namespace
} // namespace orchard
