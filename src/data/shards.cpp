#include "data/shards.h"

#include "core/error.h"
#include "core/files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace orchard::data {

Shard Shard::open(const std::string& path) {
  Shard s;
  s.path_ = path;
  s.map_ = MappedFile::open(path, "token shard");
  size_t size = s.map_->size();
  const size_t header = kShardHeaderInts * sizeof(int32_t);
  if (size < header)
    throw UserError(
        "token shard '" + path + "' is " + std::to_string(size) +
        " bytes, shorter than the 1024-byte header: truncated or not a .bin "
        "shard.");
  const char* base = s.map_->data();
  int32_t head[3];
  std::memcpy(head, base, sizeof head);
  if (head[0] != kShardMagic)
    throw UserError(
        "'" + path + "' is not a token shard: magic " +
        std::to_string(head[0]) + ", expected " + std::to_string(kShardMagic) +
        " (llm.c / modded-nanogpt .bin format).");
  if (head[1] != 1 && head[1] != 2)
    throw UserError(
        "token shard '" + path + "' has version " + std::to_string(head[1]) +
        "; Orchard reads version 1 (uint16 tokens) and 2 (uint32).");
  s.version_ = head[1];
  size_t width = s.version_ == 1 ? 2 : 4;
  if (head[2] < 0 || size - header != size_t(head[2]) * width)
    throw UserError(
        "token shard '" + path + "' says it holds " + std::to_string(head[2]) +
        " tokens but has " + std::to_string(size - header) +
        " bytes of tokens (" + std::to_string(width) +
        " each): truncated or damaged; re-create it.");
  s.count_ = size_t(head[2]);
  const char* data = base + header;
  if (s.version_ == 1)
    s.u16_ = reinterpret_cast<const uint16_t*>(data);
  else
    s.u32_ = reinterpret_cast<const uint32_t*>(data);
  return s;
}

void Shard::read(size_t begin, size_t n, uint32_t* out) const {
  if (begin + n > count_)
    throw std::out_of_range("[Shard::read] past the end of " + path_);
  if (version_ == 1)
    for (size_t i = 0; i < n; ++i)
      out[i] = u16_[begin + i];
  else
    std::memcpy(out, u32_ + begin, n * sizeof(uint32_t));
}

void write_shard(
    const std::string& path,
    const std::vector<uint32_t>& tokens,
    size_t vocab_size) {
  if (tokens.size() > size_t(INT32_MAX))
    throw std::invalid_argument("[write_shard] more tokens than a shard holds");
  bool wide = vocab_size > 65536 ||
      std::any_of(tokens.begin(), tokens.end(), [](uint32_t t) {
                return t > 0xffff;
              });
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = wide ? 2 : 1;
  header[2] = int32_t(tokens.size());
  atomic_write(path, [&](int fd) {
    write_all(fd, header, sizeof header, path);
    if (wide) {
      write_all(fd, tokens.data(), tokens.size() * 4, path);
    } else {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      write_all(fd, narrow.data(), narrow.size() * 2, path);
    }
  });
}

ShardWriter::ShardWriter(
    std::string dir,
    std::string name,
    std::string split,
    size_t vocab_size,
    size_t shard_tokens)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      split_(std::move(split)),
      vocab_size_(vocab_size),
      shard_tokens_(shard_tokens) {
  if (shard_tokens_ == 0)
    throw UserError("--shard-tokens must be at least 1.");
  std::filesystem::create_directories(dir_);
}

ShardWriter::~ShardWriter() noexcept(false) {
  if (!finished_ && !std::uncaught_exceptions())
    finish();
}

void ShardWriter::append(const std::vector<uint32_t>& tokens) {
  for (uint32_t t : tokens) {
    buffer_.push_back(t);
    if (buffer_.size() == shard_tokens_)
      flush();
  }
}

void ShardWriter::flush() {
  if (buffer_.empty())
    return;
  char num[16];
  std::snprintf(num, sizeof num, "%06zu", files_.size());
  std::string path = dir_ + "/" + name_ + "_" + split_ + "_" + num + ".bin";
  write_shard(path, buffer_, vocab_size_);
  total_ += buffer_.size();
  files_.push_back(path);
  buffer_.clear();
}

void ShardWriter::finish() {
  flush();
  finished_ = true;
}

std::vector<std::string> find_shards(
    const std::string& dir,
    const std::string& split) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  if (!fs::is_directory(dir))
    return out;
  std::string tag = "_" + split + "_";
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (e.path().extension() == ".bin" && name.find(tag) != std::string::npos)
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace orchard::data
