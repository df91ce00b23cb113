// Kernels with a backward for the GPT's training step (plain definitions
// and oracles: src/ops/fused_train.cpp's references): ReLU squared, and
// rotary and QK RMSNorm straight from the stacked q/k/v product. A block's
// residual add with the next norm is residual_norm.cu's.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {

// The GPT's MLP activation and attention inputs (ops/fused_train.h's
// relu_square and rotary_norm_qkv).
namespace {

__device__ inline float relu_keeping_nan(float u) {
  return u > 0.f || u != u ? u : 0.f;
}

template <typename T, int V>
__global__ void relu_square_kernel(
    const T* __restrict__ u,
    T* __restrict__ y,
    int64_t n) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n / V;
       k += int64_t(gridDim.x) * blockDim.x) {
    float v[V];
    load_values<T, V>(u + k * V, v);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float r = relu_keeping_nan(v[e]);
      v[e] = r * r;
    }
    store_values<T, V>(y + k * V, v);
  }
}

template <typename T, int V>
__global__ void relu_square_backward_kernel(
    const T* __restrict__ u,
    const T* __restrict__ dy,
    T* __restrict__ du,
    int64_t n) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n / V;
       k += int64_t(gridDim.x) * blockDim.x) {
    float v[V], d[V];
    load_values<T, V>(u + k * V, v);
    load_values<T, V>(dy + k * V, d);
#pragma unroll
    for (int e = 0; e < V; ++e)
      d[e] = v[e] > 0.f ? 2.f * round_to<T>(d[e] * v[e]) : 0.f;
    store_values<T, V>(du + k * V, d);
  }
}

// Where head h of a token of the stacked product goes: q's heads, then
// k's (their norms' rstd at `at`: q's rows first, then k's), then v's; and
// the token's position in its sequence. In 32-bit arithmetic (64-bit
// division is a long software sequence, and it had the kernels at a third
// of the memory bus): the op sends fewer than 2^31 rows.
struct HeadSlot {
  int kind;       // 0 q, 1 k, 2 v
  int64_t at;     // the row of rstd (q and k)
  int64_t offset; // the head's first value in q, k or v
  int64_t pos;    // the token's position: its row of the tables
  int64_t seq;    // the token's sequence
  int head;       // the head among q's, k's or v's
};

__device__ inline HeadSlot head_slot(
    int64_t row,
    int64_t tokens,
    int H,
    int Hkv,
    int D,
    int64_t T_len) {
  const uint32_t heads = uint32_t(H + 2 * Hkv);
  const uint32_t tok = uint32_t(row) / heads;
  const int h = int(uint32_t(row) - tok * heads);
  const uint32_t seq = tok / uint32_t(T_len);
  const int64_t pos = int64_t(tok - seq * uint32_t(T_len));
  if (h < H)
    return {0, int64_t(tok) * H + h, (int64_t(tok) * H + h) * D, pos, seq, h};
  if (h < H + Hkv)
    return {
        1,
        tokens * H + int64_t(tok) * Hkv + (h - H),
        (int64_t(tok) * Hkv + h - H) * D,
        pos,
        seq,
        h - H};
  return {
      2,
      -1,
      (int64_t(tok) * Hkv + h - H - Hkv) * D,
      pos,
      seq,
      h - H - Hkv};
}

// The first value of the slot's head in a gradient laid out as `at` says.
template <typename T>
__device__ inline const T* grad_head(
    const T* dq,
    const T* dk,
    const T* dv,
    const HeadStrides& dq_at,
    const HeadStrides& dk_at,
    const HeadStrides& dv_at,
    const HeadSlot& slot) {
  const HeadStrides& at =
      slot.kind == 0 ? dq_at : slot.kind == 1 ? dk_at : dv_at;
  const T* base = slot.kind == 0 ? dq : slot.kind == 1 ? dk : dv;
  return base + slot.seq * at.batch + slot.pos * at.position +
      int64_t(slot.head) * at.head;
}

