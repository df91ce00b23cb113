// Config parsing: every source, precedence, and every error a user can cause.
#include "core/config.h"
#include "core/error.h"
#include "test_util.h"
#include "train/pretrain_config.h"

#include <gtest/gtest.h>

namespace orchard {
namespace {

using config::Sources;
using test::env_of;
using test::TempDir;

Sources sources(
    std::vector<std::string> overrides = {},
    std::map<std::string, std::string> env = {}) {
  Sources s;
  s.overrides = std::move(overrides);
  s.env = env_of(std::move(env));
  return s;
}

// The UserError message resolve() throws, or "" when it succeeds.
std::string error_of(const Sources& s) {
  PretrainConfig c;
  try {
    config::resolve(pretrain_schema(), &c, s);
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    return e.what();
  }
  return "";
}

PretrainConfig resolved(const Sources& s, config::Origins* origins = nullptr) {
  PretrainConfig c;
  auto o = config::resolve(pretrain_schema(), &c, s);
  if (origins)
    *origins = o;
  return c;
}

TEST(Config, DefaultsWhenNoSource) {
  PretrainConfig c = resolved(sources());
  EXPECT_EQ(c.depth, 4); // the quick run
  EXPECT_EQ(c.optimizer, "muon");
  EXPECT_FALSE(c.lr.has_value());                // auto: by optimizer
  EXPECT_FALSE(c.device_batch_size.has_value()); // auto
  EXPECT_EQ(c.dtype, "auto");
  EXPECT_TRUE(c.data_paths.empty());
}

TEST(Config, OverridesOfEveryType) {
  PretrainConfig c = resolved(sources(
      {"depth=8",
       "arch.n_embd=512",
       "lr=3e-4",
       "ema=True",
       "data_paths=[a.txt, 'b c.txt',d]",
       "device_batch_size=16",
       "dtype=bfloat16",
       "run=my-run",
       "total_batch_size=2e5"}));
  EXPECT_EQ(c.depth, 8);
  EXPECT_EQ(c.arch.n_embd, 512);
  EXPECT_DOUBLE_EQ(c.lr.value_or(0), 3e-4);
  EXPECT_TRUE(c.ema);
  EXPECT_EQ(c.data_paths, (std::vector<std::string>{"a.txt", "b c.txt", "d"}));
  EXPECT_EQ(c.device_batch_size, 16);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.run, "my-run");
  EXPECT_EQ(c.total_batch_size, 200000);
}

TEST(Config, BooleanSpellings) {
  for (std::string t : {"true", "True", "TRUE", "1", "yes", "on"})
    EXPECT_TRUE(resolved(sources({"ema=" + t})).ema) << t;
  for (std::string f : {"false", "False", "0", "no", "off"})
    EXPECT_FALSE(resolved(sources({"ema=true", "ema=" + f})).ema) << f;
}

TEST(Config, AutoResetsAnOptionalInteger) {
  PretrainConfig c =
      resolved(sources({"device_batch_size=4", "device_batch_size=auto"}));
  EXPECT_FALSE(c.device_batch_size.has_value());
}

TEST(Config, HuggingFaceAliasSetsTheSameField) {
  PretrainConfig c = resolved(sources({"arch.hidden_size=384"}));
  EXPECT_EQ(c.arch.n_embd, 384);
}

TEST(Config, UnknownKeySuggestsTheNearest) {
  std::string e = error_of(sources({"arch.hiden_size=512"}));
  EXPECT_EQ(
      e.substr(0, e.find('\n')),
      "unknown key 'arch.hiden_size' (command line 'arch.hiden_size=512'); "
      "did you mean 'arch.hidden_size'?");
  EXPECT_NE(
      error_of(sources({"detph=3"})).find("did you mean 'depth'?"),
      std::string::npos);
  // The last segment alone finds its section.
  EXPECT_NE(
      error_of(sources({"n_embd=3"})).find("did you mean 'arch.n_embd'?"),
      std::string::npos);
  // Nothing close: no suggestion, but a pointer to the list.
  std::string far = error_of(sources({"completely_unrelated=1"}));
  EXPECT_EQ(far.find("did you mean"), std::string::npos);
  EXPECT_NE(far.find("orchard config --help"), std::string::npos);
}

TEST(Config, BadValuesNameKeyValueAndType) {
  std::string e = error_of(sources({"depth=four"}));
  EXPECT_NE(e.find("'depth'"), std::string::npos) << e;
  EXPECT_NE(e.find("'four'"), std::string::npos) << e;
  EXPECT_NE(e.find("expected an integer"), std::string::npos) << e;

  e = error_of(sources({"lr=fast"}));
  EXPECT_NE(e.find("expected a number"), std::string::npos) << e;
  e = error_of(sources({"ema=maybe"}));
  EXPECT_NE(e.find("expected a boolean"), std::string::npos) << e;
  e = error_of(sources({"dtype=fp8"}));
  EXPECT_NE(e.find("one of auto|float32|bfloat16|float16"), std::string::npos)
      << e;
  e = error_of(sources({"depth=0"}));
  EXPECT_NE(e.find("a number >= 1"), std::string::npos) << e;
  e = error_of(sources({"depth=2.5"}));
  EXPECT_NE(e.find("expected an integer"), std::string::npos) << e;
  e = error_of(sources({"depth"}));
  EXPECT_NE(e.find("not a key=value override"), std::string::npos) << e;
  e = error_of(sources({"=3"}));
  EXPECT_NE(e.find("not a key=value override"), std::string::npos) << e;
}

TEST(Config, EnvironmentAliases) {
  config::Origins origins;
  PretrainConfig c = resolved(
      sources({}, {{"DEPTH", "10"}, {"TOTAL_BATCH_SIZE", "4096"}}), &origins);
  EXPECT_EQ(c.depth, 10);
  EXPECT_EQ(c.total_batch_size, 4096);
  EXPECT_EQ(origins["depth"], "environment DEPTH");
  std::string e = error_of(sources({}, {{"DEVICE_BATCH_SIZE", "lots"}}));
  EXPECT_NE(e.find("environment DEVICE_BATCH_SIZE"), std::string::npos) << e;
}

TEST(Config, PrecedencePresetFileEnvironmentCommandLine) {
  TempDir dir;
  // quick sets depth 4, max_seq_len 256 and num_iterations 100.
  std::string file = dir.write(
      "run.yaml",
      "depth: 5\n"
      "max_seq_len: 128\n"
      "arch:\n"
      "  n_head: 2\n");
  Sources s = sources({"depth=7"}, {{"DEPTH", "6"}, {"EVAL_TOKENS", "999"}});
  s.preset = "quick";
  s.config_file = file;
  config::Origins origins;
  PretrainConfig c = resolved(s, &origins);
  EXPECT_EQ(c.num_iterations, 100); // preset only
  EXPECT_EQ(c.max_seq_len, 128);    // file over preset
  EXPECT_EQ(c.eval_tokens, 999);    // environment over preset
  EXPECT_EQ(c.depth, 7);            // command line over all
  EXPECT_EQ(c.arch.n_head, 2);      // nested map in the file
  EXPECT_EQ(origins["num_iterations"], "preset quick (configs/quick.yaml:10)");
  EXPECT_EQ(origins["max_seq_len"], file + ":2");
  EXPECT_EQ(origins["arch.n_head"], file + ":4");
  EXPECT_EQ(origins["depth"], "command line");
}

TEST(Config, FileErrorsNameFileAndLine) {
  TempDir dir;
  std::string file = dir.write("bad.yaml", "depth: 4\nmax_seqlen: 128\n");
  Sources s = sources();
  s.config_file = file;
  std::string e = error_of(s);
  EXPECT_NE(
      e.find("unknown key 'max_seqlen' (" + file + ":2)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("did you mean 'max_seq_len'?"), std::string::npos) << e;

  s.config_file = dir.write("syntax.yaml", "depth: 4\narch: [unclosed\n");
  e = error_of(s);
  EXPECT_NE(e.find("syntax.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;

  s.config_file = dir.write("value.yaml", "seed: 1\nlr: quick\n");
  e = error_of(s);
  EXPECT_NE(e.find("value.yaml:2"), std::string::npos) << e;

  s.config_file = dir.write("list.yaml", "- depth\n- 4\n");
  EXPECT_NE(error_of(s).find("expected a map"), std::string::npos);

  s.config_file = dir.write("nested.yaml", "depth:\n  n_layer: 3\n");
  EXPECT_NE(error_of(s).find("found a nested map"), std::string::npos);

  s.config_file = dir.write("seq.yaml", "depth: [1, 2]\n");
  EXPECT_NE(error_of(s).find("'depth'"), std::string::npos);

  s.config_file = dir.file("missing.yaml");
  EXPECT_NE(error_of(s).find("not found"), std::string::npos);
}

TEST(Config, YamlListsAndDottedKeysInFiles) {
  TempDir dir;
  Sources s = sources();
  s.config_file = dir.write(
      "lists.yaml", "data_paths:\n  - one.txt\n  - two.txt\narch.n_layer: 3\n");
  PretrainConfig c = resolved(s);
  EXPECT_EQ(c.data_paths, (std::vector<std::string>{"one.txt", "two.txt"}));
  EXPECT_EQ(c.arch.n_layer, 3);
}

TEST(Config, UnknownPresetListsThePresets) {
  Sources s = sources();
  s.preset = "quik";
  std::string e = error_of(s);
  EXPECT_NE(e.find("unknown preset 'quik'"), std::string::npos) << e;
  EXPECT_NE(e.find("quick"), std::string::npos) << e;
}

TEST(Config, YamlOutputReadsBackToTheSameConfig) {
  PretrainConfig a = resolved(sources(
      {"depth=9",
       "arch.n_kv_head=2",
       "data_paths=[x.txt, 'with space.txt', '123']",
       "run=\"quoted: name\"",
       "lr=0.0003",
       "ema=true",
       "weight_decay=1"}));
  std::string yaml = config::to_yaml(pretrain_schema(), &a);
  TempDir dir;
  Sources s = sources();
  s.config_file = dir.write("round.yaml", yaml);
  PretrainConfig b = resolved(s);
  EXPECT_EQ(config::to_yaml(pretrain_schema(), &b), yaml);
  EXPECT_EQ(b.data_paths, a.data_paths);
  EXPECT_EQ(b.run, "quoted: name");
  EXPECT_DOUBLE_EQ(b.weight_decay, 1.0);
  EXPECT_NE(yaml.find("arch:\n  n_layer: auto\n"), std::string::npos) << yaml;
}

TEST(Config, WriteYamlIsAtomicAndComplete) {
  TempDir dir;
  PretrainConfig c;
  config::write_yaml(dir.file("config.yaml"), pretrain_schema(), &c, {});
  EXPECT_EQ(
      test::read_text(dir.file("config.yaml")),
      config::to_yaml(pretrain_schema(), &c));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename(), "config.yaml"); // no temporary left
}

TEST(Config, HelpTableListsEveryOptionWithDefault) {
  PretrainConfig c;
  std::string help = config::help_table(pretrain_schema(), &c);
  for (const auto& o : pretrain_schema().options())
    EXPECT_NE(help.find(o.key + "="), std::string::npos) << o.key;
  EXPECT_NE(help.find("depth=4"), std::string::npos);
  EXPECT_NE(help.find("(env DEPTH)"), std::string::npos);
}

TEST(Config, EditDistance) {
  EXPECT_EQ(config::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(config::edit_distance("", "abc"), 3u);
  EXPECT_EQ(config::edit_distance("same", "same"), 0u);
}

} // namespace
} // namespace orchard
