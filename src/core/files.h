// File-system helpers.
//
// Atomic writes: files that are either wholly written or not there at all: the
// content goes to `<path>.tmp.<pid>`, is fsynced, then renamed over `path`
// (rename is atomic on POSIX file systems), and the folder is fsynced so the
// rename itself survives a power cut. A crash leaves at worst a stray .tmp
// file, never a half-written checkpoint or config.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace orchard {

// `write` receives an open file descriptor and must write everything to it
// (write_all helps); any exception aborts and removes the temporary file.
void atomic_write(
    const std::string& path,
    const std::function<void(int)>& write);
void atomic_write(const std::string& path, const std::string& content);

// Removes what atomic_write(path, ...) killed part way left: `path`.tmp.<pid>
// files whose process no longer runs on this machine (a running one may
// still be writing). Returns how many were removed.
int remove_stale_temporaries(const std::string& path);

// write(2) until all `size` bytes are out; throws UserError naming `path`.
void write_all(int fd, const void* data, size_t size, const std::string& path);

// Removes a file or a folder with everything in it (does not follow
// symbolic links); a missing path is not an error. Returns false if
// something could not be removed. Use this, not std::filesystem::remove_all:
// PyTorch 2.x's libtorch.so exports its own copy of remove_all, the dynamic
// linker binds ours to it, and it crashes (seen with PyTorch 2.11).
bool remove_tree(const std::string& path);

// A whole file mapped into memory, private and copy-on-write: views into it
// may be written without touching the file. Keep the shared_ptr alive as
// long as any view. Throws UserError naming `what` and the path when the
// file cannot be opened or is not a regular file.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(
      const std::string& path,
      const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  char* data() const {
    return static_cast<char*>(base_);
  }
  size_t size() const {
    return size_;
  }

 private:
  MappedFile() = default;
  void* base_ = nullptr;
  size_t size_ = 0;
};

} // namespace orchard