// The sum over each aligned group of G lanes (G a power of two), in every
// lane of the group; every lane of the warp calls it.
template <int G>
__device__ inline float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A head's rotation in place, o1 = T(T(x1 c) + T(x2 s)) and
// o2 = T(T(x2 c) - T(x1 s)), over a lane's N values of each half; returns
// the lane's part of the sum of squares.
template <typename T, int N>
__device__ inline float rotate_values(
    float (&x1)[N],
    float (&x2)[N],
    const float (&c)[N],
    const float (&s)[N]) {
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float o1 =
        round_to<T>(round_to<T>(x1[e] * c[e]) + round_to<T>(x2[e] * s[e]));
    const float o2 =
        round_to<T>(round_to<T>(x2[e] * c[e]) - round_to<T>(x1[e] * s[e]));
    x1[e] = o1;
    x2[e] = o2;
    ss += o1 * o1 + o2 * o2;
  }
  return ss;
}

// The norm's gradient, do = T(r (dy - y mean)), rotated back in place:
// dx1 = T(T(do1 c) - T(do2 s)), dx2 = T(T(do1 s) + T(do2 c)).
template <typename T, int N>
__device__ inline void unrotate_norm_gradient(
    float (&d1)[N],
    float (&d2)[N],
    const float (&y1)[N],
    const float (&y2)[N],
    float mean,
    float r,
    const float (&c)[N],
    const float (&s)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float o1 = round_to<T>(r * (d1[e] - y1[e] * mean));
    const float o2 = round_to<T>(r * (d2[e] - y2[e] * mean));
    d1[e] = round_to<T>(o1 * c[e]) - round_to<T>(o2 * s[e]);
    d2[e] = round_to<T>(o1 * s[e]) + round_to<T>(o2 * c[e]);
  }
}

// Groups of G = D / (2 V) lanes a q or k head row, V = 16 / sizeof(T):
// lane j of a group loads x1[jV .. jV+V) and x2 at the same offsets of the
// second half, 16 bytes each, so the rotation needs no exchange between
// lanes; a warp takes 32 / G rows at once. Only q's and k's rows: v is
// the caller's view of the product. (The kernel below, 4-byte loads of a
// whole row a warp, reached ~40 % of an H200's bandwidth at D = 128.)
template <typename T, int G>
__global__ void rotary_norm_qk_groups_kernel(
    const T* __restrict__ qkv,
    const T* __restrict__ cos,
    const T* __restrict__ sin,
    T* __restrict__ q,
    T* __restrict__ k,
    float* __restrict__ rstd,
    int64_t tokens,
    int64_t T_len,
    int H,
    int Hkv,
    float eps) {
  constexpr int V = 16 / sizeof(T), half = G * V, D = 2 * half;
  constexpr int R = kWarp / G; // rows a warp at once
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp, i = (lane % G) * V;
  const uint32_t qk = uint32_t(H + Hkv), heads = uint32_t(H + 2 * Hkv);
  const int64_t rows = tokens * qk;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t first =
           (int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp) * R;
       first < rows;
       first += warps * R) {
    const int64_t row = first + lane / G;
    const bool on = row < rows;
    const uint32_t tok = on ? uint32_t(row) / qk : 0;
    const int h = on ? int(uint32_t(row) - tok * qk) : 0;
    const int64_t pos = tok % uint32_t(T_len);
    float x1[V] = {}, x2[V] = {}, c[V] = {}, s[V] = {};
    if (on) {
      const T* in = qkv + (int64_t(tok) * heads + h) * D;
      load_values<T, V>(in + i, x1);
      load_values<T, V>(in + half + i, x2);
      load_values<T, V>(cos + pos * half + i, c);
      load_values<T, V>(sin + pos * half + i, s);
    }
    const float ss = rotate_values<T, V>(x1, x2, c, s);
    const float r = rsqrtf(group_sum<G>(ss) / float(D) + eps);
    if (!on)
      continue;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      x1[e] *= r;
      x2[e] *= r;
    }
    const bool is_q = h < H;
    const int64_t at = is_q ? int64_t(tok) * H + h
                            : tokens * H + int64_t(tok) * Hkv + (h - H);
    T* out = is_q ? q + (int64_t(tok) * H + h) * D
                  : k + (int64_t(tok) * Hkv + (h - H)) * D;
    store_values<T, V>(out + i, x1);
    store_values<T, V>(out + half + i, x2);
    if (i == 0)
      rstd[at] = r;
  }
}

