// `orchard lora merge`: fold a LoRA adapter into its base model and write a
// full model folder (safetensors, config, tokenizer files) that
// transformers, llama.cpp's converters and Orchard load like any other.
#include "cli/common.h"
#include "core/dtype.h"
#include "core/error.h"
#include "models/lora.h"

#include <cstdio>
#include <filesystem>
#include <memory>

namespace orchard::cli {

Command register_lora(CLI::App& root) {
  struct State {
    std::string model, adapter, out;
    std::string dtype = "auto";
    bool force = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* lora = root.add_subcommand("lora", "LoRA adapters: merge");
  lora->require_subcommand(1);
  CLI::App* merge = lora->add_subcommand(
      "merge",
      "Fold an adapter into its base model and write a full model folder");
  merge->add_option("--model", st->model, "the base model folder")->required();
  merge
      ->add_option(
          "--adapter",
          st->adapter,
          "the adapter folder (PEFT's format) or an orchard train "
          "stage=lora run folder")
      ->required();
  merge->add_option("--out", st->out, "the folder to write")->required();
  merge
      ->add_option(
          "--dtype",
          st->dtype,
          "the merged weights' dtype: auto (the base's), float32, bfloat16, "
          "float16")
      ->capture_default_str();
  merge->add_flag("--force", st->force, "replace files in a non-empty --out");
  return {
      lora, [st] {
        namespace fs = std::filesystem;
        if (fs::exists(st->out) && !fs::is_empty(st->out) && !st->force)
          throw UserError(
              "--out " + st->out +
              " exists and is not empty; choose a new folder or add --force.");
        if (fs::absolute(st->out).lexically_normal() ==
            fs::absolute(st->model).lexically_normal())
          throw UserError("--out must not be the base model's folder.");
        models::LoadOptions opt; // on the CPU: merging is one pass
        opt.dtype = parse_dtype(st->dtype, "--dtype");
        opt.context = 1; // no rotary tables needed
        models::Llama model = models::load_hf_model(st->model, opt);
        const std::string adapter = runs::adapter_folder(st->adapter);
        models::load_adapter(model, adapter, torch::kFloat32);
        models::write_merged_model(model, st->model, st->out);
        std::printf(
            "Merged %s into %s (%s weights): %s\n"
            "Use it: orchard chat --model %s\n",
            adapter.c_str(),
            st->model.c_str(),
            st->dtype == "auto" ? "the base's" : st->dtype.c_str(),
            st->out.c_str(),
            st->out.c_str());
        return 0;
      }};
}

} // namespace orchard::cli
