#include "models/llama.h"

#include "core/error.h"
#include "core/safetensors.h"
#include "core/torch_compat.h"
#include "models/checkpointing.h"
#include "models/nf4.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

namespace orchard::models {
namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

const std::map<std::string, std::string> kArchitectures = {
    {"LlamaForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"MistralForCausalLM", "mistral"},
};

torch::ScalarType dtype_of(const std::string& name, const std::string& file) {
  if (name == "float32" || name.empty())
    return torch::kFloat32;
  if (name == "bfloat16")
    return torch::kBFloat16;
  if (name == "float16")
    return torch::kFloat16;
  throw UserError(
      "'" + file + "' has dtype '" + name +
      "'; Orchard reads float32, bfloat16 and float16 models.");
}

int64_t get_int(
    const nlohmann::json& j,
    const char* key,
    const std::string& file) {
  if (!j.contains(key) || !j[key].is_number_integer() ||
      j[key].get<int64_t>() <= 0)
    throw UserError(
        "'" + file + "' needs a positive integer '" + key +
        "'; is this a model folder transformers saved?");
  return j[key].get<int64_t>();
}

// PyTorch's RMSNorm on a half-rotated layout: [x1 c - x2 s, x2 c + x1 s],
// which is x * cos + rotate_half(x) * sin with cos = [c, c], sin = [s, s].
torch::Tensor rotate(
    const torch::Tensor& x,
    const torch::Tensor& c,
    const torch::Tensor& s) {
  const int64_t d = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, d), x2 = x.narrow(-1, d, d);
  return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

} // namespace

std::string supported_architectures() {
  std::string s;
  for (const auto& [a, t] : kArchitectures)
    s += (s.empty() ? "" : ", ") + a;
  return s;
}

HfModelConfig read_hf_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  if (!fs::is_directory(dir))
    throw UserError(
        "model folder '" + dir +
        "' does not exist; give the folder a Hugging Face model was saved "
        "or downloaded to (config.json, *.safetensors, tokenizer.json).");
  std::ifstream in(file);
  if (!in)
    throw UserError(
        "'" + dir +
        "' has no config.json; it is not a Hugging Face model folder.");
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + file + "' is not valid JSON.");
  HfModelConfig c;
  c.raw = j;
  if (j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0].is_string())
    c.architecture = j["architectures"][0];
  c.model_type = j.value("model_type", "");
  auto known = kArchitectures.find(c.architecture);
  if (known == kArchitectures.end())
    throw UserError(
        "'" + file + "' describes " +
        (c.architecture.empty() ? std::string("no architecture")
                                : "a " + c.architecture) +
        "; Orchard reads " + supported_architectures() + ".");
  const std::string act = j.value("hidden_act", "silu");
  if (act != "silu")
    throw UserError(
        "'" + file + "' uses hidden_act '" + act +
        "'; Orchard's Llama-family models use silu.");
  c.vocab_size = get_int(j, "vocab_size", file);
  c.hidden_size = get_int(j, "hidden_size", file);
  c.intermediate_size = get_int(j, "intermediate_size", file);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", file);
  c.num_attention_heads = get_int(j, "num_attention_heads", file);
  c.num_key_value_heads =
      j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
      ? get_int(j, "num_key_value_heads", file)
      : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
      ? get_int(j, "head_dim", file)
      : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = get_int(j, "max_position_embeddings", file);
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  if (known->second == "qwen2") {
    c.qkv_bias = true;
  } else {
    c.qkv_bias = c.o_bias = j.value("attention_bias", false);
    c.mlp_bias = j.value("mlp_bias", false);
  }
  if (known->second == "mistral" && j.contains("sliding_window") &&
      j["sliding_window"].is_number_integer())
    c.sliding_window = j["sliding_window"].get<int64_t>();
  // transformers 5 keeps rope settings in rope_parameters; 4.x in rope_theta
  // and rope_scaling ("type" in older files, "rope_type" in newer ones).
  nlohmann::json rope = nlohmann::json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    rope = j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
    rope = j["rope_scaling"];
  c.rope_theta = rope.contains("rope_theta") ? rope["rope_theta"].get<double>()
                                             : j.value("rope_theta", 10000.0);
  c.rope_type =
      rope.value("rope_type", rope.value("type", std::string("default")));
  if (c.rope_type == "llama3") {
    c.rope_factor = rope.value("factor", 8.0);
    c.low_freq_factor = rope.value("low_freq_factor", 1.0);
    c.high_freq_factor = rope.value("high_freq_factor", 4.0);
    c.original_max_position_embeddings =
        rope.value("original_max_position_embeddings", int64_t(8192));
  } else if (c.rope_type != "default") {
    throw UserError(
        "'" + file + "' uses rope scaling '" + c.rope_type +
        "'; Orchard supports the default rotary embedding and llama3 "
        "scaling.");
  }
  c.dtype = dtype_of(
      j.value("torch_dtype", j.value("dtype", std::string("float32"))), file);
  if (c.head_dim % 2 != 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    throw UserError(
        "'" + file +
        "' has an odd head_dim or num_attention_heads not divisible by "
        "num_key_value_heads; the file is damaged or not a Llama-family "
        "model.");
  return c;
}

