// Kernels with a backward, for training (plain definitions and oracles:
// src/ops/fused_train.cpp's references): SwiGLU's silu(gate) * up read
// from the two halves of one product, and a residual add followed by an
// unscaled RMSNorm over any one dimension (the tiny recursive model's
// post-norm, over features or, in its MLP-across-positions block, over
// positions). The plain compositions are 2 and 7 kernels forward and 5 and
// 9 backward, each a pass over tensors of hundreds of megabytes.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

__device__ inline float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// gu: (outer, 2, inner), y: (outer, inner); V values a thread.
template <typename T, int V>
__global__ void silu_mul_halves_kernel(
    const T* __restrict__ gu,
    T* __restrict__ y,
    int64_t outer,
    int64_t inner) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t per_row = inner / V, total = outer * per_row;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = k / per_row, i = (k % per_row) * V;
    float g[V], u[V], out[V];
    load_values<T, V>(gu + o * 2 * inner + i, g);
    load_values<T, V>(gu + o * 2 * inner + inner + i, u);
#pragma unroll
    for (int e = 0; e < V; ++e)
      out[e] = __fmul_rn(round_to<T>(g[e] * sigmoid(g[e])), u[e]);
    store_values<T, V>(y + o * inner + i, out);
  }
}

// The gradient of silu_mul_halves as PyTorch's ops compute it: s = T(silu(g)),
// du = T(dy * s), ds = T(dy * u), dg = T(ds * silu'(g)).
template <typename T, int V>
__global__ void silu_mul_halves_backward_kernel(
    const T* __restrict__ gu,
    const T* __restrict__ dy,
    T* __restrict__ dgu,
    int64_t outer,
    int64_t inner) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t per_row = inner / V, total = outer * per_row;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = k / per_row, i = (k % per_row) * V;
    float g[V], u[V], d[V], dg[V], du[V];
    load_values<T, V>(gu + o * 2 * inner + i, g);
    load_values<T, V>(gu + o * 2 * inner + inner + i, u);
    load_values<T, V>(dy + o * inner + i, d);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float sg = sigmoid(g[e]);
      const float s = round_to<T>(g[e] * sg);
      du[e] = __fmul_rn(d[e], s);
      const float ds = round_to<T>(__fmul_rn(d[e], u[e]));
      dg[e] = ds * (sg * (1.0f + g[e] * (1.0f - sg)));
    }
    store_values<T, V>(dgu + o * 2 * inner + i, dg);
    store_values<T, V>(dgu + o * 2 * inner + inner + i, du);
  }
}

// Norm over the middle dimension of (outer, N, inner), inner > 1: one
// thread a column (o, i), reading down it; a warp reads 32 neighbouring
// columns, so every row access is coalesced. s = T(a + b) goes to y on the
// way down, then y = T(s * rstd) on a second pass.
template <typename T>
__global__ void add_norm_columns_kernel(
    const T* __restrict__ a,
    const T* __restrict__ b,
    T* __restrict__ y,
    float* __restrict__ rstd,
    int64_t outer,
    int64_t N,
    int64_t inner,
    float count,
    float eps) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t total = outer * inner;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (k / inner) * N * inner + k % inner;
    float ss = 0.f;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t at = base + n * inner;
      const float s = round_to<T>(to_float(a[at]) + to_float(b[at]));
      ss += s * s;
      y[at] = from_float<T>(s);
    }
    const float r = rsqrtf(ss / count + eps);
    rstd[k] = r;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t at = base + n * inner;
      y[at] = from_float<T>(to_float(y[at]) * r);
    }
  }
}

// The same for N <= kTileRows * kTilePer (the position mixer's 104): a
// block of kTileRows x 32 threads takes 32 * C neighbouring columns of one
// o, C columns a thread (one 2C-byte load for bfloat16 and C = 2, so a
// warp reads 128 contiguous bytes a row); each thread keeps its rows' sums
// in registers, so the tensors are read once and written once.
constexpr int kTileCols = 32, kTileRows = 8, kTilePer = 16;

template <typename T, int C>
struct alignas(C * sizeof(T)) Group {
  T v[C];
};

