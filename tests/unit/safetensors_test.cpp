// safetensors: round trips, files made by the reference Python library
// (tests/fixtures/safetensors, made by make_fixtures.py on the CUDA machine),
// a file Orchard wrote that the Python library verified, and every kind of
// damage a file can have.
#include "core/safetensors.h"
#include "core/error.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace orchard {
namespace {

namespace st = safetensors;
using test::read_text;
using test::TempDir;

const std::string kFixtures = std::string(ORCHARD_FIXTURES) + "/safetensors";

// The tensors of the fixture files; make_fixtures.py builds the same ones.
std::vector<std::pair<std::string, torch::Tensor>> fixture_tensors() {
  auto halves = torch::arange(6, torch::kFloat64) * 0.25 - 0.5;
  return {
      {"f64", halves.reshape({2, 3})},
      {"f32", halves.to(torch::kFloat32).reshape({2, 3})},
      {"f16", halves.to(torch::kFloat16).reshape({3, 2})},
      {"bf16", halves.to(torch::kBFloat16)},
      {"i64",
       torch::tensor(
           {-(int64_t(1) << 40), int64_t(0), (int64_t(1) << 40) + 7},
           torch::kInt64)},
      {"i32",
       torch::tensor({-7, 0, 7, 2147483647}, torch::kInt32).reshape({2, 2})},
      {"i16", torch::tensor({-32768, 32767}, torch::kInt16)},
      {"i8", torch::tensor({-128, 0, 127}, torch::kInt8)},
      {"u8", torch::tensor({0, 128, 255}, torch::kInt32).to(torch::kUInt8)},
      {"bool", torch::tensor({1, 0, 0, 1}, torch::kInt32).to(torch::kBool)},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::zeros({0, 4})},
  };
}

void expect_same(
    const torch::Tensor& a,
    const torch::Tensor& b,
    const std::string& name) {
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << name;
  EXPECT_EQ(a.sizes(), b.sizes()) << name;
  EXPECT_TRUE(torch::equal(a, b)) << name;
}

// The UserError a file gets, or "" when it opens.
std::string open_error(const std::string& path) {
  try {
    st::File f = st::File::open(path);
    for (const auto& t : f.tensors())
      f.get(t.name);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A file with a hand-written header and `data_bytes` zero bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  auto tensors = fixture_tensors();
  st::save(dir.file("a.safetensors"), tensors, {{"k", "v"}});
  st::File f = st::File::open(dir.file("a.safetensors"));
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors)
    expect_same(f.get(name), t, name);
  EXPECT_EQ(f.info("bf16").dtype, "BF16");
  EXPECT_EQ(f.info("scalar").shape.size(), 0u);
}

TEST(Safetensors, WritesNonContiguousAndDeviceTensors) {
  TempDir dir;
  auto t = torch::arange(12, torch::kFloat32).reshape({3, 4}).t(); // (4, 3)
  st::save(dir.file("t.safetensors"), {{"t", t}});
  expect_same(st::load(dir.file("t.safetensors")).at("t"), t, "t");
}

TEST(Safetensors, TensorsViewTheMappingCopyOnWrite) {
  TempDir dir;
  st::save(dir.file("w.safetensors"), {{"w", torch::ones({4})}});
  std::string before = read_text(dir.file("w.safetensors"));
  {
    st::File f = st::File::open(dir.file("w.safetensors"));
    torch::Tensor w = f.get("w");
    w.mul_(5); // must not reach the file
    EXPECT_FLOAT_EQ(w[0].item<float>(), 5.0f);
  }
  EXPECT_EQ(read_text(dir.file("w.safetensors")), before);
  // A tensor outlives the File object that made it.
  torch::Tensor kept = st::File::open(dir.file("w.safetensors")).get("w");
  EXPECT_FLOAT_EQ(kept.sum().item<float>(), 4.0f);
}

