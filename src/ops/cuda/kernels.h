// The CUDA kernels' entry points (src/ops/cuda/*.cu, built with
// -DORCHARD_CUDA=ON). Plain pointers and the stream, so the .cu files need
// no libtorch headers; the ops in src/ops/<op>.cpp check shapes and dtypes,
// pick the stream and fall back to their plain definitions.
#pragma once

#include <cstdint>

namespace orchard::ops::cuda {

enum class Dtype { float32, float16, bfloat16 };

// Whether the kernels below are launched as programmatic dependent
// launches on the current device (numeric.cuh's launch_dependent: compute
// capability 9.0+, kernels compiled for it, ORCHARD_PDL not 0): each may be
// scheduled while the kernel before it still runs.
bool dependent_launch_active();

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

// rms_norm of s = T(x + r), also writing s to `sum`: the residual add and
// the next norm of a decoder layer in one pass (x, r, w, sum, y of type T).
int add_rms_norm(
    Dtype dtype,
    const void* x,
    const void* r,
    const void* w,
    void* sum,
    void* y,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream);

// Rotary embedding and the KV cache write of one decoding step, for B rows
// of one new token each. q (heads_q * D), k and v (heads_kv * D) of row b
// start at q + b * q_stride (k, v likewise; each row contiguous). cos and
// sin are the rope tables (positions, D), sin with the first half negated,
// so rotate(x)[d] = T(T(x[d] * cos[p][d]) + T(x[(d + D/2) % D] * sin[p][d]))
// at p = pos[b] (int64 on the device). Writes rotated q to q_out (B,
// heads_q, D), and rotated k and v (unrotated) to cache_k, cache_v (rows,
// heads_kv, capacity, D) at [b, :, pos[b], :]. All of type T.
int rotary_cache_write(
    Dtype dtype,
    const void* q,
    const void* k,
    const void* v,
    int64_t q_stride,
    int64_t k_stride,
    int64_t v_stride,
    const void* cos,
    const void* sin,
    const int64_t* pos,
    void* q_out,
    void* cache_k,
    void* cache_v,
    int64_t B,
    int64_t heads_q,
    int64_t heads_kv,
    int64_t D,
    int64_t capacity,
    void* stream);

// Attention of one query per row over a KV cache (ops::decode_attention's
// definition): q (B, H, D); cache_k, cache_v (rows >= B, Hkv, capacity, D);
// row b attends to keys j < key_len with j <= pos[b] (and, window > 0,
// j > pos[b] - window); query head h reads kv head h / (H / Hkv). Scores,
// softmax and the weighted sum in float32; y (B, H * D) of type T.
// The keys are split into chunks of `kDecodeChunk` positions, one block
// each, whose partial results (float32, `workspace` of
// decode_attention_workspace(...) floats) a second kernel combines; a
// chunk past pos[b] reads nothing. D a multiple of 32 up to 256, H / Hkv
// at most 8.
constexpr int64_t kDecodeChunk = 32;
int64_t decode_attention_workspace(
    int64_t B,
    int64_t H,
    int64_t key_len,
    int64_t D);
bool decode_attention_supports(int64_t H, int64_t Hkv, int64_t D);
int decode_attention(
    Dtype dtype,
    const void* q,
    const void* cache_k,
    const void* cache_v,
    const int64_t* pos,
    void* y,
    float* workspace,
    int64_t B,
    int64_t H,
    int64_t Hkv,
    int64_t D,
    int64_t capacity,
    int64_t key_len,
    int64_t window,
    float scale,
    void* stream);

// SwiGLU's product: y = T(T(silu(g)) * u), silu(g) = g / (1 + exp(-g)) in
// float32, for B rows of n values; row b of g starts at g + b * g_stride
// (u likewise), y is (B, n) contiguous.
int silu_mul(
    Dtype dtype,
    const void* g,
    const void* u,
    int64_t g_stride,
    int64_t u_stride,
    void* y,
    int64_t B,
    int64_t n,
    void* stream);

// y (N, out) = x (N, in) times the NF4 matrix W (out, in) transposed
// (ops/nf4.h's format: two 4-bit level indices a byte, the first in the
// high nibble; one absmax of type T per 64 consecutive values), where
// W[o][i] = T(T(level) * absmax) as ops::dequantize_nf4 expands it; sums
// in float32. N at most kNf4MaxRows, `in` a multiple of 64. One warp per
// output, reading each code once: for decoding, where the product is a
// matrix-vector one and the expanded matrix would cost three times the
// bytes of the codes.
constexpr int64_t kNf4MaxRows = 8;
int nf4_matvec(
    Dtype dtype,
    const void* x,
    const uint8_t* codes,
    const void* absmax,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream);

// y (N, out) = x (N, in) W^T (+ bias), W (out, in) row-major, all of type
// T, sums in float32 and one rounding (the bias added before it). N at
// most kMatvecMaxRows; x, W and y 16-byte aligned and `in` a multiple of
// 16 bytes' worth of T. One warp per output, 16-byte loads of W kept in
// flight: decoding's one-row products, where cuBLAS reaches 65-85 % of
// the memory bus (bench/peers/gemv_bandwidth.py). One row only: with N
// rows each piece of W meets N pieces of x from L1, and at 8 rows the
// kernel took twice cuBLAS's time (H100, 2026-11-24).
constexpr int64_t kMatvecMaxRows = 1;
int matvec(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream);

// SwiGLU's product and activation in one kernel: W (2 * half, in) stacks
// the gate's rows over the up's (bias likewise, or null), and
// y (N, half) = silu_mul(g, u) of g = matvec rows 0..half-1 and u = rows
// half..2 half-1, each rounded to T first: the numbers matvec followed by
// silu_mul give, without writing g and u. N at most kMatvecMaxRows.
int matvec_silu_mul(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t half,
    int64_t in,
    void* stream);

// Training kernels with a backward (train_fused.cu for the tiny recursive
// model's, gpt_train.cu for the GPT's; the ops in
// src/ops/fused_train.cpp wrap them in autograd functions).
//
// y = T(T(silu(g)) * u), where g and u are the halves of one contiguous
// product gu viewed as (outer, 2, inner): g = gu[o][0], u = gu[o][1]; y is
// (outer, inner) contiguous.
int silu_mul_halves(
    Dtype dtype,
    const void* gu,
    void* y,
    int64_t outer,
    int64_t inner,
    void* stream);

// Its gradient: dgu (outer, 2, inner) from dy (outer, inner), as PyTorch's
// silu and product compute theirs.
int silu_mul_halves_backward(
    Dtype dtype,
    const void* gu,
    const void* dy,
    void* dgu,
    int64_t outer,
    int64_t inner,
    void* stream);

// For a and b viewed as (outer, N, inner), contiguous: s = T(a + b) and
// y = T(s * rstd) with rstd = rsqrt(sum_n s^2 / count + eps) in float32,
// over the middle dimension (count <= N: the entries after the first count
// are zero padding). Writes y (like a) and rstd (outer * inner float32).
int add_rms_norm_unscaled(
    Dtype dtype,
    const void* a,
    const void* b,
    void* y,
    float* rstd,
    int64_t outer,
    int64_t N,
    int64_t inner,
    int64_t count,
    float eps,
    void* stream);

// Its gradient with respect to s (and so to a and to b), from the output
// y and rstd: dx = T(rstd * (dy - y * sum_n(dy * y) / count)).
int rms_norm_unscaled_backward(
    Dtype dtype,
    const void* dy,
    const void* y,
    const float* rstd,
    void* dx,
    int64_t outer,
    int64_t N,
    int64_t inner,
    int64_t count,
    void* stream);

// The MLP's ReLU squared over n values of type T: y = T(r * r) with
// r = relu(u) (NaN stays NaN, as torch::relu keeps it).
int relu_square(Dtype dtype, const void* u, void* y, int64_t n, void* stream);

// Its gradient as PyTorch's relu and product compute theirs from u:
// du = 2 T(dy * u) where u > 0, else 0.
int relu_square_backward(
    Dtype dtype,
    const void* u,
    const void* dy,
    void* du,
    int64_t n,
    void* stream);

// Attention's q, k and v from one stacked product: qkv holds `tokens` rows
// of (H + 2 Hkv) heads of D values (q's heads, then k's, then v's),
// contiguous; token t is at position t % T of the tables cos and sin (T,
// D/2). q and k heads are rotated, o1 = T(T(x1 c) + T(x2 s)) and
// o2 = T(T(x2 c) - T(x1 s)) for the halves x1 = x[:D/2], x2 = x[D/2:], then
// normed, y = T(o * rstd) with rstd = rsqrt(mean(o^2) + eps) in float32;
// v heads are copied where v is given (else v is the caller's view of
// qkv). Writes q (tokens, H, D), k and v (tokens, Hkv, D) and rstd
// (tokens * H for q, then tokens * Hkv for k; float32).
bool rotary_norm_qkv_supports(int64_t D);
int rotary_norm_qkv(
    Dtype dtype,
    const void* qkv,
    const void* cos,
    const void* sin,
    void* q,
    void* k,
    void* v,
    float* rstd,
    int64_t tokens,
    int64_t T,
    int64_t H,
    int64_t Hkv,
    int64_t D,
    float eps,
    void* stream);

// Where head h of token t (of sequence b = token / T, position t % T)
// starts in a gradient of q, k or v: b * batch + (t % T) * position +
// h * head values; a head's D values are contiguous and its first is
// 16-byte aligned. Attention's gradients come in its own layout, read
// where they are rather than copied.
struct HeadStrides {
  int64_t batch, position, head;
};

// Its gradient: dqkv (tokens, H + 2 Hkv, D) from dq, dk, dv (the shapes of
// q, k, v, laid out as their strides say) and the outputs q, k and rstd:
// the norm's, do = T(rstd (dy - y mean(dy y))), rotated back,
// dx1 = T(T(do1 c) - T(do2 s)), dx2 = T(T(do1 s) + T(do2 c)); v's rows
// copied.
int rotary_norm_qkv_backward(
    Dtype dtype,
    const void* dq,
    const void* dk,
    const void* dv,
    HeadStrides dq_at,
    HeadStrides dk_at,
    HeadStrides dv_at,
    const void* q,
    const void* k,
    const float* rstd,
    const void* cos,
    const void* sin,
    void* dqkv,
    int64_t tokens,
    int64_t T,
    int64_t H,
    int64_t Hkv,
    int64_t D,
    void* stream);

// A pre-norm block's residual add and the next norm, for `rows` rows of C
// contiguous values: s = TS(x + b) and y = TY(s * rstd), rstd = rsqrt(mean
// (s^2) + eps) in float32. x and s have the residual's type, b the
// branch's and y the next product's (under autocast a float32 residual, a
// bfloat16 branch and a bfloat16 input: the cast the product would make is
// this kernel's store). Pairs of (residual, low) dtypes: all one type, or
// float32 with float16 or bfloat16 for b and y each. C a multiple of 128.
bool residual_add_rms_norm_supports(
    Dtype residual,
    Dtype branch,
    Dtype out,
    int64_t C);
int residual_add_rms_norm(
    Dtype residual,
    Dtype branch,
    Dtype out,
    const void* x,
    const void* b,
    void* s,
    void* y,
    float* rstd,
    int64_t rows,
    int64_t C,
    float eps,
    void* stream);

// Its gradient: dx = TS(ds + TS(rstd (dy - n mean(dy n)))), n = s rstd,
// written to dx (residual type) and, where the branch has another type,
// as TB(dx) to db (else db is unused). ds may be null (no gradient
// reached s: zeros).
int residual_add_rms_norm_backward(
    Dtype residual,
    Dtype branch,
    Dtype out,
    const void* ds,
    const void* dy,
    const void* s,
    const float* rstd,
    void* dx,
    void* db,
    int64_t rows,
    int64_t C,
    void* stream);

// The cross-entropy of each row of logits z (rows, V; row stride ld >= V,
// a multiple of 16 bytes, z 16-byte aligned, else cudaErrorInvalidValue;
// type T; the columns past V are left as they are)
// against targets (rows int64 on the device; -1: ignored, loss 0), the
// logits soft-capped first (s = cap * tanh(z / cap); cap 0: s = z), all
// in float32: loss[r] = logsumexp(s[r]) - s[r][target[r]]
// (cross_entropy.cu). With write_grad, z is overwritten by the gradient
// of the loss with respect to z: T((softmax(s) - onehot) * (1 - tanh^2)),
// a zero row for an ignored target.
int softcap_cross_entropy(
    Dtype dtype,
    void* z,
    const int64_t* targets,
    float* loss,
    int64_t rows,
    int64_t V,
    int64_t ld,
    float softcap,
    bool write_grad,
    void* stream);

// The gradient of an embedding of num_rows rows of D values from the
// gradient of its output: out[v] = T(scale * sum of rows[order[j]] over the
// j where sorted_ids[j] == v), summed in float32 in an order fixed by j
// (groups of four, then chunks of kRowsChunk), so that the
// same inputs give the same bits on every GPU and every run (no atomic
// adds; embedding_rows.cu). sorted_ids (n int64, ascending) and order (n
// int64: rows[order[j]] has id sorted_ids[j]) on the device, rows (n, D)
// and out (num_rows, D) contiguous of type T; out must be zeros where no
// id falls. Ids outside [0, num_rows) are left out. partials: 2 * D
// float32 scratch values for each group of kRowsChunk sorted ids.
constexpr int64_t kRowsChunk = 64;
int embedding_rows_backward(
    Dtype dtype,
    const void* rows,
    const int64_t* sorted_ids,
    const int64_t* order,
    float* partials,
    void* out,
    int64_t n,
    int64_t D,
    int64_t num_rows,
    float scale,
    void* stream);

// out = scale * (parts[0] + parts[1] + ... + parts[n - 1]), float32,
// summed in that order, for `count` values (a multiple of 4; every pointer
// 16-byte aligned; out may be one of the parts). 1 <= n <= kMeanOfMaxParts.
// With `squares` (mean_of_blocks(count) floats), block i writes the sum of
// the squares of the values of out it made to squares[i], each time in
// the same order.
constexpr int kMeanOfMaxParts = 8;
int mean_of_blocks(int64_t count);
int mean_of(
    const float* const* parts,
    int n,
    float* out,
    int64_t count,
    float scale,
    float* squares,
    void* stream);

// ops::prepare_copies (ops/copy_pieces.h): `chunks` rows of (source
// address, destination address, count <= kCopyChunk) in device memory,
// each copied with the cast from `from` to `to`.
constexpr int64_t kCopyChunk = 8192;
int copy_pieces(
    const int64_t* table,
    int64_t chunks,
    Dtype from,
    Dtype to,
    void* stream);

} // namespace orchard::ops::cuda
