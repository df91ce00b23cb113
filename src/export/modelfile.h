// An Ollama Modelfile for an exported GGUF: FROM the file, the chat
// template in Ollama's Go-template syntax for the families Orchard knows
// (llama3, chatml, mistral; translated, since Ollama does not run Jinja),
// a stop parameter for every end-of-turn token (without one a chat never
// ends), and the template's default system prompt where it has one.
#pragma once

#include <string>
#include <vector>

namespace orchard::gguf {

struct ModelfileInput {
  std::string gguf_name;     // the file, relative to the Modelfile
  std::string chat_template; // the model's Jinja template ("" for none)
  std::vector<std::string> end_of_turn;
};

struct Modelfile {
  std::string text;
  std::string family; // "llama3", "chatml", "mistral", "" (no TEMPLATE)
  std::string system; // the default system prompt found, or ""
};

Modelfile make_modelfile(const ModelfileInput& in);

} // namespace orchard::gguf
