// Attention of one new query per row over the KV cache, in two kernels
// (plain definition and oracle: ops::decode_attention_reference in
// src/ops/attention.cpp, about ten kernels: casts, two products, the
// mask, the softmax). Split over the keys ("flash decoding"): one block
// per (chunk of kDecodeChunk keys, kv head, row) keeps a running softmax
// (maximum, sum, weighted values) for the G query heads that read its kv
// head, so a batch of one still fills the GPU; a second kernel combines
// the chunks. A chunk wholly past a row's position reads nothing.
#include "ops/cuda/numeric.cuh"

#include <math.h>

namespace orchard::ops::cuda {
namespace {

constexpr int kMaxGroup = 8; // query heads per kv head
constexpr int kWarps = 4;    // a block's warps
constexpr int kRound = 4;    // keys a warp reads at a time
constexpr int kMaxDim = 256;

// VEC = D / 32 values of each key for each lane.
template <typename T, int VEC>
__global__ void decode_chunk_kernel(
    const T* __restrict__ q,
    const T* __restrict__ cache_k,
    const T* __restrict__ cache_v,
    const int64_t* __restrict__ pos,
    T* __restrict__ y,
    float* __restrict__ work,
    int64_t H,
    int64_t Hkv,
    int64_t capacity,
    int64_t key_len,
    int64_t window,
    float scale) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  constexpr int D = VEC * kWarp;
  const int64_t chunks = gridDim.x, chunk = blockIdx.x;
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const int G = int(H / Hkv);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t p = pos[b];
  int64_t lo = chunk * kDecodeChunk;
  int64_t hi = lo + kDecodeChunk - 1;
  if (hi > key_len - 1)
    hi = key_len - 1;
  if (hi > p)
    hi = p;
  if (window > 0 && lo < p - window + 1)
    lo = p - window + 1;

  float qv[kMaxGroup][VEC];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      qv[g][e] = g < G
          ? to_float(q[((b * H) + hk * G + g) * D + lane * VEC + e])
          : 0.f;
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][VEC];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      acc[g][e] = 0.f;
  }
  // Each warp takes kRound consecutive keys at a time: their loads issued
  // together, then the G x kRound dot products reduced together (the warp
  // sums' shuffles interleaved), so a round waits for memory and for the
  // shuffles once, not once a key: at a few hundred keys the kernel is
  // all latency (bench/RESULTS.md, 2026-11-27 (late)).
  const int64_t base = (b * Hkv + hk) * capacity * D + lane * VEC;
  for (int64_t j0 = lo + warp * kRound; j0 <= hi; j0 += kWarps * kRound) {
    float kv[kRound][VEC], vv[kRound][VEC];
#pragma unroll
    for (int r = 0; r < kRound; ++r) {
      // Past hi: masked below. A lane's VEC values start VEC apart, in
      // rows D = 32 VEC apart: aligned for load_values' single load.
      const int64_t j = j0 + r <= hi ? j0 + r : hi;
      load_values<T, VEC>(cache_k + base + j * D, kv[r]);
      load_values<T, VEC>(cache_v + base + j * D, vv[r]);
    }
    float s[kMaxGroup][kRound];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
      for (int r = 0; r < kRound; ++r) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          dot += qv[g][e] * kv[r][e];
        s[g][r] = g < G ? dot : 0.f;
      }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1)
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
        for (int r = 0; r < kRound; ++r)
          if (g < G)
            s[g][r] += __shfl_xor_sync(0xffffffffu, s[g][r], o);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= G)
        break;
      float mn = m[g];
#pragma unroll
      for (int r = 0; r < kRound; ++r) {
        s[g][r] = j0 + r <= hi ? s[g][r] * scale : -INFINITY;
        mn = fmaxf(mn, s[g][r]);
      }
      const float keep = expf(m[g] - mn); // 0 for the first keys
      float w[kRound];
      l[g] *= keep;
