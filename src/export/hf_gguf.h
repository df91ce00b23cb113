// `orchard export gguf`: a Hugging Face Llama, Mistral or Qwen2 folder (with
// a LoRA adapter merged first when given) as one GGUF file llama.cpp,
// LM Studio and Ollama run.
//
// What differs from the checkpoint, per llama.cpp's conventions:
// - names: model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight,
//   embed_tokens -> token_embd, lm_head -> output (left out when tied:
//   llama.cpp then reads token_embd), and so on;
// - Llama and Mistral are arch `llama`, whose rotary pairs adjacent values
//   (2i, 2i+1) where transformers pairs i with i + D/2: the rows of
//   q_proj and k_proj are permuted per head so the two agree. Qwen2 (arch
//   `qwen2`) rotates halves like transformers and is written as is;
// - Llama 3.1's rotary scaling becomes the rope_freqs tensor (one divisor
//   per frequency), which llama.cpp applies;
// - --type picks the encoding: f16, bf16, q8_0, q4_0 or q4_K_M. As in
//   llama.cpp's own quantiser, norms and biases stay float32, q4_0 and
//   q4_K_M keep the output matrix in q6_K, q4_K_M gives attn_v and ffn_down
//   q6_K in the layers use_more_bits picks, and a k-quant on a row that is
//   not a multiple of 256 falls back (q4_K -> q5_0, q6_K -> q8_0).
#pragma once

#include "export/ggml_quants.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::gguf {

struct ExportOptions {
  std::string model_dir;
  std::string adapter; // "" for none
  std::string out;     // the .gguf file
  std::string type = "f16";
  // Tests only: false writes Llama's q/k rows unpermuted, the classic broken
  // conversion llama.cpp loads and runs, producing wrong text.
  bool permute_rotary = true;
  std::function<void(const std::string&)> log; // progress lines
};

struct ExportReport {
  std::string arch;  // "llama", "qwen2"
  std::string type;  // as asked
  int64_t bytes = 0; // the file's size
  int64_t parameters = 0;
  int64_t tensors = 0;
  std::vector<std::string>
      fallbacks;                  // "blk.0.ffn_down.weight: q4_K -> q5_0 (...)"
  std::vector<std::string> notes; // what llama.cpp will do differently
  // Each checkpoint tensor's encoding in the file.
  std::vector<std::pair<std::string, TensorType>> types;
  std::string tokenizer; // "gpt2 (pre gpt-2)", "llama (scores from merges)"
  bool chat_template = false;
  std::string chat_template_text; // the Jinja template, "" for none
  std::vector<std::string> end_of_turn;
  std::string bos;
  double seconds = 0;
};

// The types --type accepts, for help and messages.
const std::vector<std::string>& export_types();

// UserError (exit 2) for an unknown architecture or type, a missing
// tokenizer, a folder that is an Orchard run, a shape the type cannot
// pack.
ExportReport export_gguf(const ExportOptions& opt);

// Whether `dir` is an Orchard run or checkpoint folder (its own GPT, which
// has no llama.cpp architecture).
bool is_orchard_run(const std::string& dir);

} // namespace orchard::gguf