const std::vector<std::string>& llama_projections() {
  static const std::vector<std::string> all = {
      "q_proj",
      "k_proj",
      "v_proj",
      "o_proj",
      "gate_proj",
      "up_proj",
      "down_proj"};
  return all;
}

std::vector<std::string> normalize_target_modules(
    const std::vector<std::string>& names) {
  const std::vector<std::string>& all = llama_projections();
  std::vector<std::string> out;
  for (auto n : names) {
    if (n == "all-linear" || n == "all_linear") {
      out = all;
      continue;
    }
    if (n.find("_proj") == std::string::npos)
      n += "_proj";
    if (std::find(all.begin(), all.end(), n) == all.end())
      throw UserError(
          "lora.target_modules names '" + n +
          "'; the Llama-family projections are q_proj, k_proj, v_proj, "
          "o_proj, gate_proj, up_proj and down_proj (or q, k, v, o, gate, "
          "up, down, all-linear).");
    if (std::find(out.begin(), out.end(), n) == out.end())
      out.push_back(n);
  }
  if (out.empty())
    throw UserError(
        "lora.target_modules is empty; name at least one projection.");
  return out;
}

ProjImpl::ProjImpl(torch::Tensor w, torch::Tensor b)
    : out_features(w.size(0)), in_features(w.size(1)) {
  weight = register_parameter("weight", std::move(w));
  if (b.defined())
    bias = register_parameter("bias", std::move(b));
}

void ProjImpl::quantize_4bit() {
  q4 = quantize_nf4(weight.detach());
  // The full-precision weight goes; the parameter stays (empty) so the
  // module's names do not change.
  weight.set_data(torch::empty({0}, weight.options()));
  register_buffer("weight_nf4_codes", q4.codes);
  register_buffer("weight_nf4_absmax", q4.absmax);
}

torch::Tensor ProjImpl::full_weight() const {
  return q4.defined() ? dequantize_nf4(q4) : weight.detach();
}

torch::Tensor ProjImpl::base(const torch::Tensor& x2) const {
  if (q4.defined()) {
    auto y = nf4_linear(x2, q4);
    return bias.defined() ? y + bias : y;
  }
  return bias.defined() ? at::addmm(bias, x2, weight.t())
                        : at::mm(x2, weight.t());
}

torch::Tensor ProjImpl::forward(const torch::Tensor& x) {
  torch::Tensor y;
  if (q4.defined()) {
    auto lead = x.sizes().vec();
    lead.back() = out_features;
    y = base(x.reshape({-1, in_features})).view(lead);
  } else {
    y = F::linear(x, weight, bias);
  }
  if (!has_lora())
    return y;
  const auto& A = lora_A->weight;
  const auto& B = lora_B->weight;
  auto h = x;
  if (dropout > 0 && is_training())
    h = F::dropout(h, F::DropoutFuncOptions().p(dropout).training(true));
  const auto dt = y.scalar_type();
  if ((dt == torch::kBFloat16 || dt == torch::kFloat16) &&
      A.scalar_type() != dt) {
    // A half-precision base: the branch runs in the base's dtype with the
    // adapters cast to it (PEFT under autocast does the same), and the sum
    // is one matrix product with y as its addend: no full-size float32
    // copies of the input or the output.
    auto a = F::linear(h, A.to(dt)); // (..., r)
    auto y2 = y.reshape({-1, y.size(-1)});
    auto out = at::addmm(
        y2,
        a.reshape({-1, a.size(-1)}),
        B.to(dt).t(),
        /*beta=*/1,
        /*alpha=*/scaling);
    return out.view(y.sizes());
  }
  // PEFT's order of operations: the input cast to the adapters' dtype, the
  // sum taken there and cast back.
  auto delta = F::linear(F::linear(h.to(A.scalar_type()), A), B) * scaling;
  if (delta.scalar_type() == dt)
    return y + delta;
  return (y.to(delta.scalar_type()) + delta).to(dt);
}