// Its gradient the same way: a group of lanes a head row of dqkv (v's rows
// copied), the gradients read where attention left them.
template <typename T, int G>
__global__ void rotary_norm_qkv_groups_backward_kernel(
    const T* __restrict__ dq,
    const T* __restrict__ dk,
    const T* __restrict__ dv,
    HeadStrides dq_at,
    HeadStrides dk_at,
    HeadStrides dv_at,
    const T* __restrict__ q,
    const T* __restrict__ k,
    const float* __restrict__ rstd,
    const T* __restrict__ cos,
    const T* __restrict__ sin,
    T* __restrict__ dqkv,
    int64_t tokens,
    int64_t T_len,
    int H,
    int Hkv) {
  constexpr int V = 16 / sizeof(T), half = G * V, D = 2 * half;
  constexpr int R = kWarp / G;
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp, i = (lane % G) * V;
  const int64_t rows = tokens * (H + 2 * Hkv);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t first =
           (int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp) * R;
       first < rows;
       first += warps * R) {
    const int64_t row = first + lane / G;
    const bool on = row < rows;
    const HeadSlot slot = head_slot(on ? row : 0, tokens, H, Hkv, D, T_len);
    const bool rotated = on && slot.kind != 2;
    float d1[V] = {}, d2[V] = {}, y1[V] = {}, y2[V] = {};
    if (on) {
      const T* dy = grad_head(dq, dk, dv, dq_at, dk_at, dv_at, slot);
      load_values<T, V>(dy + i, d1);
      load_values<T, V>(dy + half + i, d2);
    }
    if (rotated) {
      const T* y = (slot.kind == 0 ? q : k) + slot.offset;
      load_values<T, V>(y + i, y1);
      load_values<T, V>(y + half + i, y2);
    }
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < V; ++e)
      dot += d1[e] * y1[e] + d2[e] * y2[e];
    const float mean = group_sum<G>(dot) / float(D);
    if (!on)
      continue;
    T* out = dqkv + row * D;
    if (!rotated) {
      store_values<T, V>(out + i, d1);
      store_values<T, V>(out + half + i, d2);
      continue;
    }
    // The tables and rstd after the sum: loaded before it, with the rest,
    // the kernel took 1.07 ms a d12 step against 0.90 (H200).
    const float r = rstd[slot.at];
    float c[V], s[V];
    load_values<T, V>(cos + slot.pos * half + i, c);
    load_values<T, V>(sin + slot.pos * half + i, s);
    unrotate_norm_gradient<T, V>(d1, d2, y1, y2, mean, r, c, s);
    store_values<T, V>(out + i, d1);
    store_values<T, V>(out + half + i, d2);
  }
}

// One warp a head row of D = 64 P values: lane l holds x1[lP .. lP+P) and
// x2 at the same offsets of the second half.
template <typename T, int P>
__global__ void rotary_norm_qkv_kernel(
    const T* __restrict__ qkv,
    const T* __restrict__ cos,
    const T* __restrict__ sin,
    T* __restrict__ q,
    T* __restrict__ k,
    T* __restrict__ v,
    float* __restrict__ rstd,
    int64_t tokens,
    int64_t T_len,
    int H,
    int Hkv,
    float eps) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  constexpr int half = kWarp * P, D = 2 * half;
  const int i = (threadIdx.x % kWarp) * P;
  each_warp_row(tokens * (H + 2 * Hkv), [&](int64_t row) {
    const HeadSlot slot = head_slot(row, tokens, H, Hkv, D, T_len);
    if (slot.kind == 2 && !v)
      return;
    float x1[P], x2[P];
    load_values<T, P>(qkv + row * D + i, x1);
    load_values<T, P>(qkv + row * D + half + i, x2);
    T* out = (slot.kind == 0 ? q : slot.kind == 1 ? k : v) + slot.offset;
    if (slot.kind == 2) { // v: as it is
      store_values<T, P>(out + i, x1);
      store_values<T, P>(out + half + i, x2);
      return;
    }
    float c[P], s[P];
    load_values<T, P>(cos + slot.pos * half + i, c);
    load_values<T, P>(sin + slot.pos * half + i, s);
    const float ss = rotate_values<T, P>(x1, x2, c, s);
    const float r = rsqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      x1[e] *= r;
      x2[e] *= r;
    }
    store_values<T, P>(out + i, x1);
    store_values<T, P>(out + half + i, x2);
    if (i == 0)
      rstd[slot.at] = r;
  });
}