#pragma unroll
      for (int r = 0; r < kRound; ++r) {
        w[r] = expf(s[g][r] - mn); // 0 past hi
        l[g] += w[r];
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        float a = acc[g][e] * keep;
#pragma unroll
        for (int r = 0; r < kRound; ++r)
          a += w[r] * vv[r][e];
        acc[g][e] = a;
      }
      m[g] = mn;
    }
  }

  // The block's warps combined: each warp's state through shared memory.
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  __shared__ float s_acc[kWarps][kMaxGroup][kMaxDim];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= G)
      break;
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      s_acc[warp][g][lane * VEC + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      M = fmaxf(M, s_m[w][g]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY)
      for (int w = 0; w < kWarps; ++w) {
        const float f = expf(s_m[w][g] - M);
        L += s_l[w][g] * f;
        A += s_acc[w][g][d] * f;
      }
    const int64_t head = hk * G + g;
    if (chunks == 1) {
      y[(b * H + head) * D + d] = from_float<T>(L > 0.f ? A / L : 0.f);
    } else {
      float* out = work + ((b * H + head) * chunks + chunk) * (D + 2);
      if (d == 0) {
        out[0] = M;
        out[1] = L;
      }
      out[2 + d] = A;
    }
  }
}

// One block per (query head, row), one thread per dimension.
template <typename T>
__global__ void decode_combine_kernel(
    const float* __restrict__ work,
    T* __restrict__ y,
    int64_t H,
    int64_t D,
    int64_t chunks) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t head = blockIdx.x, b = blockIdx.y;
  const float* in = work + (b * H + head) * chunks * (D + 2);
  float M = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c)
    M = fmaxf(M, in[c * (D + 2)]);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float L = 0.f, A = 0.f;
    if (M != -INFINITY)
      for (int64_t c = 0; c < chunks; ++c) {
        const float* part = in + c * (D + 2);
        const float f = expf(part[0] - M);
        L += part[1] * f;
        A += part[2 + d] * f;
      }
    y[(b * H + head) * D + d] = from_float<T>(L > 0.f ? A / L : 0.f);
  }
}

int64_t chunks_of(int64_t key_len) {
  return (key_len + kDecodeChunk - 1) / kDecodeChunk;
}

template <typename T>
struct Args {
  const T* q;
  const T* cache_k;
  const T* cache_v;
  const int64_t* pos;
  T* y;
  float* workspace;
  int64_t B, H, Hkv, D, capacity, key_len, window;
  float scale;
  int64_t chunks;
  cudaStream_t stream;
};

template <typename T, int VEC>
int launch(const Args<T>& a) {
  const dim3 grid(unsigned(a.chunks), unsigned(a.Hkv), unsigned(a.B));
  const int chunked = launch_dependent(
      decode_chunk_kernel<T, VEC>,
      grid,
      dim3(kWarps * kWarp),
      a.stream,
      a.q,
      a.cache_k,
      a.cache_v,
      a.pos,
      a.y,
      a.workspace,
      a.H,
      a.Hkv,
      a.capacity,
      a.key_len,
      a.window,
      a.scale);
  if (chunked != 0 || a.chunks == 1)
    return chunked;
  const dim3 heads(unsigned(a.H), unsigned(a.B));
  return launch_dependent(
      decode_combine_kernel<T>,
      heads,
      dim3(unsigned(a.D)),
      a.stream,
      a.workspace,
      a.y,
      a.H,
      a.D,
      a.chunks);
}

} // namespace

bool decode_attention_supports(int64_t H, int64_t Hkv, int64_t D) {
  return Hkv > 0 && H % Hkv == 0 && H / Hkv <= kMaxGroup && D > 0 &&
      D % kWarp == 0 && D <= kMaxDim;
}

int64_t decode_attention_workspace(
    int64_t B,
    int64_t H,
    int64_t key_len,
    int64_t D) {
  const int64_t chunks = chunks_of(key_len);
  return chunks > 1 ? B * H * chunks * (D + 2) : 0;
}

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
    void* stream) {
  if (B == 0 || key_len <= 0)
    return 0;
  if (!decode_attention_supports(H, Hkv, D))
    return int(cudaErrorInvalidValue);
  const int64_t chunks = chunks_of(key_len);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const Args<T> args{
        static_cast<const T*>(q),
        static_cast<const T*>(cache_k),
        static_cast<const T*>(cache_v),
        pos,
        static_cast<T*>(y),
        workspace,
        B,
        H,
        Hkv,
        D,
        capacity,
        key_len,
        window,
        scale,
        chunks,
        cudaStream_t(stream)};
    switch (D / kWarp) {
      case 1:
        return launch<T, 1>(args);
      case 2:
        return launch<T, 2>(args);
      case 3:
        return launch<T, 3>(args);
      case 4:
        return launch<T, 4>(args);
      case 5:
        return launch<T, 5>(args);
      case 6:
        return launch<T, 6>(args);
      case 7:
        return launch<T, 7>(args);
      case 8:
        return launch<T, 8>(args);
    }
    return int(cudaErrorInvalidValue);
  });
}

} // namespace orchard::ops::cuda
