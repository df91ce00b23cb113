// The test binaries' main: OpenBLAS's kernels chosen as orchard's own main
// chooses them (core/blas_kernels.h: on a CPU newer than the OpenBLAS, the
// fast ones instead of the generic fallback), malloc set as orchard sets it
// (core/machine.h), then GoogleTest.
#include "core/blas_kernels.h"
#include "core/machine.h"

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  orchard::use_fast_blas_kernels(argv); // may start the binary again
  orchard::configure_allocator();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
