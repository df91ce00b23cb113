#include "export/gguf_file.h"

#include "core/error.h"
#include "core/files.h"

#include <algorithm>
#include <cstring>

namespace orchard::gguf {

namespace {

constexpr uint32_t kVersion = 3;

// gguf_type's numbers.
enum ValueType : uint32_t {
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
};

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

int64_t padded(int64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

} // namespace

void Metadata::key(const std::string& k, uint32_t type) {
  if (has(k))
    throw std::logic_error("[gguf] metadata key added twice: " + k);
  keys_.push_back(k);
  put_string(bytes_, k);
  put<uint32_t>(bytes_, type);
}
bool Metadata::has(const std::string& k) const {
  return std::find(keys_.begin(), keys_.end(), k) != keys_.end();
}
void Metadata::add_u32(const std::string& k, uint32_t v) {
  key(k, kU32);
  put(bytes_, v);
}
void Metadata::add_i32(const std::string& k, int32_t v) {
  key(k, kI32);
  put(bytes_, v);
}
void Metadata::add_f32(const std::string& k, float v) {
  key(k, kF32);
  put(bytes_, v);
}
void Metadata::add_bool(const std::string& k, bool v) {
  key(k, kBool);
  put<uint8_t>(bytes_, v ? 1 : 0);
}
void Metadata::add_string(const std::string& k, const std::string& v) {
  key(k, kString);
  put_string(bytes_, v);
}
void Metadata::add_strings(
    const std::string& k,
    const std::vector<std::string>& v) {
  key(k, kArray);
  put<uint32_t>(bytes_, kString);
  put<uint64_t>(bytes_, v.size());
  for (const auto& s : v)
    put_string(bytes_, s);
}
void Metadata::add_f32s(const std::string& k, const std::vector<float>& v) {
  key(k, kArray);
  put<uint32_t>(bytes_, kF32);
  put<uint64_t>(bytes_, v.size());
  for (float x : v)
    put(bytes_, x);
}
void Metadata::add_i32s(const std::string& k, const std::vector<int32_t>& v) {
  key(k, kArray);
  put<uint32_t>(bytes_, kI32);
  put<uint64_t>(bytes_, v.size());
  for (int32_t x : v)
    put(bytes_, x);
}

int64_t write_file(
    const std::string& path,
    const Metadata& meta,
    const std::vector<TensorEntry>& tensors,
    const std::function<void(size_t, const TensorEntry&, int64_t)>& progress) {
  // The header, with every tensor's offset laid out before any is encoded.
  std::string header = "GGUF";
  put<uint32_t>(header, kVersion);
  put<uint64_t>(header, tensors.size());
  put<uint64_t>(header, meta.count());
  header += meta.bytes();
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    int64_t values = 1;
    for (int64_t d : t.shape)
      values *= d;
    const int64_t row = t.shape.empty() ? 1 : t.shape.back();
    sizes.push_back(encoded_bytes(t.type, values, row));
    put_string(header, t.name);
    put<uint32_t>(header, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it)
      put<uint64_t>(header, static_cast<uint64_t>(*it));
    put<uint32_t>(header, static_cast<uint32_t>(t.type));
    put<uint64_t>(header, static_cast<uint64_t>(offset));
    offset = padded(offset + sizes.back());
  }
  header.resize(
      static_cast<size_t>(padded(static_cast<int64_t>(header.size()))), '\0');
  const int64_t total = static_cast<int64_t>(header.size()) + offset;

  atomic_write(path, [&](int fd) {
    write_all(fd, header.data(), header.size(), path);
    const std::string zeros(kAlignment, '\0');
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string bytes = tensors[i].data();
      if (static_cast<int64_t>(bytes.size()) != sizes[i])
        throw std::logic_error(
            "[gguf] " + tensors[i].name + " encoded to " +
            std::to_string(bytes.size()) + " bytes, expected " +
            std::to_string(sizes[i]));
      write_all(fd, bytes.data(), bytes.size(), path);
      const int64_t pad = padded(sizes[i]) - sizes[i];
      if (pad > 0)
        write_all(fd, zeros.data(), static_cast<size_t>(pad), path);
      if (progress)
        progress(i, tensors[i], sizes[i]);
    }
  });
  return total;
}

} // namespace orchard::gguf
