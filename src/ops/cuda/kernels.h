// The CUDA kernels' entry points (src/ops/cuda/*.cu, built with
// -DORCHARD_CUDA=ON). Plain pointers and the stream, so the .cu files need
// no libtorch headers; the ops in src/ops/<op>.cpp check shapes and dtypes,
// pick the stream and fall back to their plain definitions.
#pragma once

#include <cstdint>

namespace orchard::ops::cuda {

enum class Dtype { float32, float16, bfloat16 };

// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm:
// n = T(x * rsqrt(mean(x^2) + eps)) computed in float32, then y = T(w * n),
// for `rows` rows of `C` contiguous values of type T (x, w and y alike).
// One block per row. Returns the launch's cudaError_t (0 for success).
int rms_norm(
    Dtype dtype,
    const void* x,
    const void* w,
    void* y,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream);

} // namespace orchard::ops::cuda
