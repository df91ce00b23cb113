#include "core/checksum.h"

#include "core/error.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace orchard {
namespace {

// The reflected Castagnoli polynomial 0x1EDC6F41 (RFC 3720, B.4).
constexpr uint32_t kPolynomial = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[0][i] = c;
  }
  // t[k][i]: the CRC of byte i followed by k zero bytes.
  for (uint32_t i = 0; i < 256; ++i)
    for (int k = 1; k < 8; ++k)
      t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

} // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const Tables& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  // Eight bytes a step; the first four fold into the running CRC
  // (little-endian order, as the reflected CRC consumes bytes).
  while (n >= 8) {
    const uint32_t lo = crc ^
        (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
         uint32_t(p[3]) << 24);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
        t[4][lo >> 24] ^ t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--)
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

FileChecksum checksum_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw UserError(
        "cannot read '" + path + "' (" + std::strerror(errno) + ").",
        kExitFailure);
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<unsigned char> buf(kChunk);
  FileChecksum c;
  size_t got;
  while ((got = std::fread(buf.data(), 1, kChunk, f)) > 0) {
    c.crc32c = crc32c(buf.data(), got, c.crc32c);
    c.bytes += got;
  }
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed)
    throw UserError("cannot read '" + path + "'.", kExitFailure);
  return c;
}

std::string crc_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

nlohmann::json checksum_record(const std::string& path) {
  const FileChecksum c = checksum_file(path);
  return {{"bytes", c.bytes}, {"crc32c", crc_hex(c.crc32c)}};
}

bool matches_record(const nlohmann::json& record, const std::string& path) {
  if (!record.is_object())
    return false;
  const FileChecksum got = checksum_file(path);
  return record.value("bytes", uint64_t(0)) == got.bytes &&
      record.value("crc32c", std::string()) == crc_hex(got.crc32c);
}

} // namespace orchard
