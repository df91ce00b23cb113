#include "core/atomic_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace orchard {

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw UserError(
          "cannot write '" + path + "': " + std::strerror(errno) +
          " (is the disk full?)");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void atomic_write(
    const std::string& path,
    const std::function<void(int)>& write) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir =
      target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw UserError(
        "cannot create '" + tmp + "': " + std::strerror(errno) +
        " (does the folder exist and is it writable?)");
  try {
    write(fd);
    if (::fsync(fd) != 0)
      throw UserError("cannot flush '" + tmp + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw UserError(
        "cannot move '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void atomic_write(const std::string& path, const std::string& content) {
  atomic_write(path, [&](int fd) {
    write_all(fd, content.data(), content.size(), path);
  });
}

} // namespace orchard