TEST(Safetensors, HeaderIsPaddedTo8BytesLikeTheReference) {
  TempDir dir;
  st::save(dir.file("p.safetensors"), {{"x", torch::ones({3})}});
  std::string bytes = read_text(dir.file("p.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
}

TEST(Safetensors, ReadsUnalignedData) {
  // A 7-byte-longer header puts the F32 data at an odd address: copied.
  TempDir dir;
  std::string header =
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header += std::string(3, ' '); // 55 + 3 = 58 bytes, not a multiple of 8
  std::string file = raw_file(header, 0);
  float vals[2] = {1.5f, -2.0f};
  file.append(reinterpret_cast<const char*>(vals), 8);
  std::string path = dir.write("u.safetensors", file);
  auto x = st::File::open(path).get("x");
  EXPECT_FLOAT_EQ(x[0].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(x[1].item<float>(), -2.0f);
}

TEST(Safetensors, ReadsFilesWrittenByThePythonLibrary) {
  st::File f = st::File::open(kFixtures + "/python_all_dtypes.safetensors");
  EXPECT_EQ(f.metadata().at("source"), "python safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  auto expected = fixture_tensors();
  EXPECT_EQ(f.tensors().size(), expected.size());
  for (const auto& [name, t] : expected)
    expect_same(f.get(name), t, name);
}

TEST(Safetensors, ReadsAShardedPythonModel) {
  st::Reader r = st::Reader::open(kFixtures + "/python_sharded");
  EXPECT_EQ(r.num_files(), 2u);
  EXPECT_EQ(
      r.names(),
      (std::vector<std::string>{
          "model.embed_tokens.weight",
          "model.layers.0.mlp.weight",
          "model.layers.1.mlp.weight"}));
  expect_same(
      r.get("model.layers.1.mlp.weight"),
      torch::arange(6, torch::kFloat32).reshape({2, 3}) + 100,
      "layer 1");
  expect_same(
      r.get("model.embed_tokens.weight"),
      torch::arange(8, torch::kFloat32).reshape({4, 2}).to(torch::kBFloat16),
      "embed");
  // The index itself works as the path too.
  EXPECT_EQ(
      st::Reader::open(
          kFixtures + "/python_sharded/model.safetensors.index.json")
          .names()
          .size(),
      3u);
}

// Orchard's writer is deterministic; the committed file is one the Python
// library loaded and checked (make_fixtures.py --verify). If this fails the
// writer changed: check the new output with Python before updating it.
TEST(Safetensors, WriterMatchesTheFileThePythonLibraryVerified) {
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"source", "orchard"}};
  if (const char* out = std::getenv("ORCHARD_WRITE_GOLDEN"))
    st::save(out, fixture_tensors(), meta);
  TempDir dir;
  st::save(dir.file("o.safetensors"), fixture_tensors(), meta);
  std::string golden = read_text(kFixtures + "/orchard_written.safetensors");
  ASSERT_FALSE(golden.empty()) << "missing fixture";
  EXPECT_TRUE(read_text(dir.file("o.safetensors")) == golden);
}

// save(..., with_checksum) records the data's CRC-32C; verify_checksum()
// finds any data byte changed in place, which the format alone cannot
// (the header still parses, every offset still fits).
TEST(Safetensors, ARecordedChecksumFindsChangedDataBytes) {
  TempDir dir;
  const auto a = torch::randn({4, 8}), b = torch::arange(10);
  safetensors::save(
      dir.file("c.safetensors"),
      {{"a", a}, {"b", b}},
      {{"format", "pt"}},
      true);
  auto f = safetensors::File::open(dir.file("c.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().count(safetensors::kDataChecksumKey), 1u);
  EXPECT_NO_THROW(f.verify_checksum());
  EXPECT_TRUE(torch::equal(f.get("a"), a));
  // Every data byte counts, the first and the last.
  const std::string good = test::read_text(dir.file("c.safetensors"));
  const size_t data_begin = good.size() - size_t(4 * 8 * 4 + 10 * 8);
  for (size_t at : {data_begin, good.size() - 1}) {
    std::string bad = good;
    bad[at] ^= 0x01;
    const std::string path = dir.write("bad.safetensors", bad);
    auto g = safetensors::File::open(path);
    try {
      g.verify_checksum();
      ADD_FAILURE() << "a changed byte at " << at << " went unnoticed";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    }
  }
  // A file without a recorded checksum (other writers) is not refused.
  safetensors::save(dir.file("plain.safetensors"), {{"a", a}});
  EXPECT_NO_THROW(
      safetensors::File::open(dir.file("plain.safetensors")).verify_checksum());
}

TEST(Safetensors, EveryCorruptionIsAClearError) {
  TempDir dir;
  struct Case {
    std::string name, content, expect;
  };
  std::string huge(8, '\xff');
  std::vector<Case> cases = {
      {"empty", "", "too short"},
      {"short", "abc", "too short"},
      {"huge_header", huge + "{}", "over the 100000000-byte limit"},
      {"header_past_end", raw_file("{}", 0).substr(0, 9), "truncated"},
      {"not_json", raw_file("{not json", 0), "not valid JSON"},
      {"not_object", raw_file("[1,2]", 0), "not a JSON object"},
      {"unknown_dtype",
       raw_file(
           R"({"x":{"dtype":"F8_E9","shape":[1],"data_offsets":[0,1]}})", 1),
       "dtype 'F8_E9', which Orchard cannot read"},
      {"size_mismatch",
       raw_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "needs 12 bytes"},
      {"past_end",
       raw_file(
           R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
       "truncated"},
      {"overlap",
       raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12),
       "overlap"},
      {"backwards",
       raw_file(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
       "ends before it begins"},
      {"no_offsets",
       raw_file(R"({"x":{"dtype":"F32","shape":[1]}})", 4),
       "data_offsets"},
      {"negative_offset",
       raw_file(
           R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
       "data_offsets"},
      {"negative_shape",
       raw_file(
           R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "shape"},
      {"overflow_shape",
       raw_file(
           R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
           8),
       "impossible"},
      {"no_dtype",
       raw_file(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", 4),
       "no dtype"},
      {"bad_metadata",
       raw_file(R"({"__metadata__":{"a":1}})", 0),
       "not a string"},
      {"entry_not_object", raw_file(R"({"x":3})", 0), "not a JSON object"},
  };
  for (const auto& c : cases) {
    std::string path = dir.write(c.name + ".safetensors", c.content);
    std::string e = open_error(path);
    EXPECT_NE(e.find(path), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.name << ": " << e;
  }
  EXPECT_NE(
      open_error(dir.file("missing.safetensors")).find("cannot open"),
      std::string::npos);
  EXPECT_NE(
      open_error(dir.path().string()).find("not a regular file"),
      std::string::npos);
}

// Every prefix of a valid file, and every single-byte change to its header,
// either loads or is a UserError: never a crash or an out-of-bounds read
// (run under ASan/valgrind to see the latter).
TEST(Safetensors, TruncationsAndBitFlipsNeverCrash) {
  TempDir dir;
  st::save(dir.file("ok.safetensors"), fixture_tensors(), {{"m", "x"}});
  std::string good = read_text(dir.file("ok.safetensors"));
  for (size_t len = 0; len < good.size(); ++len) {
    std::string path = dir.write("cut.safetensors", good.substr(0, len));
    EXPECT_NE(open_error(path), "") << "a " << len << "-byte prefix loaded";
  }
  std::mt19937 rng(7);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(good[i]);
  for (int trial = 0; trial < 400; ++trial) {
    std::string bad = good;
    size_t pos = rng() % (8 + header_len);
    bad[pos] = static_cast<char>(rng() % 256);
    std::string path = dir.write("flip.safetensors", bad);
    open_error(path); // must return, whatever it says
  }
}

TEST(Safetensors, WriterRefusesBadNamesAndDtypes) {
  TempDir dir;
  EXPECT_THROW(
      st::save(
          dir.file("d.safetensors"),
          {{"a", torch::ones({1})}, {"a", torch::ones({1})}}),
      std::invalid_argument);
  EXPECT_THROW(
      st::save(dir.file("m.safetensors"), {{"__metadata__", torch::ones({1})}}),
      std::invalid_argument);
  EXPECT_THROW(
      st::save(
          dir.file("c.safetensors"),
          {{"c", torch::ones({2}, torch::kComplexFloat)}}),
      UserError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("c.safetensors")));
}

TEST(Safetensors, ShardIndexErrors) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("m"));
  st::save(dir.file("m/a.safetensors"), {{"x", torch::ones({2})}});
  auto index = [&](const std::string& body) {
    dir.write("m/model.safetensors.index.json", body);
    try {
      st::Reader::open(dir.file("m"));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(index(R"({"weight_map":{"x":"a.safetensors"}})"), "");
  EXPECT_NE(
      index(R"({"weight_map":{"x":"b.safetensors"}})").find("is missing"),
      std::string::npos);
  EXPECT_NE(
      index(R"({"weight_map":{"y":"a.safetensors"}})").find("no such tensor"),
      std::string::npos);
  EXPECT_NE(
      index(R"({"weight_map":{"x":"../a.safetensors"}})")
          .find("outside its folder"),
      std::string::npos);
  EXPECT_NE(index("{oops").find("not valid JSON"), std::string::npos);
  EXPECT_NE(index(R"({"metadata":{}})").find("weight_map"), std::string::npos);
  EXPECT_NE(
      index(R"({"weight_map":{}})").find("lists no tensors"),
      std::string::npos);
}

TEST(Safetensors, FolderWithSeveralFilesAndNoIndexIsAnError) {
  TempDir dir;
  st::save(dir.file("a.safetensors"), {{"x", torch::ones({1})}});
  EXPECT_EQ(st::Reader::open(dir.path().string()).names().size(), 1u);
  st::save(dir.file("b.safetensors"), {{"y", torch::ones({1})}});
  EXPECT_THROW(st::Reader::open(dir.path().string()), UserError);
  EXPECT_THROW(st::Reader::open(dir.file("nothing-here")), UserError);
}

} // namespace
} // namespace orchard
