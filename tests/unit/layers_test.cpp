// The layers of ARCHITECTURE.md, checked on the sources: a file in src/<layer>
// includes only the layers below it (models never train, infer or serve;
// train and infer never each other; runs below both), and no two headers
// include each other, directly or through others.
#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace orchard {
namespace {

namespace fs = std::filesystem;

// Each layer and the layers it may include (itself always).
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> a = {
      {"core", {}},
      {"text", {"core"}},
      {"ops", {"core"}},
      {"models", {"core", "ops"}},
      {"data", {"core", "text"}},
      {"dist", {"core"}},
      {"runs", {"core", "text", "ops", "models"}},
      {"train", {"core", "text", "ops", "models", "data", "dist", "runs"}},
      {"infer", {"core", "text", "ops", "models", "data", "runs"}},
      {"stages",
       {"core",
        "text",
        "ops",
        "models",
        "data",
        "dist",
        "runs",
        "train",
        "infer"}},
      {"serve", {"core", "text", "models", "data", "runs", "infer"}},
      // Model files for other tools (GGUF, Ollama): not in ARCHITECTURE.md's
      // table yet; it reads models and runs, as `lora merge` does.
      {"export", {"core", "text", "ops", "models", "runs"}},
      {"cli",
       {"core",
        "text",
        "ops",
        "models",
        "data",
        "dist",
        "runs",
        "train",
        "infer",
        "stages",
        "serve",
        "export"}},
  };
  return a;
}

// Orchard's own includes of every file under src/, by path ("core/x.h").
std::map<std::string, std::vector<std::string>> includes() {
  std::map<std::string, std::vector<std::string>> out;
  const fs::path src = fs::path(ORCHARD_SOURCE_DIR) / "src";
  const std::regex line(R"(^\s*#\s*include\s+"([a-z_]+/[^"]+)\")");
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".mm")
      continue;
    const std::string rel = fs::relative(e.path(), src).generic_string();
    std::ifstream in(e.path());
    std::string text;
    auto& list = out[rel];
    while (std::getline(in, text)) {
      std::smatch m;
      if (std::regex_search(text, m, line))
        list.push_back(m[1]);
    }
  }
  return out;
}

std::string layer_of(const std::string& path) {
  return path.substr(0, path.find('/'));
}

TEST(Layers, EachLayerIncludesOnlyTheLayersBelowIt) {
  const auto all = includes();
  ASSERT_GT(all.size(), 100u) << "the sources were not found";
  for (const auto& [file, list] : all) {
    const std::string layer = layer_of(file);
    auto it = allowed().find(layer);
    ASSERT_NE(it, allowed().end())
        << "src/" << layer << " is not a layer in ARCHITECTURE.md's table";
    for (const auto& inc : list) {
      const std::string to = layer_of(inc);
      if (to == layer || to == "generated")
        continue;
      EXPECT_TRUE(it->second.count(to))
          << "src/" << file << " includes " << inc << ": " << layer
          << " may not include " << to;
    }
  }
}

TEST(Layers, NoHeadersIncludeEachOther) {
  const auto all = includes();
  // Header to header edges; a depth-first search finds any cycle.
  std::map<std::string, int> state; // 0 new, 1 on the path, 2 done
  std::vector<std::string> path;
  std::function<void(const std::string&)> visit = [&](const std::string& f) {
    state[f] = 1;
    path.push_back(f);
    auto it = all.find(f);
    if (it != all.end())
      for (const auto& inc : it->second) {
        if (inc.size() < 2 || inc.substr(inc.size() - 2) != ".h")
          continue;
        if (state[inc] == 1) {
          std::string cycle;
          for (const auto& p : path)
            cycle += p + " -> ";
          ADD_FAILURE() << "include cycle: " << cycle << inc;
        } else if (state[inc] == 0) {
          visit(inc);
        }
      }
    path.pop_back();
    state[f] = 2;
  };
  for (const auto& [file, list] : all)
    if (state[file] == 0)
      visit(file);
  // A .cpp pair that includes each other's header is a cycle too
  // (text/chat_template and text/model_template were one).
  for (const auto& [file, list] : all) {
    if (file.size() < 4 || file.substr(file.size() - 4) != ".cpp")
      continue;
    const std::string own = file.substr(0, file.size() - 4) + ".h";
    for (const auto& inc : list) {
      if (inc == own || inc.size() < 2 || inc.substr(inc.size() - 2) != ".h")
        continue;
      const std::string other = inc.substr(0, inc.size() - 2) + ".cpp";
      auto it = all.find(other);
      if (it == all.end())
        continue;
      for (const auto& back : it->second)
        EXPECT_NE(back, own)
            << file << " and " << other << " include each other's headers";
    }
  }
}

} // namespace
} // namespace orchard
