#include "core/safetensors.h"

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

namespace orchard::safetensors {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
  size_t bytes;
};

// The dtypes of the spec that libtorch 1.13 and 2.x both hold.
constexpr DtypeEntry kDtypes[] = {
    {"F64", torch::kFloat64, 8},
    {"F32", torch::kFloat32, 4},
    {"F16", torch::kFloat16, 2},
    {"BF16", torch::kBFloat16, 2},
    {"I64", torch::kInt64, 8},
    {"I32", torch::kInt32, 4},
    {"I16", torch::kInt16, 2},
    {"I8", torch::kInt8, 1},
    {"U8", torch::kUInt8, 1},
    {"BOOL", torch::kBool, 1},
};

const DtypeEntry* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name)
      return &d;
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (const auto& d : kDtypes)
    s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw UserError(
      "safetensors file '" + path + "': " + what +
      ".\n  The file is damaged or not a safetensors file; re-download or "
      "re-export it.");
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

// numel * bytes, or nullopt on overflow or a negative dimension.
std::optional<uint64_t> byte_size(
    const std::vector<int64_t>& shape,
    size_t item) {
  uint64_t n = item;
  for (int64_t d : shape) {
    if (d < 0)
      return std::nullopt;
    if (d != 0 &&
        n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

TensorInfo parse_entry(
    const std::string& path,
    const std::string& name,
    const json& entry) {
  auto where = "tensor '" + name + "'";
  if (!entry.is_object())
    corrupt(path, where + " is not a JSON object in the header");
  TensorInfo t;
  t.name = name;
  if (!entry.contains("dtype") || !entry["dtype"].is_string())
    corrupt(path, where + " has no dtype");
  t.dtype = entry["dtype"].get<std::string>();
  if (!entry.contains("shape") || !entry["shape"].is_array())
    corrupt(path, where + " has no shape list");
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      corrupt(path, where + " has a shape entry that is not a size");
    t.shape.push_back(d.get<int64_t>());
  }
  static const json kMissing; // a reference: a temporary would copy the entry
  const json& off =
      entry.contains("data_offsets") ? entry["data_offsets"] : kMissing;
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    corrupt(path, where + " has no valid data_offsets [begin, end]");
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  if (t.end < t.begin)
    corrupt(path, where + " ends before it begins (data_offsets)");
  return t;
}

} // namespace

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  // Private and writable: tensors may be modified in place by callers
  // without touching the file (the pages are copied on write).
  f.map_ = MappedFile::open(path, "safetensors file");
  uint64_t size = f.map_->size();
  if (size < 8)
    corrupt(
        path,
        "it is " + std::to_string(size) +
            " bytes long, too short to hold the 8-byte header length");
  const auto* bytes = reinterpret_cast<const unsigned char*>(f.map_->data());

  uint64_t header_len = read_le64(bytes);
  if (header_len > kMaxHeaderBytes)
    corrupt(
        path,
        "the header length is " + std::to_string(header_len) +
            " bytes, over the " + std::to_string(kMaxHeaderBytes) +
            "-byte limit");
  if (header_len > size - 8)
    corrupt(
        path,
        "the header claims " + std::to_string(header_len) +
            " bytes but the file has only " + std::to_string(size - 8) +
            " after the length (truncated?)");
  const std::string_view header_text(
      reinterpret_cast<const char*>(bytes) + 8, header_len);
  if (json_nesting(header_text) > kMaxJsonDepth)
    corrupt(
        path,
        "the header nests deeper than " + std::to_string(kMaxJsonDepth) +
            " levels");
  json header;
  try {
    header = json::parse(header_text);
  } catch (const json::exception& e) {
    corrupt(
        path, std::string("the header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object())
    corrupt(path, "the header is not a JSON object");
  uint64_t data_size = size - 8 - header_len;
  f.data_begin_ = 8 + header_len;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        corrupt(path, "__metadata__ is not a JSON object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          corrupt(path, "__metadata__ value for '" + k + "' is not a string");
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    TensorInfo t = parse_entry(path, name, entry);
    const DtypeEntry* d = find_dtype(t.dtype);
    if (!d)
      throw UserError(
          "safetensors file '" + path + "': tensor '" + name + "' has dtype '" +
          t.dtype + "', which Orchard cannot read (supported: " +
          supported_list() + ").\n  Convert the tensor to one of these first.");
    auto expected = byte_size(t.shape, d->bytes);
    if (!expected || *expected != t.end - t.begin)
      corrupt(
          path,
          "tensor '" + name + "' of dtype " + t.dtype + " needs " +
              (expected ? std::to_string(*expected)
                        : "an impossible number of") +
              " bytes but its data_offsets span " +
              std::to_string(t.end - t.begin));
    if (t.end > data_size)
      corrupt(
          path,
          "tensor '" + name + "' ends at data byte " + std::to_string(t.end) +
              " but the file holds only " + std::to_string(data_size) +
              " data bytes (truncated?)");
    f.index_[name] = f.tensors_.size();
    f.tensors_.push_back(std::move(t));
  }

  // No two tensors may share bytes.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : f.tensors_)
    if (t.end > t.begin)
      by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin < b->begin;
  });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      corrupt(
          path,
          "tensors '" + by_offset[i - 1]->name + "' and '" +
              by_offset[i]->name + "' overlap (data_offsets)");
  return f;
}

bool File::contains(const std::string& name) const {
  return index_.count(name) > 0;
}

const TensorInfo& File::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw UserError(
        "safetensors file '" + path_ + "' has no tensor '" + name + "'.");
  return tensors_[it->second];
}