template <typename T, int P>
__global__ void rotary_norm_qkv_backward_kernel(
    const T* __restrict__ dq,
    const T* __restrict__ dk,
    const T* __restrict__ dv,
    HeadStrides dq_at,
    HeadStrides dk_at,
    HeadStrides dv_at,
    const T* __restrict__ q,
    const T* __restrict__ k,
    const float* __restrict__ rstd,
    const T* __restrict__ cos,
    const T* __restrict__ sin,
    T* __restrict__ dqkv,
    int64_t tokens,
    int64_t T_len,
    int H,
    int Hkv) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  constexpr int half = kWarp * P, D = 2 * half;
  const int i = (threadIdx.x % kWarp) * P;
  each_warp_row(tokens * (H + 2 * Hkv), [&](int64_t row) {
    const HeadSlot slot = head_slot(row, tokens, H, Hkv, D, T_len);
    T* out = dqkv + row * D;
    const T* dy = grad_head(dq, dk, dv, dq_at, dk_at, dv_at, slot);
    float d1[P], d2[P];
    load_values<T, P>(dy + i, d1);
    load_values<T, P>(dy + half + i, d2);
    if (slot.kind == 2) {
      store_values<T, P>(out + i, d1);
      store_values<T, P>(out + half + i, d2);
      return;
    }
    const T* y = (slot.kind == 0 ? q : k) + slot.offset;
    float y1[P], y2[P];
    load_values<T, P>(y + i, y1);
    load_values<T, P>(y + half + i, y2);
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < P; ++e)
      dot += d1[e] * y1[e] + d2[e] * y2[e];
    const float mean = warp_sum(dot) / float(D), r = rstd[slot.at];
    float c[P], s[P];
    load_values<T, P>(cos + slot.pos * half + i, c);
    load_values<T, P>(sin + slot.pos * half + i, s);
    unrotate_norm_gradient<T, P>(d1, d2, y1, y2, mean, r, c, s);
    store_values<T, P>(out + i, d1);
    store_values<T, P>(out + half + i, d2);
  });
}

} // namespace

int relu_square(Dtype dtype, const void* u, void* y, int64_t n, void* stream) {
  if (n == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const auto s = cudaStream_t(stream);
    const T* in = static_cast<const T*>(u);
    T* out = static_cast<T*>(y);
    if (n % V == 0 && aligned16<T>(u) && aligned16<T>(y))
      return launch_dependent(
          relu_square_kernel<T, V>, dim3(blocks_for(n / V)), dim3(kThreads),
          s, in, out, n);
    return launch_dependent(
        relu_square_kernel<T, 1>, dim3(blocks_for(n)), dim3(kThreads), s, in,
        out, n);
  });
}

int relu_square_backward(
    Dtype dtype,
    const void* u,
    const void* dy,
    void* du,
    int64_t n,
    void* stream) {
  if (n == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const auto s = cudaStream_t(stream);
    const T* in = static_cast<const T*>(u);
    const T* d = static_cast<const T*>(dy);
    T* out = static_cast<T*>(du);
    if (n % V == 0 && aligned16<T>(u) && aligned16<T>(dy) && aligned16<T>(du))
      return launch_dependent(
          relu_square_backward_kernel<T, V>, dim3(blocks_for(n / V)),
          dim3(kThreads), s, in, d, out, n);
    return launch_dependent(
        relu_square_backward_kernel<T, 1>, dim3(blocks_for(n)),
        dim3(kThreads), s, in, d, out, n);
  });
}

bool rotary_norm_qkv_supports(int64_t D) {
  return D % 64 == 0 && D >= 64 && D <= 256;
}

namespace {

// The kernels index rows in 32 bits (head_slot).
bool rows_fit(int64_t tokens, int64_t H, int64_t Hkv) {
  return tokens * (H + 2 * Hkv) < (int64_t(1) << 31);
}

} // namespace

namespace {

// f(std::integral_constant<int, P>{}) for D = 64 P.
template <typename F>
int by_half(int64_t D, F&& f) {
  switch (D / 64) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
  }
  return int(cudaErrorInvalidValue);
}

