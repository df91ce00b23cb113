#include "core/files.h"

#include "core/error.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace orchard {

namespace {

// A test hook for fault injection (tests/e2e): with
// ORCHARD_TEST_FAIL_WRITE=PART@N, writing the Nth file whose path contains
// PART fails as a full disk would (ENOSPC), after half of one write's
// bytes. Unset, it costs one getenv per process.
struct WriteFault {
  std::string part;
  long nth = 0;
  long seen = 0;
  std::string last_path; // files are written in several write_all calls
};

WriteFault* write_fault() {
  static WriteFault* fault = []() -> WriteFault* {
    const char* spec = std::getenv("ORCHARD_TEST_FAIL_WRITE");
    if (!spec || !*spec)
      return nullptr;
    std::string s = spec;
    auto at = s.rfind('@');
    auto* f = new WriteFault;
    f->part = s.substr(0, at);
    f->nth = at == std::string::npos ? 1 : std::atol(s.c_str() + at + 1);
    return f;
  }();
  return fault;
}

bool injected_failure(const std::string& path) {
  WriteFault* f = write_fault();
  if (!f || path.find(f->part) == std::string::npos)
    return false;
  if (path != f->last_path) {
    f->last_path = path;
    ++f->seen;
  }
  return f->seen == f->nth;
}

} // namespace

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  if (injected_failure(path)) {
    [[maybe_unused]] auto n = ::write(fd, data, size / 2);
    throw UserError(
        "cannot write '" + path + "': " + std::strerror(ENOSPC) +
            " (is the disk full?)",
        kExitFailure);
  }
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw UserError(
          "cannot write '" + path + "': " + std::strerror(errno) +
              " (is the disk full?)",
          kExitFailure);
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

int remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir =
      target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp.";
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0)
      continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() ||
        digits.find_first_not_of("0123456789") != std::string::npos ||
        digits.size() > 9)
      continue;
    const pid_t pid = pid_t(std::stol(digits));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH)
      continue; // running (or not ours to judge)
    if (::unlink(it->path().c_str()) == 0)
      ++removed;
  }
  return removed;
}

void atomic_write(const std::string& path, const std::string& content) {
  atomic_write(path, [&](int fd) {
    write_all(fd, content.data(), content.size(), path);
  });
}

bool remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    return errno == ENOENT;
  if (!S_ISDIR(st.st_mode))
    return ::unlink(path.c_str()) == 0;
  bool ok = true;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (struct dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..")
        ok = remove_tree(path + "/" + name) && ok;
    }
    ::closedir(dir);
  }
  return ::rmdir(path.c_str()) == 0 && ok;
}

std::shared_ptr<MappedFile> MappedFile::open(
    const std::string& path,
    const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw UserError(
        "cannot open " + what + " '" + path + "': " + std::strerror(errno) +
        ".");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError("'" + path + "' is not a regular file.");
  }
  std::shared_ptr<MappedFile> m(new MappedFile);
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    void* base =
        ::mmap(nullptr, m->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw UserError(
          "cannot map " + what + " '" + path + "': " + std::strerror(err));
    }
    m->base_ = base;
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (base_)
    ::munmap(base_, size_);
}

} // namespace orchard
