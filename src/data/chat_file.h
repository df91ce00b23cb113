// Orchard's tokenized chat format (.chat): conversations as token ids plus
// a loss mask, written by `orchard data chat`, read (mapped) by the chat
// batcher. Little-endian:
//
//   offset  size           field
//   0       8              magic "ORCHCHAT"
//   8       4              version (1)
//   12      4              reserved (0)
//   16      8              N, the number of conversations
//   24      8              T, the total number of tokens
//   32      8 * (N + 1)    offsets: conversation i is tokens [off[i], off[i+1])
//   ...     4 * T          token ids (uint32)
//   ...     1 * T          mask (uint8: 1 = learn to produce this token)
#pragma once

#include "core/files.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace orchard::data {

struct Conversation {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
};

void write_chat_file(
    const std::string& path,
    const std::vector<Conversation>& convs);

class ChatFile {
 public:
  static ChatFile open(const std::string& path);
  size_t size() const {
    return count_;
  }
  size_t total_tokens() const {
    return total_;
  }
  size_t length(size_t i) const {
    return offsets_[i + 1] - offsets_[i];
  }
  const uint32_t* ids(size_t i) const {
    return ids_ + offsets_[i];
  }
  const uint8_t* mask(size_t i) const {
    return mask_ + offsets_[i];
  }
  const std::string& path() const {
    return path_;
  }

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  size_t count_ = 0, total_ = 0;
  const uint64_t* offsets_ = nullptr;
  const uint32_t* ids_ = nullptr;
  const uint8_t* mask_ = nullptr;
};

} // namespace orchard::data
