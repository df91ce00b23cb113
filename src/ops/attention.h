// Causal self-attention: the fused kernel where libtorch has one, beside its
// plain definition (explicit_attention), which is both the portable path
// (libtorch 1.13, and positions the fused kernel's mask cannot express) and
// the test oracle (tests/ops/attention_test.cpp).
//
// Shapes: q (B, H, Tq, D); k, v (B, H, Tk, D) with Tk >= Tq, the queries
// being the last Tq positions (so a KV cache can hold earlier ones).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace orchard::ops {

// The positions a query may not see: query i (absolute position
// Tk - Tq + i) sees keys up to its own position and, with a sliding window
// W > 0, only the last W of them (Mistral's sliding_window: key j is seen
// when i - W < j <= i, as transformers masks it). True = hidden. (Tq, Tk).
torch::Tensor hidden_keys(
    int64_t Tq,
    int64_t Tk,
    int64_t window,
    torch::Device device);

// softmax(q k^T / sqrt(D) + mask) v with the mask from hidden_keys; the
// softmax runs in float32 at least.
torch::Tensor explicit_attention(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    int64_t window = 0);

// The same through the fused kernel where it applies: its causal mask is
// aligned top-left, so it is used when queries and keys cover the same
// positions, for one new token over a cache, and with an explicit mask
// when a sliding window cuts in; the explicit path otherwise.
torch::Tensor causal_attention(
    const torch::Tensor& q,
    const torch::Tensor& k,
    const torch::Tensor& v,
    int64_t window = 0);

// One new query per row over a fixed-size cache (batched decoding):
// q (B, H, 1, D); cache_k, cache_v (B, Hkv, Tmax, D) whose row b holds keys
// up to position pos[b]. Reads only the first `key_len` positions of the
// cache (0: all of them; the caller keeps key_len > max(pos)) and no
// position after pos[b] (nor, with a window W > 0, at or before
// pos[b] - W). The Hkv heads are shared by groups of H / Hkv query heads
// without copying the cache. Scores and softmax in float32 at least.
// Returns (B, H * D). No host synchronisation: CUDA graphs may capture it.
torch::Tensor decode_attention(
    const torch::Tensor& q,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v,
    const torch::Tensor& pos,
    int64_t key_len = 0,
    int64_t window = 0);

// decode_attention is a CUDA kernel (src/ops/cuda/decode_attention.cu:
// split over the keys, softmax and the weighted sum wholly in float32,
// only each row's filled keys read) where the tensors allow it
// (ops/kernel_call.h; q and the cache contiguous, one dtype, H / Hkv at
// most 8, D a multiple of 32 up to 256); else these plain ops, which
// round the probabilities to q's dtype before the weighted sum, as
// transformers' eager attention does.
torch::Tensor decode_attention_reference(
    const torch::Tensor& q,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v,
    const torch::Tensor& pos,
    int64_t key_len = 0,
    int64_t window = 0);
bool decode_attention_is_fused(
    const torch::Tensor& q,
    const torch::Tensor& cache_k,
    const torch::Tensor& cache_v,
    const torch::Tensor& pos);

} // namespace orchard::ops
