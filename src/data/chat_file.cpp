#include "data/chat_file.h"

#include "core/error.h"
#include "core/files.h"

#include <cstring>

namespace orchard::data {
namespace {
constexpr char kMagic[8] = {'O', 'R', 'C', 'H', 'C', 'H', 'A', 'T'};
constexpr size_t kHeader = 32;
} // namespace

void write_chat_file(
    const std::string& path,
    const std::vector<Conversation>& convs) {
  uint64_t n = convs.size(), total = 0;
  std::vector<uint64_t> offsets = {0};
  for (const auto& c : convs) {
    if (c.ids.size() != c.mask.size())
      throw std::invalid_argument(
          "[write_chat_file] ids and mask differ in length");
    total += c.ids.size();
    offsets.push_back(total);
  }
  atomic_write(path, [&](int fd) {
    uint32_t version = 1, reserved = 0;
    write_all(fd, kMagic, 8, path);
    write_all(fd, &version, 4, path);
    write_all(fd, &reserved, 4, path);
    write_all(fd, &n, 8, path);
    write_all(fd, &total, 8, path);
    write_all(fd, offsets.data(), offsets.size() * 8, path);
    for (const auto& c : convs)
      write_all(fd, c.ids.data(), c.ids.size() * 4, path);
    for (const auto& c : convs)
      write_all(fd, c.mask.data(), c.mask.size(), path);
  });
}

ChatFile ChatFile::open(const std::string& path) {
  ChatFile f;
  f.path_ = path;
  auto bad = [&](const std::string& what) {
    return UserError(
        "chat data file '" + path + "': " + what +
        "; re-create it with `orchard data chat`.");
  };
  f.map_ = MappedFile::open(path, "chat data file");
  size_t size = f.map_->size();
  if (size < kHeader)
    throw bad("too short for the header");
  const char* p = f.map_->data();
  if (std::memcmp(p, kMagic, 8) != 0)
    throw bad("not an Orchard chat file (magic)");
  uint32_t version;
  uint64_t n, total;
  std::memcpy(&version, p + 8, 4);
  std::memcpy(&n, p + 16, 8);
  std::memcpy(&total, p + 24, 8);
  if (version != 1)
    throw bad("version " + std::to_string(version) + " (this Orchard reads 1)");
  // Sizes checked in a way that cannot overflow.
  if (n > size / 8 || total > size / 5)
    throw bad("the header's counts are larger than the file");
  if (size != kHeader + 8 * (n + 1) + 5 * total)
    throw bad("the size does not match the header (truncated?)");
  f.count_ = n;
  f.total_ = total;
  f.offsets_ = reinterpret_cast<const uint64_t*>(p + kHeader);
  f.ids_ = reinterpret_cast<const uint32_t*>(p + kHeader + 8 * (n + 1));
  f.mask_ =
      reinterpret_cast<const uint8_t*>(p + kHeader + 8 * (n + 1) + 4 * total);
  if (f.offsets_[0] != 0 || f.offsets_[n] != total)
    throw bad("the offsets do not span the tokens");
  for (size_t i = 0; i < n; ++i)
    if (f.offsets_[i + 1] < f.offsets_[i])
      throw bad(
          "the offsets go backwards at conversation " + std::to_string(i));
  return f;
}

} // namespace orchard::data