void ProjImpl::add_lora(
    int64_t r,
    double s,
    double p,
    torch::ScalarType dtype) {
  const int64_t out = out_features, in = in_features;
  auto opt = torch::TensorOptions().dtype(dtype).device(
      q4.defined() ? q4.codes.device() : weight.device());
  const double bound = 1.0 / std::sqrt(double(in));
  lora_A = register_module(
      "lora_A", Weight(torch::empty({r, in}, opt).uniform_(-bound, bound)));
  lora_B = register_module("lora_B", Weight(torch::zeros({out, r}, opt)));
  scaling = s;
  dropout = p;
}

torch::Tensor ProjImpl::merged_weight() const {
  torch::NoGradGuard no_grad;
  auto w = full_weight();
  if (!has_lora())
    return w;
  auto delta = torch::matmul(
                   lora_B->weight.to(torch::kFloat32),
                   lora_A->weight.to(torch::kFloat32)) *
      scaling;
  return (w.to(torch::kFloat32) + delta.to(w.device())).to(w.scalar_type());
}

HfRmsNormImpl::HfRmsNormImpl(torch::Tensor w, double e) : eps(e) {
  weight = register_parameter("weight", std::move(w));
}

torch::Tensor HfRmsNormImpl::forward(const torch::Tensor& x) {
  auto x32 = x.to(torch::kFloat32);
  x32 = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * x32.to(x.scalar_type());
}

torch::Tensor rope_inv_freq(const HfModelConfig& c) {
  const int64_t D = c.head_dim;
  auto inv = 1.0 /
      torch::pow(c.rope_theta,
                 torch::arange(0, D, 2, torch::kInt64).to(torch::kFloat32) /
                     double(D));
  if (c.rope_type != "llama3")
    return inv;
  const double old_len = double(c.original_max_position_embeddings);
  const double low_wavelen = old_len / c.low_freq_factor;
  const double high_wavelen = old_len / c.high_freq_factor;
  auto wavelen = 2 * M_PI / inv;
  auto scaled = torch::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
  auto smooth = (old_len / wavelen - c.low_freq_factor) /
      (c.high_freq_factor - c.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return torch::where(medium, smoothed, scaled);
}

LlamaImpl::LlamaImpl(
    const HfModelConfig& c,
    const WeightSource& get,
    int64_t context)
    : config(c) {
  context_ = context > 0 ? std::min(context, c.max_position_embeddings)
                         : c.max_position_embeddings;
  const int64_t C = c.hidden_size, D = c.head_dim;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  auto w = [&](const std::string& name, std::vector<int64_t> shape) {
    return get(name, shape, false);
  };
  auto proj = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    auto p = Proj(
        w(name + ".weight", {out, in}),
        bias ? w(name + ".bias", {out}) : torch::Tensor());
    if (c.load_in_4bit) // one full-precision matrix at a time
      p->quantize_4bit();
    return p;
  };
  model = register_module("model", LlamaBody());
  model->embed_tokens = model->register_module(
      "embed_tokens",
      Weight(w("model.embed_tokens.weight", {c.vocab_size, C})));
  model->layers = model->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto layer = LlamaLayer();
    layer->self_attn = layer->register_module("self_attn", LlamaAttention());
    auto& a = *layer->self_attn;
    a.n_head = H;
    a.n_kv_head = Hkv;
    a.head_dim = D;
    a.q_proj = a.register_module(
        "q_proj", proj(p + ".self_attn.q_proj", C, H * D, c.qkv_bias));
    a.k_proj = a.register_module(
        "k_proj", proj(p + ".self_attn.k_proj", C, Hkv * D, c.qkv_bias));
    a.v_proj = a.register_module(
        "v_proj", proj(p + ".self_attn.v_proj", C, Hkv * D, c.qkv_bias));
    a.o_proj = a.register_module(
        "o_proj", proj(p + ".self_attn.o_proj", H * D, C, c.o_bias));
    layer->mlp = layer->register_module("mlp", LlamaMlp());
    auto& m = *layer->mlp;
    const int64_t I = c.intermediate_size;
    m.gate_proj = m.register_module(
        "gate_proj", proj(p + ".mlp.gate_proj", C, I, c.mlp_bias));
    m.up_proj = m.register_module(
        "up_proj", proj(p + ".mlp.up_proj", C, I, c.mlp_bias));
    m.down_proj = m.register_module(
        "down_proj", proj(p + ".mlp.down_proj", I, C, c.mlp_bias));
    layer->input_layernorm = layer->register_module(
        "input_layernorm",
        HfRmsNorm(w(p + ".input_layernorm.weight", {C}), c.rms_norm_eps));
    layer->post_attention_layernorm = layer->register_module(
        "post_attention_layernorm",
        HfRmsNorm(
            w(p + ".post_attention_layernorm.weight", {C}), c.rms_norm_eps));
    model->layers->push_back(layer);
  }
  model->norm = model->register_module(
      "norm", HfRmsNorm(w("model.norm.weight", {C}), c.rms_norm_eps));
  auto head = get("lm_head.weight", {c.vocab_size, C}, c.tie_word_embeddings);
  if (head.defined() && c.tie_word_embeddings) {
    // A tied model saved with both keys: they hold the same values.
    head = torch::Tensor();
  }
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", Proj(head, torch::Tensor()));
  // Rotary tables, float32 as transformers computes them.
  auto inv = rope_inv_freq(c);
  auto t = torch::arange(context_, torch::kInt64).to(torch::kFloat32);
  auto angles = torch::outer(t, inv); // (context, D/2)
  auto dev = model->embed_tokens->weight.device();
  rope_cos_ = register_buffer("rope_cos", angles.cos().to(dev));
  rope_sin_ = register_buffer("rope_sin", angles.sin().to(dev));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layer_fns_.push_back([this, i](const torch::Tensor& x) {
      const auto [cos, sin] = rope_tables(x.scalar_type());
      const int64_t T = x.size(1);
      return layer_forward(
          i, x, cos.narrow(0, 0, T), sin.narrow(0, 0, T), nullptr, nullptr);
    });
}