template <typename T, int C>
__device__ inline void load_group(const T* p, float (&out)[C]) {
  const auto g = *reinterpret_cast<const Group<T, C>*>(p);
#pragma unroll
  for (int c = 0; c < C; ++c)
    out[c] = to_float(g.v[c]);
}

template <typename T, int C>
__device__ inline void store_group(T* p, const float (&in)[C]) {
  Group<T, C> g;
#pragma unroll
  for (int c = 0; c < C; ++c)
    g.v[c] = from_float<T>(in[c]);
  *reinterpret_cast<Group<T, C>*>(p) = g;
}

// The block's column sums of each thread's C partial sums (all threads
// get their columns' totals).
template <int C>
__device__ inline void column_totals(float (&v)[C]) {
  __shared__ float part[kTileRows][kTileCols * C];
  const int x = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int c = 0; c < C; ++c)
    part[ty][x * C + c] = v[c];
  __syncthreads();
#pragma unroll
  for (int c = 0; c < C; ++c) {
    v[c] = 0.f;
#pragma unroll
    for (int k = 0; k < kTileRows; ++k)
      v[c] += part[k][x * C + c];
  }
}

template <typename T, int C>
__global__ void add_norm_tiles_kernel(
    const T* __restrict__ a,
    const T* __restrict__ b,
    T* __restrict__ y,
    float* __restrict__ rstd,
    int64_t N,
    int64_t inner,
    float count,
    float eps) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t tiles = (inner + kTileCols * C - 1) / (kTileCols * C);
  const int64_t o = blockIdx.x / tiles;
  const int64_t col =
      (blockIdx.x % tiles) * kTileCols * C + int64_t(threadIdx.x) * C;
  const bool live = col < inner;
  const int64_t base = o * N * inner + col;
  float v[kTilePer][C];
  float ss[C] = {};
#pragma unroll
  for (int k = 0; k < kTilePer; ++k) {
    const int64_t n = threadIdx.y + int64_t(k) * kTileRows;
#pragma unroll
    for (int c = 0; c < C; ++c)
      v[k][c] = 0.f;
    if (live && n < N) {
      float fa[C], fb[C];
      load_group<T, C>(a + base + n * inner, fa);
      load_group<T, C>(b + base + n * inner, fb);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        v[k][c] = round_to<T>(fa[c] + fb[c]);
        ss[c] += v[k][c] * v[k][c];
      }
    }
  }
  column_totals<C>(ss);
  if (!live)
    return;
  float r[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    r[c] = rsqrtf(ss[c] / count + eps);
    if (threadIdx.y == 0)
      rstd[o * inner + col + c] = r[c];
  }
#pragma unroll
  for (int k = 0; k < kTilePer; ++k) {
    const int64_t n = threadIdx.y + int64_t(k) * kTileRows;
    if (n < N) {
      float out[C];
#pragma unroll
      for (int c = 0; c < C; ++c)
        out[c] = v[k][c] * r[c];
      store_group<T, C>(y + base + n * inner, out);
    }
  }
}

template <typename T, int C>
__global__ void norm_tiles_backward_kernel(
    const T* __restrict__ dy,
    const T* __restrict__ y,
    const float* __restrict__ rstd,
    T* __restrict__ dx,
    int64_t N,
    int64_t inner,
    float count) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t tiles = (inner + kTileCols * C - 1) / (kTileCols * C);
  const int64_t o = blockIdx.x / tiles;
  const int64_t col =
      (blockIdx.x % tiles) * kTileCols * C + int64_t(threadIdx.x) * C;
  const bool live = col < inner;
  const int64_t base = o * N * inner + col;
  float d[kTilePer][C], v[kTilePer][C];
  float dot[C] = {};
#pragma unroll
  for (int k = 0; k < kTilePer; ++k) {
    const int64_t n = threadIdx.y + int64_t(k) * kTileRows;
#pragma unroll
    for (int c = 0; c < C; ++c)
      d[k][c] = v[k][c] = 0.f;
    if (live && n < N) {
      load_group<T, C>(dy + base + n * inner, d[k]);
      load_group<T, C>(y + base + n * inner, v[k]);
#pragma unroll
      for (int c = 0; c < C; ++c)
        dot[c] += d[k][c] * v[k][c];
    }
  }
  column_totals<C>(dot);
  if (!live)
    return;
