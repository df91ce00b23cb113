// One row times a dense matrix (plain definition and oracle: at::mm /
// at::addmm, in ops::linear of src/ops/linear.cpp). Decoding's products
// have one row per sequence: they only stream the matrix once, and the
// whole question is how close to the memory bus that stream runs and how
// few kernels stand between two of them.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4; // 16-byte loads of W a lane keeps in flight
// (8 or 16, and 4 or 8 loaded one round ahead, were slower on an H100:
// fewer warps fit an SM; bench/RESULTS.md, 2026-11-27 (night)).

// Part `part` of `parts` of the warp's dot product of x with the row wr
// (pieces of 16 bytes): lane l of part j reads pieces 32 j + l, then every
// 32 * parts further, kUnroll at a time. The first pieces are loaded
// before the previous kernel has finished (launch_dependent): they are the
// weights, not its results.
template <typename T>
__device__ float row_dot(
    const T* x,
    const uint4* wr,
    int64_t pieces,
    int part,
    int parts) {
  constexpr int kVec = 16 / sizeof(T); // values a piece holds
  const int64_t stride = int64_t(kWarp) * parts;
  const int64_t first = int64_t(kWarp) * part + threadIdx.x % kWarp;
  uint4 wv[kUnroll];
  auto load = [&](int64_t p0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * stride;
      wv[u] = p < pieces ? __ldg(wr + p) : make_uint4(0, 0, 0, 0);
    }
  };
  load(first);
  wait_for_previous_kernels();
  let_next_kernel_start();
  float acc = 0.f;
  for (int64_t p0 = first; p0 < pieces; p0 += stride * kUnroll) {
    if (p0 != first)
      load(p0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * stride;
      if (p >= pieces)
        break;
      float w[kVec], xv[kVec];
      unpack16<T>(wv[u], w);
      unpack16<T>(__ldg(reinterpret_cast<const uint4*>(x) + p), xv);
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        acc += xv[e] * w[e];
    }
  }
  return warp_sum(acc);
}

// `parts` warps per output (1, 2, 4 or 8), each summing its share of the
// row; the block adds the shares in a fixed order. Gated (SwiGLU's
// product): W stacks `out` gate rows over `out` up rows, a block reads
// gate row o and up row out + o together, and writes
// y[o] = T(T(silu(T(gate))) * T(up)), silu_mul's numbers (silu_mul.cu) on
// the two outputs matvec would have written.
template <typename T, bool kGated>
__global__ void matvec_kernel(
    const T* __restrict__ x,
    const T* __restrict__ W,
    const T* __restrict__ bias,
    T* __restrict__ y,
    int64_t out,
    int64_t in,
    int parts) {
  __shared__ float shares[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarp, part = warp % parts;
  const int slots = kWarpsPerBlock / parts; // rows a block reads
  const int slot = warp / parts;
  const int outputs = kGated ? slots / 2 : slots; // outputs a block writes
  const int64_t o = int64_t(blockIdx.x) * outputs + slot % outputs;
  const int64_t row = kGated && slot >= outputs ? out + o : o;
  float s = 0.f;
  if (o < out)
    s = row_dot(
        x,
        reinterpret_cast<const uint4*>(W + row * in),
        in / (16 / sizeof(T)),
        part,
        parts);
  if (parts > 1 || kGated) {
    if (threadIdx.x % kWarp == 0)
      shares[warp] = s;
    __syncthreads();
  }
  if (o >= out || slot >= outputs || part != 0 || threadIdx.x % kWarp != 0)
    return;
  // Part 0's sum, then the other parts' in order (as plain matvec).
  auto total = [&](float sum, int first, int64_t r) {
    for (int j = 1; j < parts; ++j)
      sum += shares[first + j];
    return from_float<T>(bias ? sum + to_float(bias[r]) : sum);
  };
  const T v = total(s, warp, row);
  if constexpr (!kGated) {
    y[o] = v;
  } else {
    const int up = warp + outputs * parts;
    const float g = to_float(v);
    const float u = to_float(total(shares[up], up, out + o));
    const float silu = round_to<T>(g / (1.0f + expf(-g)));
    y[o] = from_float<T>(__fmul_rn(silu, u));
  }
}

// Warps per output: products with few outputs (down and qkv of a 3B
// model) leave an H100's SMs short of warps with one warp a row, each warp
// then streaming a long row one round trip at a time. Split until about
// 8192 warps run (16384 measured the same), while each part keeps 128
// pieces (2 KB) or more. On the H100, the 3B shape's down went from 2.0 to
// 2.5 TB/s, the 0.5B shape's step from 1.363 to 1.308 ms
// (bench/RESULTS.md, 2026-11-27 (night)).
int parts_for(int64_t out, int64_t pieces) {
  constexpr int64_t kTargetWarps = 8192;
  int parts = 1;
  while (parts < kWarpsPerBlock && out * parts < kTargetWarps &&
         pieces / (2 * parts) >= 128)
    parts *= 2;
  return parts;
}

template <bool kGated>
int launch(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream) {
  if (N == 0 || out == 0)
    return 0;
  if (N > kMatvecMaxRows)
    return int(cudaErrorInvalidValue);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kVec = 16 / sizeof(T);
    if (in % kVec != 0)
      return int(cudaErrorInvalidValue);
    // Gated: the parts of the plain product of all 2 * out rows (the same
    // sums), at most 4 so that a block holds a gate row and its up row.
    int parts = parts_for(kGated ? 2 * out : out, in / kVec);
    if (kGated && parts > kWarpsPerBlock / 2)
      parts = kWarpsPerBlock / 2;
    const int outputs = kWarpsPerBlock / parts / (kGated ? 2 : 1);
    return launch_dependent(
        matvec_kernel<T, kGated>,
        dim3(unsigned((out + outputs - 1) / outputs)),
        dim3(kWarpsPerBlock * kWarp),
        cudaStream_t(stream),
        static_cast<const T*>(x),
        static_cast<const T*>(W),
        static_cast<const T*>(bias),
        static_cast<T*>(y),
        out,
        in,
        parts);
  });
}

} // namespace

int matvec(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream) {
  return launch<false>(dtype, x, W, bias, y, N, out, in, stream);
}

int matvec_silu_mul(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t half,
    int64_t in,
    void* stream) {
  return launch<true>(dtype, x, W, bias, y, N, half, in, stream);
}

} // namespace orchard::ops::cuda
