// OpenBLAS's kernels on CPUs newer than the OpenBLAS. OpenBLAS picks its
// kernels by the CPU's model when the library loads; a model it does not
// know gets Prescott's generic SSE3 kernels. Debian 12's OpenBLAS 0.3.21
// does not know Intel's Emerald Rapids (family 6, model 207, the 2-core
// VMs of this project's CI), and a 1024 x 1024 float32 product ran there at
// 23 GFLOP/s with Prescott's kernels against 110 with SkylakeX's AVX-512
// ones: every CPU run 4-5x slower than the machine allows. So at start-up,
// where OpenBLAS fell back that way on a CPU with AVX-512 (or AVX2 + FMA),
// Orchard sets OPENBLAS_CORETYPE to SkylakeX (Haswell) and starts itself
// again (the variable is read only when the library loads). A variable the
// user set is left alone.
#pragma once

#include <string>

namespace orchard {

// The OPENBLAS_CORETYPE to ask for when OpenBLAS picked `picked` on a CPU
// with these features: "SkylakeX" or "Haswell" when `picked` is the
// generic fallback (Prescott) and the CPU can run them, else "".
std::string better_blas_core(
    const std::string& picked,
    bool avx512,
    bool avx2_fma);

// The kernels OpenBLAS runs ("SkylakeX", "Prescott", ...), or "" where
// the BLAS is not OpenBLAS.
std::string blas_core();

// For `orchard doctor`: a sentence saying that Orchard switched OpenBLAS's
// kernels at start-up (from which to which), or "".
std::string blas_core_switch_note();

// Called first in main(): where better_blas_core() names kernels and
// OPENBLAS_CORETYPE is unset (or empty), sets it (and
// ORCHARD_BLAS_CORE_FROM, for the note) and executes this program again
// with the same arguments; it returns only when nothing is to change or
// the new start failed (then the run goes on with the slow kernels).
void use_fast_blas_kernels(char** argv);

} // namespace orchard