torch::Tensor File::get(const std::string& name) const {
  const TensorInfo& t = info(name);
  const DtypeEntry* d = find_dtype(t.dtype);
  char* base = map_->data();
  uint64_t header_len = read_le64(reinterpret_cast<unsigned char*>(base));
  char* data = base + 8 + header_len + t.begin;
  // Bytes of a bool tensor may hold any value; torch requires 0 or 1.
  torch::ScalarType view_type =
      d->type == torch::kBool ? torch::kUInt8 : d->type;
  auto options = torch::TensorOptions().dtype(view_type);
  torch::Tensor out;
  if (t.end == t.begin) {
    out = torch::empty(t.shape, options);
  } else if (reinterpret_cast<uintptr_t>(data) % d->bytes != 0) {
    // Unaligned data (a header length that is not a multiple of 8): copy.
    out = torch::empty(t.shape, options);
    std::memcpy(out.data_ptr(), data, t.end - t.begin);
  } else {
    auto keep = map_;
    out = torch::from_blob(
        data, t.shape, [keep](void*) {}, options);
  }
  return d->type == torch::kBool ? out.ne(0) : out;
}

std::string dtype_name(torch::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type)
      return d.name;
  throw UserError(
      std::string("cannot write a tensor of dtype ") + c10::toString(type) +
      " to safetensors (supported: " + supported_list() + ").");
}

void File::verify_checksum() const {
  auto want = metadata_.find(kDataChecksumKey);
  if (want == metadata_.end())
    return;
  const uint32_t got =
      crc32c(map_->data() + data_begin_, map_->size() - data_begin_);
  if (crc_hex(got) != want->second)
    throw UserError(
        "'" + path_ +
        "' is damaged: its bytes changed since it was written (the "
        "checksum it records, " +
        want->second + ", does not match " + crc_hex(got) +
        "). Restore it from a backup or write it again.");
}