// f(std::integral_constant<int, G>{}) where a head of D values of T splits
// into groups of G = D / (2 V) lanes of V = 16 / sizeof(T) values a half
// (G 4 to 32: D 64 to 256 in 16-bit types, 128 and 256 in float32), else
// f(std::integral_constant<int, 0>{}): a warp a row.
template <typename T, typename F>
int by_group(int64_t D, F&& f) {
  constexpr int64_t V = 16 / sizeof(T);
  switch (D / (2 * V) * (D % (2 * V) == 0 ? 1 : 0)) {
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
  }
  return f(std::integral_constant<int, 0>{});
}

} // namespace

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
    void* stream) {
  if (!rotary_norm_qkv_supports(D) || T < 1 || !rows_fit(tokens, H, Hkv))
    return int(cudaErrorInvalidValue);
  if (tokens == 0)
    return 0;
  const int64_t rows = tokens * (H + 2 * Hkv);
  return dispatch(dtype, [&](auto zero) {
    using E = decltype(zero);
    const int grouped = by_group<E>(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      if constexpr (G > 0) {
        if (v) // the groups leave v to the caller's view
          return -1;
        const int64_t qk_rows = tokens * (H + Hkv);
        return launch_dependent(
            rotary_norm_qk_groups_kernel<E, G>,
            dim3(row_blocks((qk_rows + kWarp / G - 1) / (kWarp / G))),
            dim3(kThreads), cudaStream_t(stream), static_cast<const E*>(qkv),
            static_cast<const E*>(cos), static_cast<const E*>(sin),
            static_cast<E*>(q), static_cast<E*>(k), rstd, tokens, T, int(H),
            int(Hkv), eps);
      }
      return -1;
    });
    if (grouped >= 0)
      return grouped;
    return by_half(D, [&](auto p) {
      constexpr int P = decltype(p)::value;
      return launch_dependent(
          rotary_norm_qkv_kernel<E, P>, dim3(row_blocks(rows)),
          dim3(kThreads), cudaStream_t(stream), static_cast<const E*>(qkv),
          static_cast<const E*>(cos), static_cast<const E*>(sin),
          static_cast<E*>(q), static_cast<E*>(k), static_cast<E*>(v), rstd,
          tokens, T, int(H), int(Hkv), eps);
    });
  });
}

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
    void* stream) {
  if (!rotary_norm_qkv_supports(D) || T < 1 || !rows_fit(tokens, H, Hkv))
    return int(cudaErrorInvalidValue);
  if (tokens == 0)
    return 0;
  const int64_t rows = tokens * (H + 2 * Hkv);
  return dispatch(dtype, [&](auto zero) {
    using E = decltype(zero);
    const int grouped = by_group<E>(D, [&](auto g) {
      constexpr int G = decltype(g)::value;
      if constexpr (G > 0)
        return launch_dependent(
            rotary_norm_qkv_groups_backward_kernel<E, G>,
            dim3(row_blocks((rows + kWarp / G - 1) / (kWarp / G))),
            dim3(kThreads), cudaStream_t(stream), static_cast<const E*>(dq),
            static_cast<const E*>(dk), static_cast<const E*>(dv), dq_at,
            dk_at, dv_at, static_cast<const E*>(q),
            static_cast<const E*>(k), rstd, static_cast<const E*>(cos),
            static_cast<const E*>(sin), static_cast<E*>(dqkv), tokens, T,
            int(H), int(Hkv));
      return -1;
    });
    if (grouped >= 0)
      return grouped;
    return by_half(D, [&](auto p) {
      constexpr int P = decltype(p)::value;
      return launch_dependent(
          rotary_norm_qkv_backward_kernel<E, P>,
          dim3(row_blocks(rows)), dim3(kThreads),
          cudaStream_t(stream), static_cast<const E*>(dq),
          static_cast<const E*>(dk), static_cast<const E*>(dv), dq_at,
          dk_at, dv_at, static_cast<const E*>(q), static_cast<const E*>(k), rstd,
          static_cast<const E*>(cos), static_cast<const E*>(sin),
          static_cast<E*>(dqkv), tokens, T, int(H), int(Hkv));
    });
  });
}

} // namespace orchard::ops::cuda