torch::Tensor LlamaImpl::lm_weight() const {
  return lm_head.is_empty() ? model->embed_tokens->weight : lm_head->weight;
}

std::pair<torch::Tensor, torch::Tensor> LlamaImpl::rope_tables(
    torch::ScalarType dtype) {
  if (!rope_full_cos_.defined() || rope_full_cos_.scalar_type() != dtype ||
      rope_full_cos_.device() != rope_cos_.device()) {
    torch::NoGradGuard no_grad;
    rope_full_cos_ = torch::cat({rope_cos_, rope_cos_}, -1).to(dtype);
    rope_full_sin_ = torch::cat({-rope_sin_, rope_sin_}, -1).to(dtype);
  }
  return {rope_full_cos_, rope_full_sin_};
}

namespace {

// x (B, T, heads, D) rotated by the (T, D) tables of rope_tables():
// x * [c, c] + [x2, x1] * [-s, s], which is transformers'
// x * cos + rotate_half(x) * sin element for element (negation is exact).
torch::Tensor rotate_full(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin) {
  const int64_t T = x.size(1), D = x.size(-1);
  auto c = cos.view({1, T, 1, D}), s = sin.view({1, T, 1, D});
  return x * c + torch::roll(x, D / 2, -1) * s;
}

// A layer's adapters cast to a half-precision base's dtype with one cast:
// the float32 leaves are concatenated, cast, and split into views, so the
// backward is one concatenation and one cast too, instead of one cast per
// tensor each way. Where q, k and v (or gate and up) all carry adapters
// without dropout, their A matrices are adjacent rows: one (3r, in) matrix,
// one product with the shared input.
struct LayerAdapters {
  torch::Tensor A[7], B[7];
  torch::Tensor A_qkv, A_gate_up; // fused where possible
};

LayerAdapters cast_adapters(
    const std::array<ProjImpl*, 7>& ps,
    torch::ScalarType dtype) {
  LayerAdapters out;
  const bool fuse_qkv = ps[0]->has_lora() && ps[1]->has_lora() &&
      ps[2]->has_lora() && ps[0]->dropout == 0 && ps[1]->dropout == 0 &&
      ps[2]->dropout == 0;
  const bool fuse_gu = ps[4]->has_lora() && ps[5]->has_lora() &&
      ps[4]->dropout == 0 && ps[5]->dropout == 0;
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> sizes;
  // Pieces: (proj index, is_A, fused group size)
  struct Piece {
    int proj;
    bool a;
    int group;
  };
  std::vector<Piece> pieces;
  for (int i = 0; i < 7; ++i) {
    if (!ps[size_t(i)]->has_lora())
      continue;
    const auto& A = ps[size_t(i)]->lora_A->weight;
    flat.push_back(A.reshape({-1}));
    const bool first_of_qkv = fuse_qkv && i == 0;
    const bool first_of_gu = fuse_gu && i == 4;
    if ((fuse_qkv && (i == 1 || i == 2)) || (fuse_gu && i == 5)) {
      sizes.back() += A.numel();
      continue;
    }
    sizes.push_back(A.numel());
    pieces.push_back({i, true, first_of_qkv ? 3 : first_of_gu ? 2 : 1});
  }
  for (int i = 0; i < 7; ++i) {
    if (!ps[size_t(i)]->has_lora())
      continue;
    const auto& B = ps[size_t(i)]->lora_B->weight;
    flat.push_back(B.reshape({-1}));
    sizes.push_back(B.numel());
    pieces.push_back({i, false, 1});
  }
  if (flat.empty())
    return out;
  auto parts = torch::cat(flat).to(dtype).split_with_sizes(sizes);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& pc = pieces[k];
    const auto& w = pc.a ? ps[size_t(pc.proj)]->lora_A->weight
                         : ps[size_t(pc.proj)]->lora_B->weight;
    if (!pc.a) {
      out.B[pc.proj] = parts[k].view(w.sizes());
    } else if (pc.group == 1) {
      out.A[pc.proj] = parts[k].view(w.sizes());
    } else {
      auto fused = parts[k].view({-1, w.size(1)});
      (pc.proj == 0 ? out.A_qkv : out.A_gate_up) = fused;
    }
  }
  return out;
}

