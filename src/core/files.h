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
#include <string>

namespace orchard {

// `write` receives an open file descriptor and must write everything to it
// (write_all helps); any exception aborts and removes the temporary file.
void atomic_write(
    const std::string& path,
    const std::function<void(int)>& write);
void atomic_write(const std::string& path, const std::string& content);

// write(2) until all `size` bytes are out; throws UserError naming `path`.
void write_all(int fd, const void* data, size_t size, const std::string& path);

// Removes a file or a folder with everything in it (does not follow
// symbolic links); a missing path is not an error. Returns false if
// something could not be removed. Use this, not std::filesystem::remove_all:
// PyTorch 2.x's libtorch.so exports its own copy of remove_all, the dynamic
// linker binds ours to it, and it crashes (seen with PyTorch 2.11).
bool remove_tree(const std::string& path);

} // namespace orchard
