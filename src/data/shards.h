// Token shards in the llm.c / modded-nanogpt `.bin` format.
//
// Header: 256 little-endian int32. [0] magic 20240520, [1] version, [2] the
// number of tokens; the rest zero. Then the tokens: uint16 for version 1 (the
// format of llm.c's and modded-nanogpt's FineWeb shards), uint32 for version
// 2 (Orchard's extension for vocabularies over 65,536). Shards written by
// modded-nanogpt's scripts load unchanged.
#pragma once

#include "core/files.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace orchard::data {

constexpr int32_t kShardMagic = 20240520;
constexpr size_t kShardHeaderInts = 256;

// A read-only, memory-mapped shard. Tokens are widened to uint32 on access.
class Shard {
 public:
  static Shard open(const std::string& path);
  const std::string& path() const {
    return path_;
  }
  size_t size() const {
    return count_;
  }
  int version() const {
    return version_;
  }
  uint32_t operator[](size_t i) const {
    return version_ == 1 ? u16_[i] : u32_[i];
  }
  // Copies tokens [begin, begin + n) into out.
  void read(size_t begin, size_t n, uint32_t* out) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  size_t count_ = 0;
  int version_ = 1;
  const uint16_t* u16_ = nullptr;
  const uint32_t* u32_ = nullptr;
};

// Writes `tokens` as one shard (atomically); version 1 when every token
// fits in 16 bits and `vocab_size` <= 65,536, version 2 otherwise.
void write_shard(
    const std::string& path,
    const std::vector<uint32_t>& tokens,
    size_t vocab_size);

// Streams tokens into <dir>/<name>_<split>_NNNNNN.bin files of at most
// `shard_tokens` tokens each.
class ShardWriter {
 public:
  ShardWriter(
      std::string dir,
      std::string name,
      std::string split,
      size_t vocab_size,
      size_t shard_tokens);
  ~ShardWriter() noexcept(false);
  void append(const std::vector<uint32_t>& tokens);
  void finish(); // writes the last partial shard
  size_t tokens_written() const {
    return total_;
  }
  const std::vector<std::string>& files() const {
    return files_;
  }

 private:
  void flush();
  std::string dir_, name_, split_;
  size_t vocab_size_, shard_tokens_, total_ = 0;
  std::vector<uint32_t> buffer_;
  std::vector<std::string> files_;
  bool finished_ = false;
};

// The shards of one split in a folder, sorted: <dir>/*_<split>_*.bin.
std::vector<std::string> find_shards(
    const std::string& dir,
    const std::string& split);

} // namespace orchard::data