// h2 W^T (+ b) as a fresh (N, out) tensor, with the adapter's
// scaling * a2 B^T added in place (no copy of the output).
torch::Tensor project(
    const ProjImpl& p,
    const torch::Tensor& h2,
    const torch::Tensor& a2,
    const torch::Tensor& B) {
  auto y = p.base(h2);
  if (a2.defined())
    y.addmm_(a2, B.t(), /*beta=*/1, /*alpha=*/p.scaling);
  return y;
}

// The (N, r) adapter input of projection i: a column block of the fused
// product, or its own (dropout applied per projection, as PEFT does).
torch::Tensor adapter_input(
    const ProjImpl& p,
    const torch::Tensor& h2,
    const torch::Tensor& A,
    bool training) {
  auto h = h2;
  if (p.dropout > 0 && training)
    h = F::dropout(h, F::DropoutFuncOptions().p(p.dropout).training(true));
  return at::mm(h, A.t());
}

} // namespace

torch::Tensor LlamaImpl::layer_forward(
    int64_t i,
    torch::Tensor x,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    torch::Tensor* cache_k,
    torch::Tensor* cache_v) {
  auto* layer = model->layers[i]->as<LlamaLayerImpl>();
  auto& a = *layer->self_attn;
  auto& m = *layer->mlp;
  const int64_t B = x.size(0), T = x.size(1);
  const std::array<ProjImpl*, 7> ps = {
      a.q_proj.get(),
      a.k_proj.get(),
      a.v_proj.get(),
      a.o_proj.get(),
      m.gate_proj.get(),
      m.up_proj.get(),
      m.down_proj.get()};
  const auto dt = x.scalar_type();
  const bool half = dt == torch::kBFloat16 || dt == torch::kFloat16;
  bool adapters = false;
  for (auto* p : ps)
    adapters =
        adapters || (p->has_lora() && p->lora_A->weight.scalar_type() != dt);
  // A half-precision base with float32 adapters: the fused path above.
  // Otherwise (float32 base, or no adapters) each projection's own forward
  // (PEFT's order of operations where adapters exist).
  const bool fused = half && adapters;
  LayerAdapters ad;
  if (fused)
    ad = cast_adapters(ps, dt);
  const bool training = is_training();
  // Projections of h (B, T, in) -> (B*T, out) for the listed indices.
  auto run = [&](const torch::Tensor& h,
                 std::initializer_list<int> idx,
                 const torch::Tensor& fusedA) {
    std::vector<torch::Tensor> ys;
    if (!fused) {
      for (int k : idx)
        ys.push_back(ps[size_t(k)]->forward(h).reshape({B * T, -1}));
      return ys;
    }
    auto h2 = h.reshape({B * T, h.size(-1)});
    std::vector<torch::Tensor> as;
    if (fusedA.defined())
      as = at::mm(h2, fusedA.t())
               .split(ps[size_t(*idx.begin())]->lora_A->weight.size(0), 1);
    size_t j = 0;
    for (int k : idx) {
      const auto& p = *ps[size_t(k)];
      torch::Tensor a2;
      if (fusedA.defined())
        a2 = as[j];
      else if (p.has_lora())
        a2 = adapter_input(p, h2, ad.A[k], training);
      ys.push_back(project(p, h2, a2, ad.B[k]));
      ++j;
    }
    return ys;
  };
  auto h = layer->input_layernorm(x);
  auto qkv = run(h, {0, 1, 2}, ad.A_qkv);
  auto q = rotate_full(qkv[0].view({B, T, a.n_head, a.head_dim}), cos, sin)
               .transpose(1, 2);
  auto k = rotate_full(qkv[1].view({B, T, a.n_kv_head, a.head_dim}), cos, sin)
               .transpose(1, 2);
  auto v = qkv[2].view({B, T, a.n_kv_head, a.head_dim}).transpose(1, 2);
  if (cache_k) {
    if (cache_k->defined()) {
      k = torch::cat({*cache_k, k}, 2);
      v = torch::cat({*cache_v, v}, 2);
    }
    *cache_k = k;
    *cache_v = v;
  }
  if (a.n_kv_head != a.n_head) {
    k = k.repeat_interleave(a.n_head / a.n_kv_head, 1);
    v = v.repeat_interleave(a.n_head / a.n_kv_head, 1);
  }
  auto y = compat::causal_attention(q, k, v); // (B, H, T, D)
  y = y.transpose(1, 2).reshape({B, T, a.n_head * a.head_dim});
  x = x + run(y, {3}, {})[0].view({B, T, -1});
  h = layer->post_attention_layernorm(x);
  auto gu = run(h, {4, 5}, ad.A_gate_up);
  auto act = (torch::silu(gu[0]) * gu[1]).view({B, T, -1});
  return x + run(act, {6}, {})[0].view({B, T, -1});
}

