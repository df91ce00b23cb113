// Writing a GGUF v3 file: llama.cpp's single-file model format.
//
// Format facts (ggml's docs/gguf.md), little-endian throughout:
//   "GGUF", uint32 version 3, uint64 tensor count, uint64 key-value count;
//   each key-value: string key, uint32 value type, the value (a string is a
//   uint64 length and its bytes; an array a uint32 element type, a uint64
//   count and the elements);
//   each tensor: string name, uint32 dimension count, uint64 dimensions
//   (ne[0], the contiguous one, first: a PyTorch (out, in) matrix is
//   [in, out]), uint32 ggml type, uint64 offset into the data section;
//   then padding to general.alignment (32 when absent), and the data, each
//   tensor starting at a multiple of the alignment.
//
// The file is written under <path>.partial and renamed when complete; the
// tensors' bytes are produced one at a time while writing, so a model is
// never held twice in memory.
#pragma once

#include "export/ggml_quants.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orchard::gguf {

// The key-values, serialised as they are added (order is kept).
class Metadata {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);
  bool has(const std::string& key) const;

  const std::string& bytes() const {
    return bytes_;
  }
  uint64_t count() const {
    return keys_.size();
  }

 private:
  void key(const std::string& k, uint32_t type);
  std::string bytes_;
  std::vector<std::string> keys_;
};

struct TensorEntry {
  std::string name;           // "blk.0.attn_q.weight"
  std::vector<int64_t> shape; // PyTorch's order (outermost first)
  TensorType type;
  // Produces the encoded bytes when the writer reaches this tensor.
  std::function<std::string()> data;
};

constexpr uint32_t kAlignment = 32; // general.alignment's default

// Writes the file; `progress(i, entry, bytes)` after each tensor. Returns
// the file's size. UserError for an I/O failure (the partial file is
// removed) or a tensor whose bytes do not match its shape and type.
int64_t write_file(
    const std::string& path,
    const Metadata& meta,
    const std::vector<TensorEntry>& tensors,
    const std::function<void(size_t, const TensorEntry&, int64_t)>& progress);

} // namespace orchard::gguf