#pragma unroll
  for (int k = 0; k < kTilePer; ++k) {
    const int64_t n = threadIdx.y + int64_t(k) * kTileRows;
    if (n < N) {
      float out[C];
#pragma unroll
      for (int c = 0; c < C; ++c)
        out[c] = rstd[o * inner + col + c] *
            (d[k][c] - v[k][c] * (dot[c] / count));
      store_group<T, C>(dx + base + n * inner, out);
    }
  }
}

// Launches tiles<T, 2> where every column pair is aligned, else tiles<T, 1>;
// false where N is too long for a tile (or the grid too large).
template <typename T, typename K2, typename K1, typename... Args>
bool launch_tiles(
    int& err,
    K2 kernel2,
    K1 kernel1,
    int64_t outer,
    int64_t N,
    int64_t inner,
    bool pairs_aligned,
    cudaStream_t stream,
    Args... args) {
  if (N > kTileRows * kTilePer)
    return false;
  const int C = pairs_aligned && inner % 2 == 0 ? 2 : 1;
  const int64_t blocks =
      outer * ((inner + kTileCols * C - 1) / (kTileCols * C));
  if (blocks >= (int64_t(1) << 31))
    return false;
  const dim3 grid{unsigned(blocks)}, block{kTileCols, kTileRows};
  err = C == 2 ? launch_dependent(kernel2, grid, block, stream, args...)
               : launch_dependent(kernel1, grid, block, stream, args...);
  return true;
}

// Norm over contiguous rows of N (inner == 1): one warp a row.
template <typename T>
__global__ void add_norm_rows_kernel(
    const T* __restrict__ a,
    const T* __restrict__ b,
    T* __restrict__ y,
    float* __restrict__ rstd,
    int64_t rows,
    int64_t N,
    float count,
    float eps) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp;
  each_warp_row(rows, [&](int64_t row) {
    const int64_t base = row * N;
    float ss = 0.f;
    for (int64_t n = lane; n < N; n += kWarp) {
      const float s = round_to<T>(to_float(a[base + n]) + to_float(b[base + n]));
      ss += s * s;
      y[base + n] = from_float<T>(s);
    }
    const float r = rsqrtf(warp_sum(ss) / count + eps);
    if (lane == 0)
      rstd[row] = r;
    for (int64_t n = lane; n < N; n += kWarp)
      y[base + n] = from_float<T>(to_float(y[base + n]) * r);
  });
}

// With x = y / rstd along the dimension: dx = rstd * (dy - y * sum(dy * y) / count).
template <typename T>
__global__ void norm_columns_backward_kernel(
    const T* __restrict__ dy,
    const T* __restrict__ y,
    const float* __restrict__ rstd,
    T* __restrict__ dx,
    int64_t outer,
    int64_t N,
    int64_t inner,
    float count) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int64_t total = outer * inner;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (k / inner) * N * inner + k % inner;
    float dot = 0.f;
    for (int64_t n = 0; n < N; ++n)
      dot += to_float(dy[base + n * inner]) * to_float(y[base + n * inner]);
    const float r = rstd[k], c = dot / count;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t at = base + n * inner;
      dx[at] = from_float<T>(r * (to_float(dy[at]) - to_float(y[at]) * c));
    }
  }
}

template <typename T>
__global__ void norm_rows_backward_kernel(
    const T* __restrict__ dy,
    const T* __restrict__ y,
    const float* __restrict__ rstd,
    T* __restrict__ dx,
    int64_t rows,
    int64_t N,
    float count) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp;
  each_warp_row(rows, [&](int64_t row) {
    const int64_t base = row * N;
    float dot = 0.f;
    for (int64_t n = lane; n < N; n += kWarp)
      dot += to_float(dy[base + n]) * to_float(y[base + n]);
    const float r = rstd[row], c = warp_sum(dot) / count;
    for (int64_t n = lane; n < N; n += kWarp)
      dx[base + n] =
          from_float<T>(r * (to_float(dy[base + n]) - to_float(y[base + n]) * c));
  });
}


} // namespace