torch::Tensor LlamaImpl::hidden(const torch::Tensor& idx, KvCache* cache) {
  const int64_t T = idx.size(1);
  const int64_t start = cache ? cache->length() : 0;
  if (start + T > context_)
    throw UserError(
        "the sequence (" + std::to_string(start + T) +
        " tokens) is longer than this model's context of " +
        std::to_string(context_) + " tokens.");
  if (config.sliding_window && start + T > *config.sliding_window)
    throw UserError(
        "the sequence (" + std::to_string(start + T) +
        " tokens) is longer than the model's sliding_window (" +
        std::to_string(*config.sliding_window) +
        "); Orchard does not implement sliding-window attention, so keep "
        "sequences within it (max_seq_length).");
  if (cache && cache->k.empty()) {
    cache->k.resize(config.num_hidden_layers);
    cache->v.resize(config.num_hidden_layers);
  }
  auto x = F::embedding(idx, model->embed_tokens->weight);
  const auto [cos_all, sin_all] = rope_tables(x.scalar_type());
  auto cos = cos_all.narrow(0, start, T), sin = sin_all.narrow(0, start, T);
  const bool recompute = gradient_checkpointing && is_training() && !cache &&
      torch::GradMode::is_enabled();
  if (recompute && !x.requires_grad())
    // A frozen embedding (LoRA): the recomputed layers still need a graph
    // to hand gradients to their adapters.
    x = x.detach().requires_grad_(true);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    x = recompute ? checkpointed(layer_fns_[size_t(i)], x)
                  : layer_forward(
                        i,
                        x,
                        cos,
                        sin,
                        cache ? &cache->k[size_t(i)] : nullptr,
                        cache ? &cache->v[size_t(i)] : nullptr);
  return model->norm(x);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, KvCache* cache) {
  auto h = hidden(idx, cache);
  auto logits = lm_head.is_empty() ? F::linear(h, lm_weight()) : lm_head(h);
  return logits.scalar_type() == torch::kFloat64 ? logits
                                                 : logits.to(torch::kFloat32);
}

namespace {

// The summed cross-entropy of h W^T against targets (-1: ignored), over
// chunks of rows, for a frozen W (LoRA): the gradient with respect to h,
// (softmax - onehot) W per chunk, is taken in the forward while the chunk's
// logits exist, so the backward only scales it; no (rows, V) logits are
// kept, and none are computed twice.
struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx,
      const torch::Tensor& h,
      const torch::Tensor& w,
      const torch::Tensor& targets,
      int64_t chunk) {
    const int64_t rows = h.size(0);
    const bool need = h.requires_grad();
    torch::Tensor dh = need ? torch::empty_like(h) : torch::Tensor();
    // float32 arithmetic (float64 for a float64 model, as forward() keeps)
    const auto acc =
        h.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    auto total = torch::zeros({}, h.options().dtype(acc));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      auto t = targets.narrow(0, r0, n);
      auto logits = at::mm(h.narrow(0, r0, n), w.t()).to(acc);
      auto lse = logits.logsumexp(-1, /*keepdim=*/true); // (n, 1)
      auto valid = t.ne(-1).unsqueeze(1);
      auto tc = t.clamp_min(0).unsqueeze(1);
      total.add_(((lse - logits.gather(1, tc)) * valid).sum());
      if (need) {
        auto p = logits.sub_(lse).exp_(); // softmax, in the logits' memory
        p.scatter_add_(1, tc, torch::full_like(lse, -1));
        p.mul_(valid);
        auto out = dh.narrow(0, r0, n);
        at::mm_out(out, p.to(h.scalar_type()), w);
      }
    }
    ctx->save_for_backward({dh});
    return total;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto dh = ctx->get_saved_variables()[0];
    return {
        dh * grads[0].to(dh.scalar_type()),
        torch::Tensor(),
        torch::Tensor(),
        torch::Tensor()};
  }
};

} // namespace

