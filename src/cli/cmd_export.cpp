// `orchard export`: a model for other tools.
//   gguf    one llama.cpp file (export/hf_gguf.h)
//   ollama  the GGUF plus a Modelfile (export/modelfile.h)
//   hf      Orchard's own GPT as safetensors with its config (it has no
//           llama.cpp architecture)
#include "cli/common.h"
#include "core/error.h"
#include "core/files.h"
#include "core/safetensors.h"
#include "export/hf_gguf.h"
#include "export/modelfile.h"
#include "runs/load.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace orchard::cli {

namespace {

namespace fs = std::filesystem;

std::string type_help() {
  std::string s;
  for (const auto& t : gguf::export_types())
    s += (s.empty() ? "" : "|") + t;
  return s;
}

void refuse_existing(const std::string& path, bool force) {
  if (fs::exists(path) && !force)
    throw UserError(
        path + " exists; choose another --out or add --force to replace it.");
}

gguf::ExportReport run_gguf(const gguf::ExportOptions& in) {
  gguf::ExportOptions opt = in;
  opt.log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  gguf::ExportReport r = gguf::export_gguf(opt);
  std::printf(
      "Wrote %s: %.1f MiB, %lld tensors, %.2f %s parameters, arch %s, type "
      "%s, tokenizer %s%s, in %.1f s\n",
      opt.out.c_str(),
      static_cast<double>(r.bytes) / (1 << 20),
      static_cast<long long>(r.tensors),
      static_cast<double>(r.parameters) / (r.parameters >= 1e9 ? 1e9 : 1e6),
      r.parameters >= 1e9 ? "B" : "M",
      r.arch.c_str(),
      r.type.c_str(),
      r.tokenizer.c_str(),
      r.chat_template ? ", chat template" : ", no chat template",
      r.seconds);
  return r;
}

} // namespace

Command register_export(CLI::App& root) {
  struct State {
    gguf::ExportOptions gguf;
    std::string name, checkpoint, out_dir;
    bool force = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "export", "Write a model for llama.cpp, Ollama or other tools");
  app->require_subcommand(1);

  auto add_source = [&](CLI::App* sub) {
    sub->add_option(
           "--model",
           st->gguf.model_dir,
           "a Hugging Face model folder (Llama, Mistral, Qwen2)")
        ->required();
    sub->add_option(
        "--adapter",
        st->gguf.adapter,
        "a LoRA adapter to merge first (PEFT's folder or an orchard train "
        "stage=lora run)");
    sub->add_option("--type", st->gguf.type, type_help())
        ->capture_default_str();
    sub->add_flag("--force", st->force, "replace an existing output");
  };

  CLI::App* gg =
      app->add_subcommand("gguf", "One GGUF file for llama.cpp and LM Studio");
  add_source(gg);
  gg->add_option("--out", st->gguf.out, "the .gguf file to write")->required();
  auto do_gguf = [st] {
    refuse_existing(st->gguf.out, st->force);
    run_gguf(st->gguf);
    std::printf("Run it: llama-cli -m %s\n", st->gguf.out.c_str());
  };

  CLI::App* ol = app->add_subcommand(
      "ollama", "A GGUF file and a Modelfile for `ollama create`");
  add_source(ol);
  ol->add_option("--out", st->out_dir, "the folder to write")->required();
  ol->add_option(
      "--name", st->name, "the model's name (default: the folder's)");
  auto do_ollama = [st] {
    if (st->name.empty()) {
      fs::path p = fs::path(st->gguf.model_dir).lexically_normal();
      st->name =
          (p.filename().empty() ? p.parent_path() : p).filename().string();
    }
    for (char& c : st->name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.')
        c = '-';
    const fs::path dir(st->out_dir);
    fs::create_directories(dir);
    const std::string file = st->name + "-" + st->gguf.type + ".gguf";
    st->gguf.out = (dir / file).string();
    refuse_existing(st->gguf.out, st->force);
    refuse_existing((dir / "Modelfile").string(), st->force);
    gguf::ExportReport r = run_gguf(st->gguf);
    gguf::ModelfileInput in;
    in.gguf_name = file;
    in.chat_template = r.chat_template_text;
    in.end_of_turn = r.end_of_turn;
    gguf::Modelfile m = gguf::make_modelfile(in);
    atomic_write((dir / "Modelfile").string(), m.text);
    std::printf(
        "Wrote %s (template: %s; stops: %zu)\nCreate it: ollama create %s -f %s\n",
        (dir / "Modelfile").c_str(),
        m.family.empty() ? "the GGUF's own" : m.family.c_str(),
        r.end_of_turn.size(),
        st->name.c_str(),
        (dir / "Modelfile").c_str());
  };

  CLI::App* hf = app->add_subcommand(
      "hf", "Orchard's own GPT as safetensors with its config");
  hf->add_option(
        "--checkpoint",
        st->checkpoint,
        "a run of orchard train or a checkpoint folder")
      ->required();
  hf->add_option("--out", st->out_dir, "the folder to write")->required();
  hf->add_flag("--force", st->force, "replace files in an existing folder");
  auto do_hf = [st] {
    if (fs::exists(st->out_dir) && !fs::is_empty(st->out_dir) && !st->force)
      throw UserError(
          "--out " + st->out_dir +
          " exists and is not empty; choose a new folder or add --force.");
    runs::TrainedGpt g = runs::load_gpt(st->checkpoint);
    fs::create_directories(st->out_dir);
    std::vector<std::pair<std::string, torch::Tensor>> weights;
    for (const auto& p : g.model->named_parameters())
      weights.push_back({p.key(), p.value().detach().contiguous()});
    safetensors::save(
        (fs::path(st->out_dir) / "model.safetensors").string(),
        weights,
        {{"format", "pt"}});
    const models::GptConfig& c = g.config;
    nlohmann::json config = {
        {"architectures", {"OrchardGPT"}},
        {"model_type", "orchard-gpt"},
        {"vocab_size", c.vocab_size},
        {"n_layer", c.n_layer},
        {"n_embd", c.n_embd},
        {"n_head", c.n_head},
        {"n_kv_head", c.n_kv_head},
        {"max_seq_len", c.max_seq_len},
        {"rope_base", c.rope_base},
        {"logit_softcap", c.softcap},
        {"mlp", "relu_squared"},
        {"qk_norm", true},
        {"tie_word_embeddings", false},
        {"torch_dtype", "float32"},
        {"orchard_checkpoint", g.checkpoint_dir},
        {"orchard_step", g.step},
    };
    atomic_write(
        (fs::path(st->out_dir) / "config.json").string(),
        config.dump(2) + "\n");
    if (!g.tokenizer_dir.empty()) {
      for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
        fs::path from = fs::path(g.tokenizer_dir) / name;
        if (fs::exists(from))
          fs::copy_file(
              from,
              fs::path(st->out_dir) / name,
              fs::copy_options::overwrite_existing);
      }
    }
    std::printf(
        "Wrote %s: model.safetensors (%zu tensors, step %lld), config.json "
        "(Orchard's GPT: docs/export.md describes it), tokenizer files\n",
        st->out_dir.c_str(),
        weights.size(),
        static_cast<long long>(g.step));
  };
  return {app, [=] {
            if (gg->parsed())
              do_gguf();
            else if (ol->parsed())
              do_ollama();
            else
              do_hf();
            return 0;
          }};
}

} // namespace orchard::cli
