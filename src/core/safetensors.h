// safetensors: the tensor file format of Hugging Face models and of Orchard's
// checkpoints. Spec: https://github.com/huggingface/safetensors (README,
// "Format"): an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {str: str}}, then the raw little-endian data; offsets count from the end of
// the header.
//
// Reading maps the file and hands out tensors that view the mapping (copied
// only when unaligned), so a 6 GB model costs no 6 GB read up front. The
// header is checked in full before anything is handed out: a truncated file,
// overlapping or out-of-range offsets, an unknown dtype or a huge header
// length is a UserError naming the file, never an out-of-bounds read.
// Writing is atomic (temporary file, fsync, rename).
#pragma once

#include "core/files.h"

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orchard::safetensors {

// The same limit as the reference implementation: no real header is this big.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype; // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0; // byte offsets into the data section
  uint64_t end = 0;
};

// One mapped .safetensors file.
class File {
 public:
  static File open(const std::string& path);

  const std::string& path() const {
    return path_;
  }
  const std::vector<TensorInfo>& tensors() const {
    return tensors_;
  }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // When the file records its data's CRC-32C (save()'s with_checksum),
  // UserError naming the file if the data bytes no longer match it (changed
  // in place since it was written); nothing when it records none, as files
  // from other writers do.
  void verify_checksum() const;
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  // A CPU tensor over the file's bytes (copy-on-write: writing to it never
  // changes the file).
  torch::Tensor get(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_begin_ = 0; // the data section's first byte in the file
};

// The __metadata__ key under which save(..., with_checksum) records the
// CRC-32C of the data section (hex), for verify_checksum(). Other readers
// (transformers, PEFT, the safetensors library) ignore it.
inline constexpr const char* kDataChecksumKey = "orchard_data_crc32c";

// A model's weights: one file, or the shards named by a Hugging Face
// model.safetensors.index.json. `path` may be the file, the index, or the
// folder holding either.
class Reader {
 public:
  static Reader open(const std::string& path);

  std::vector<std::string> names() const; // sorted
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  torch::Tensor get(const std::string& name) const;
  // Metadata of the first file (Orchard writes one file per checkpoint).
  const std::map<std::string, std::string>& metadata() const;
  size_t num_files() const {
    return files_.size();
  }

 private:
  std::vector<File> files_;
  std::map<std::string, size_t> where_; // tensor name -> file
};

// All tensors of a file, index or folder, by name.
std::map<std::string, torch::Tensor> load(const std::string& path);

// Writes tensors (any device; copied to CPU) and metadata to `path`
// atomically. Names must be unique and must not be "__metadata__".
// With `with_checksum`, the data section's CRC-32C goes into the metadata
// (kDataChecksumKey).
void save(
    const std::string& path,
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {},
    bool with_checksum = false);

// "F32" <-> torch dtypes. Throws UserError for dtypes Orchard cannot hold.
std::string dtype_name(torch::ScalarType type);

} // namespace orchard::safetensors