torch::Tensor LlamaImpl::loss(
    const torch::Tensor& idx,
    const torch::Tensor& targets) {
  auto h = hidden(idx); // (B, T, C)
  const int64_t C = h.size(-1);
  auto flat = h.reshape({-1, C});
  auto tgt = targets.reshape({-1});
  auto counted = tgt.ne(-1).sum();
  // Chunks of about 16M logits: at a vocabulary of 128K, 128 rows each.
  const int64_t rows = flat.size(0);
  const int64_t chunk = loss_chunk_rows > 0
      ? loss_chunk_rows
      : std::max<int64_t>(
            1, std::min<int64_t>(rows, (int64_t(1) << 24) / config.vocab_size));
  const bool training = is_training() && torch::GradMode::is_enabled();
  if (training && !lm_weight().requires_grad()) { // a frozen head (LoRA)
    auto total = LinearCrossEntropy::apply(flat, lm_weight(), tgt, chunk);
    return total / counted.clamp_min(1).to(total.scalar_type());
  }
  loss_fns_.clear();
  // checkpointed() keeps a pointer to its function: no reallocation.
  loss_fns_.reserve(size_t((rows + chunk - 1) / chunk));
  torch::Tensor total;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    auto t = tgt.narrow(0, r0, n);
    auto fn = [this, t](const torch::Tensor& x) {
      auto logits = lm_head.is_empty() ? F::linear(x, lm_weight()) : lm_head(x);
      return F::cross_entropy(
          logits.to(torch::kFloat32),
          t,
          F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
    };
    auto part = flat.narrow(0, r0, n);
    torch::Tensor l;
    if (training && rows > chunk) {
      loss_fns_.push_back(fn);
      l = checkpointed(loss_fns_.back(), part);
    } else {
      l = fn(part);
    }
    total = total.defined() ? total + l : l;
  }
  return total / counted.clamp_min(1).to(total.scalar_type());
}

torch::Tensor LlamaImpl::decode_batch(
    const torch::Tensor& idx,
    const torch::Tensor& pos,
    BatchKvCache& cache) {
  const int64_t B = idx.size(0), Tmax = context_;
  if (cache.k.empty())
    throw std::invalid_argument("[decode_batch] empty cache");
  auto cos = rope_cos_.index_select(0, pos).view({B, 1, 1, -1});
  auto sin = rope_sin_.index_select(0, pos).view({B, 1, 1, -1});
  auto visible =
      (torch::arange(Tmax, pos.options()).view({1, Tmax}) <= pos.view({B, 1}))
          .view({B, 1, 1, Tmax});
  auto x = F::embedding(idx.view({B, 1}), model->embed_tokens->weight);
  using torch::indexing::Slice;
  auto rows = torch::arange(B, pos.options());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto* layer = model->layers[i]->as<LlamaLayerImpl>();
    auto& a = *layer->self_attn;
    auto h = layer->input_layernorm(x);
    auto q = a.q_proj(h).view({B, 1, a.n_head, a.head_dim}).transpose(1, 2);
    auto k = a.k_proj(h).view({B, 1, a.n_kv_head, a.head_dim}).transpose(1, 2);
    auto v = a.v_proj(h).view({B, 1, a.n_kv_head, a.head_dim});
    auto c = cos.to(q.scalar_type()), s = sin.to(q.scalar_type());
    q = rotate(q, c, s);                 // (B, H, 1, D)
    k = rotate(k, c, s).transpose(1, 2); // (B, 1, Hkv, D)
    auto& ck = cache.k[size_t(i)];
    auto& cv = cache.v[size_t(i)];
    ck.index_put_(
        {rows, Slice(), pos},
        k.reshape({B, a.n_kv_head, a.head_dim}).to(ck.scalar_type()));
    cv.index_put_(
        {rows, Slice(), pos},
        v.reshape({B, a.n_kv_head, a.head_dim}).to(cv.scalar_type()));
    auto keys = ck, values = cv;
    if (a.n_kv_head != a.n_head) {
      keys = keys.repeat_interleave(a.n_head / a.n_kv_head, 1);
      values = values.repeat_interleave(a.n_head / a.n_kv_head, 1);
    }
    const auto acc =
        q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    auto scores = torch::matmul(q.to(acc), keys.transpose(-2, -1).to(acc)) /
        std::sqrt(double(a.head_dim)); // (B, H, 1, Tmax)
    scores = scores.masked_fill(
        visible.logical_not(), -std::numeric_limits<float>::infinity());
    auto y = torch::matmul(
        torch::softmax(scores, -1).to(q.scalar_type()),
        values.to(q.scalar_type()));
    y = y.transpose(1, 2).reshape({B, 1, a.n_head * a.head_dim});
    x = x + a.o_proj(y);
    auto& m = *layer->mlp;
    h = layer->post_attention_layernorm(x);
    x = x + m.down_proj(torch::silu(m.gate_proj(h)) * m.up_proj(h));
  }
  auto h = model->norm(x);
  auto logits = lm_head.is_empty() ? F::linear(h, lm_weight()) : lm_head(h);
  logits = logits.view({B, -1});
  return logits.scalar_type() == torch::kFloat64 ? logits
                                                 : logits.to(torch::kFloat32);
}