int silu_mul_halves(
    Dtype dtype,
    const void* gu,
    void* y,
    int64_t outer,
    int64_t inner,
    void* stream) {
  if (outer == 0 || inner == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const auto s = cudaStream_t(stream);
    const T* in = static_cast<const T*>(gu);
    T* out = static_cast<T*>(y);
    if (inner % V == 0 && aligned16<T>(gu) && aligned16<T>(y))
      return launch_dependent(
          silu_mul_halves_kernel<T, V>, dim3(blocks_for(outer * inner / V)),
          dim3(kThreads), s, in, out, outer, inner);
    return launch_dependent(
        silu_mul_halves_kernel<T, 1>, dim3(blocks_for(outer * inner)),
        dim3(kThreads), s, in, out, outer, inner);
  });
}

int silu_mul_halves_backward(
    Dtype dtype,
    const void* gu,
    const void* dy,
    void* dgu,
    int64_t outer,
    int64_t inner,
    void* stream) {
  if (outer == 0 || inner == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int V = 16 / sizeof(T);
    const auto s = cudaStream_t(stream);
    const T* g = static_cast<const T*>(gu);
    const T* d = static_cast<const T*>(dy);
    T* out = static_cast<T*>(dgu);
    if (inner % V == 0 && aligned16<T>(gu) && aligned16<T>(dy) &&
        aligned16<T>(dgu))
      return launch_dependent(
          silu_mul_halves_backward_kernel<T, V>,
          dim3(blocks_for(outer * inner / V)), dim3(kThreads), s, g, d, out,
          outer, inner);
    return launch_dependent(
        silu_mul_halves_backward_kernel<T, 1>, dim3(blocks_for(outer * inner)),
        dim3(kThreads), s, g, d, out, outer, inner);
  });
}

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
    void* stream) {
  if (outer == 0 || N == 0 || inner == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const auto s = cudaStream_t(stream);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* py = static_cast<T*>(y);
    if (inner == 1)
      return launch_dependent(
          add_norm_rows_kernel<T>, dim3(blocks_for(outer * kWarp)),
          dim3(kThreads), s, pa, pb, py, rstd, outer, N, float(count), eps);
    int err = 0;
    const bool aligned = aligned_to(a, 2 * sizeof(T)) &&
        aligned_to(b, 2 * sizeof(T)) && aligned_to(y, 2 * sizeof(T));
    if (launch_tiles<T>(
            err, add_norm_tiles_kernel<T, 2>, add_norm_tiles_kernel<T, 1>,
            outer, N, inner, aligned, s, pa, pb, py, rstd, N, inner,
            float(count), eps))
      return err;
    return launch_dependent(
        add_norm_columns_kernel<T>, dim3(blocks_for(outer * inner)),
        dim3(kThreads), s, pa, pb, py, rstd, outer, N, inner, float(count),
        eps);
  });
}

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
    void* stream) {
  if (outer == 0 || N == 0 || inner == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const auto s = cudaStream_t(stream);
    const T* pd = static_cast<const T*>(dy);
    const T* py = static_cast<const T*>(y);
    T* px = static_cast<T*>(dx);
    if (inner == 1)
      return launch_dependent(
          norm_rows_backward_kernel<T>, dim3(blocks_for(outer * kWarp)),
          dim3(kThreads), s, pd, py, rstd, px, outer, N, float(count));
    int err = 0;
    const bool aligned = aligned_to(dy, 2 * sizeof(T)) &&
        aligned_to(y, 2 * sizeof(T)) && aligned_to(dx, 2 * sizeof(T));
    if (launch_tiles<T>(
            err, norm_tiles_backward_kernel<T, 2>,
            norm_tiles_backward_kernel<T, 1>, outer, N, inner, aligned, s, pd,
            py, rstd, px, N, inner, float(count)))
      return err;
    return launch_dependent(
        norm_columns_backward_kernel<T>, dim3(blocks_for(outer * inner)),
        dim3(kThreads), s, pd, py, rstd, px, outer, N, inner, float(count));
  });
}

} // namespace orchard::ops::cuda
