// Errors a user can cause, and the exit codes Orchard uses.
//
// A UserError is thrown for anything the person at the keyboard can fix: a bad
// config key, a missing file, an unavailable device. Its message already says
// what was wrong, where, and how to fix it; main() prints it and exits with
// its code. Bugs stay as ordinary exceptions (or TORCH_CHECK failures).
#pragma once

#include <stdexcept>
#include <string>

namespace orchard {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1, // the work ran and failed (doctor found a problem)
  kExitUsage = 2,   // bad input: config, flags, files, devices
};

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message, int exit_code = kExitUsage)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const {
    return exit_code_;
  }

 private:
  int exit_code_;
};

} // namespace orchard
