// Checksums of the files Orchard writes and later trusts (checkpoints,
// prepared data): CRC-32C (Castagnoli), the checksum iSCSI, ext4 and
// Btrfs use. It finds every burst of changed bytes up to 32 bits long and
// any other change but one in 2^32, which is what a checksum against
// damage needs (it is no defence against tampering). Computed 8 bytes at a
// time with eight tables ("slicing-by-8"), several GB/s on one core.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace orchard {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// The size and CRC-32C of a whole file; UserError when it cannot be read.
FileChecksum checksum_file(const std::string& path);

// "1a2b3c4d": the form checksums take in JSON metadata.
std::string crc_hex(uint32_t crc);

// A file's record in the metadata that lists what a folder holds (a
// checkpoint's state.json, a shard cache's meta file, a prepared cache's
// checksums.json): {"bytes": size, "crc32c": "1a2b3c4d"}.
nlohmann::json checksum_record(const std::string& path);
// Whether `path` still has the size and checksum of `record` (false for a
// record that is not such an object).
bool matches_record(const nlohmann::json& record, const std::string& path);

} // namespace orchard