void save(
    const std::string& path,
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata,
    bool with_checksum) {
  json header = json::object();
  std::vector<torch::Tensor> data;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second)
      throw std::invalid_argument(
          "[safetensors::save] duplicate or reserved tensor name '" + name +
          "'");
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {
        {"dtype", dtype_name(t.scalar_type())},
        {"shape", t.sizes().vec()},
        {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(t);
  }
  std::map<std::string, std::string> meta = metadata;
  if (with_checksum) {
    uint32_t crc = 0;
    for (const auto& t : data)
      if (t.numel() > 0)
        crc = crc32c(t.data_ptr(), t.numel() * t.element_size(), crc);
    meta[kDataChecksumKey] = crc_hex(crc);
  }
  if (!meta.empty())
    header["__metadata__"] = meta;
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference
  // writer does; every tensor can then be mapped without a copy.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  atomic_write(path, [&](int fd) {
    write_all(fd, len, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const auto& t : data)
      if (t.numel() > 0)
        write_all(fd, t.data_ptr(), t.numel() * t.element_size(), path);
  });
}

Reader Reader::open(const std::string& path) {
  Reader r;
  fs::path p(path);
  if (!fs::exists(p))
    throw UserError("'" + path + "' does not exist.");
  fs::path index;
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors.index.json")) {
      index = p / "model.safetensors.index.json";
    } else if (fs::exists(p / "model.safetensors")) {
      p = p / "model.safetensors";
    } else {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(p))
        if (e.path().extension() == ".safetensors")
          found.push_back(e.path());
      if (found.size() != 1)
        throw UserError(
            "folder '" + path + "' has " + std::to_string(found.size()) +
            " .safetensors files and no model.safetensors.index.json; point "
            "at one file, or add the index that lists the shards.");
      p = found[0];
    }
  } else if (p.extension() == ".json") {
    index = p;
  }
  if (index.empty()) {
    r.files_.push_back(File::open(p.string()));
    for (const auto& t : r.files_[0].tensors())
      r.where_[t.name] = 0;
    return r;
  }

  json j;
  {
    std::ifstream in(index);
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw UserError(
          "'" + index.string() + "' is not valid JSON: " + e.what() + ".");
    }
  }
  if (!j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object())
    throw UserError(
        "'" + index.string() +
        "' has no \"weight_map\" object mapping tensor names to shard files.");
  std::map<std::string, size_t> file_of_shard;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      throw UserError(
          "'" + index.string() + "': the shard for '" + name +
          "' is not a file name.");
    std::string s = shard.get<std::string>();
    fs::path rel(s);
    if (rel.is_absolute() || s.find("..") != std::string::npos)
      throw UserError(
          "'" + index.string() + "' names shard '" + s +
          "' outside its folder; shards must sit beside the index.");
    auto it = file_of_shard.find(s);
    if (it == file_of_shard.end()) {
      fs::path file = index.parent_path() / rel;
      std::error_code ec; // a name too long to look up is missing too
      if (!fs::is_regular_file(file, ec))
        throw UserError(
            "'" + index.string() + "' names shard '" + s + "' for tensor '" +
            name + "', but " + file.string() +
            " is missing; copy every shard of the model.");
      it = file_of_shard.emplace(s, r.files_.size()).first;
      r.files_.push_back(File::open(file.string()));
    }
    if (!r.files_[it->second].contains(name))
      throw UserError(
          "'" + index.string() + "' says tensor '" + name + "' is in '" + s +
          "', but that shard has no such tensor.");
    r.where_[name] = it->second;
  }
  if (r.files_.empty())
    throw UserError("'" + index.string() + "' lists no tensors.");
  return r;
}

std::vector<std::string> Reader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_)
    out.push_back(name);
  return out;
}

bool Reader::contains(const std::string& name) const {
  return where_.count(name) > 0;
}

const TensorInfo& Reader::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw UserError("the model has no tensor '" + name + "'.");
  return files_[it->second].info(name);
}

torch::Tensor Reader::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw UserError("the model has no tensor '" + name + "'.");
  return files_[it->second].get(name);
}

const std::map<std::string, std::string>& Reader::metadata() const {
  return files_.front().metadata();
}

std::map<std::string, torch::Tensor> load(const std::string& path) {
  Reader r = Reader::open(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& name : r.names())
    out[name] = r.get(name);
  return out;
}

} // namespace orchard::safetensors