std::vector<std::pair<std::string, Proj>> LlamaImpl::projections() const {
  std::vector<std::pair<std::string, Proj>> out;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto* layer = model->layers->ptr(size_t(i))->as<LlamaLayerImpl>();
    auto& a = *layer->self_attn;
    auto& m = *layer->mlp;
    out.push_back({p + ".self_attn.q_proj", a.q_proj});
    out.push_back({p + ".self_attn.k_proj", a.k_proj});
    out.push_back({p + ".self_attn.v_proj", a.v_proj});
    out.push_back({p + ".self_attn.o_proj", a.o_proj});
    out.push_back({p + ".mlp.gate_proj", m.gate_proj});
    out.push_back({p + ".mlp.up_proj", m.up_proj});
    out.push_back({p + ".mlp.down_proj", m.down_proj});
  }
  return out;
}

int64_t LlamaImpl::add_lora(const LoraSpec& spec, torch::ScalarType dtype) {
  auto targets = normalize_target_modules(spec.target_modules);
  if (spec.r <= 0)
    throw UserError("lora.r must be at least 1.");
  for (auto& p : parameters())
    p.set_requires_grad(false);
  int64_t added = 0;
  for (auto& [name, proj] : projections()) {
    const std::string leaf = name.substr(name.rfind('.') + 1);
    if (std::find(targets.begin(), targets.end(), leaf) == targets.end())
      continue;
    proj->add_lora(spec.r, spec.scaling(), spec.dropout, dtype);
    ++added;
  }
  return added;
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaImpl::merged_state()
    const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::map<std::string, Proj> projs;
  for (auto& [name, p] : projections())
    projs.emplace(name, p);
  for (const auto& named : named_parameters()) {
    const std::string& key = named.key();
    if (key.find(".lora_") != std::string::npos)
      continue;
    const std::string owner = key.substr(0, key.rfind('.'));
    auto it = projs.find(owner);
    if (it != projs.end() && key.ends_with(".weight"))
      out.push_back({key, it->second->merged_weight()});
    else
      out.push_back({key, named.value().detach()});
  }
  return out;
}

Llama load_hf_model(const std::string& dir, const LoadOptions& opt) {
  HfModelConfig c = read_hf_config(dir);
  // transformers' names: one model.safetensors, or shards listed in
  // model.safetensors.index.json. Other .safetensors files in the folder
  // (adapters, references) are not the model's.
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(index) && !fs::exists(single))
    throw UserError(
        "model folder '" + dir +
        "' holds no weights: it needs model.safetensors, or shards with "
        "model.safetensors.index.json (PyTorch .bin files are not read; "
        "convert them with save_pretrained(safe_serialization=True)).");
  safetensors::Reader reader = safetensors::Reader::open(
      fs::exists(index) ? index.string() : single.string());
  const torch::ScalarType dtype = opt.dtype.value_or(c.dtype);
  WeightSource get = [&](const std::string& name,
                         const std::vector<int64_t>& shape,
                         bool optional) -> torch::Tensor {
    if (!reader.contains(name)) {
      if (optional)
        return {};
      throw UserError(
          "model folder '" + dir + "' lacks the weight '" + name + "' a " +
          c.architecture +
          " needs; the files are incomplete or of another architecture.");
    }
    auto t = reader.get(name);
    if (t.sizes() != torch::IntArrayRef(shape))
      throw UserError(
          "weight '" + name + "' in '" + dir + "' has shape " +
          c10::str(t.sizes()) + " but config.json implies " +
          c10::str(torch::IntArrayRef(shape)) + ".");
    // One copy, from the mapped file to the device and dtype asked for.
    auto out = t.to(opt.device, dtype, /*non_blocking=*/false, /*copy=*/true);
    return out;
  };
  c.load_in_4bit = opt.load_in_4bit;
  Llama model(c, get, opt.context);
  model->config.dtype = dtype;
  return model;
}

} // namespace orchard::models
