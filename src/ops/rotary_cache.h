// Rotary position embedding as the Hugging Face Llama family applies it,
// and a decoding step's write of the new keys and values into a KV cache.
//
// The rope tables are (positions, D): cos = [c, c] and sin = [-s, s] (the
// first half negated), so that
//   rotate(x) = x * cos + roll(x, D / 2) * sin
// is transformers' x * cos + rotate_half(x) * sin element for element
// (negation is exact), each product and the sum rounded to x's dtype.
//
// rotary_cache_write_reference is the decoding step in plain libtorch ops:
// the portable path and the oracle of the CUDA kernel rotary_cache_write
// takes when the tensors allow it (ops/kernel_call.h: CUDA, one dtype, no
// gradient wanted).
#pragma once

#include <torch/torch.h>

namespace orchard::ops {

// x (..., D) rotated by tables shaped to broadcast against it.
torch::Tensor rotate(
    const torch::Tensor& x,
    const torch::Tensor& cos,
    const torch::Tensor& sin);

// One new token in each of B rows: q (B, H * D), k and v (B, Hkv * D)
// (rows may be strided, each row contiguous: views of one fused product
// are fine), rotated at positions pos (B, int64, on the device) by the
// tables (positions, D). Writes rotated k and v (unrotated) into cache_k
// and cache_v (rows >= B, Hkv, capacity, D) at [b, :, pos[b], :]; returns
// rotated q (B, H, 1, D). Every pos[b] must be below both the tables' and
// the cache's length (not checked: that would need a host sync).
torch::Tensor rotary_cache_write(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    const torch::Tensor& pos,
    torch::Tensor& cache_k,
    torch::Tensor& cache_v);

torch::Tensor rotary_cache_write_reference(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    const torch::Tensor& pos,
    torch::Tensor& cache_k,
    torch::Tensor& cache_v);

// Whether rotary_cache_write would run the CUDA kernel.
bool rotary_cache_write_is_fused(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    const torch::Tensor& cos,
    const torch::Tensor& sin,
    const torch::Tensor& pos,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v);

} // namespace orchard::ops
