#include "export/modelfile.h"

namespace orchard::gguf {

namespace {

// Ollama's templates see .System, .Prompt and .Response (one turn; Ollama
// repeats the template over earlier turns). The text between the markers is
// each family's own format, as its Jinja template writes it.
const char* const kLlama3 =
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n"
    "{{ .System }}<|eot_id|>{{ end }}"
    "{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n"
    "{{ .Prompt }}<|eot_id|>{{ end }}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{{ .Response }}<|eot_id|>";
const char* const kChatML =
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n";
const char* const kMistral =
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }} [/INST]"
    "{{ .Response }}</s>";

// A system prompt the template writes when the conversation has none: the
// literal text of a chatml system turn (Qwen2.5's "You are Qwen, ...").
std::string default_system(const std::string& tmpl) {
  const std::string open = "<|im_start|>system\\n";
  size_t at = tmpl.find(open);
  while (at != std::string::npos) {
    const size_t from = at + open.size();
    const size_t to = tmpl.find("<|im_end|>", from);
    if (to == std::string::npos)
      break;
    const std::string text = tmpl.substr(from, to - from);
    if (!text.empty() && text.find_first_of("'\"{}+") == std::string::npos)
      return text;
    at = tmpl.find(open, to);
  }
  return "";
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

} // namespace

Modelfile make_modelfile(const ModelfileInput& in) {
  Modelfile m;
  const std::string& t = in.chat_template;
  const char* tmpl = nullptr;
  if (t.find("<|start_header_id|>") != std::string::npos) {
    m.family = "llama3";
    tmpl = kLlama3;
  } else if (t.find("<|im_start|>") != std::string::npos) {
    m.family = "chatml";
    tmpl = kChatML;
  } else if (t.find("[INST]") != std::string::npos) {
    m.family = "mistral";
    tmpl = kMistral;
  }
  m.system = default_system(t);
  m.text =
      "# Made by `orchard export ollama`. Use: ollama create NAME -f Modelfile\n";
  m.text += "FROM ./" + in.gguf_name + "\n";
  if (tmpl)
    m.text += std::string("TEMPLATE \"\"\"") + tmpl + "\"\"\"\n";
  else
    m.text +=
        "# No TEMPLATE: the chat template is not one Orchard translates "
        "(llama3, chatml, mistral);\n# Ollama falls back to the GGUF's own "
        "tokenizer.chat_template.\n";
  if (!m.system.empty())
    m.text += "SYSTEM \"\"\"" + m.system + "\"\"\"\n";
  for (const auto& s : in.end_of_turn)
    m.text += "PARAMETER stop " + quoted(s) + "\n";
  return m;
}

} // namespace orchard::gguf
