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

// What a product's kernel reads and writes besides x, W and y. Normed
// input (decoding's norm before qkv and gate/up): x is the residual stream
// s, and the kernel multiplies by rms_norm(s) = T(w * T(s * scale)) with
// scale = rsqrt(sum(squares) / in + eps), the sum of squares handed over
// by the product that wrote s. Residual output (o and down): y is
// s = T(residual + T(product)), and each block writes the sum of its
// outputs' squares to squares_out[block].
template <typename T>
struct Extras {
  const T* norm_w = nullptr;
  const float* squares = nullptr;
  int64_t n_squares = 0;
  float eps = 0.f;
  const T* residual = nullptr;
  float* squares_out = nullptr;
};

// Part `part` of `parts` of the warp's dot product of x with the row wr
// (pieces of 16 bytes): lane l of part j reads pieces 32 j + l, then every
// 32 * parts further, kUnroll at a time. The first pieces are loaded
// (start) before the previous kernel has finished (launch_dependent): they
// are the weights, not its results.
template <typename T>
struct RowDot {
  static constexpr int kVec = 16 / sizeof(T); // values a piece holds
  const uint4* wr;
  int64_t pieces, stride, first;
  uint4 wv[kUnroll];

  __device__ RowDot(const uint4* row, int64_t n, int part, int parts)
      : wr(row),
        pieces(n),
        stride(int64_t(kWarp) * parts),
        first(int64_t(kWarp) * part + threadIdx.x % kWarp) {}

  __device__ void load(int64_t p0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * stride;
      wv[u] = p < pieces ? __ldg(wr + p) : make_uint4(0, 0, 0, 0);
    }
  }

  // The rest, after the wait: x's pieces (normed on the fly with
  // kNormed), the sum over the warp.
  template <bool kNormed>
  __device__ float finish(const T* x, const T* norm_w, float scale) {
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
        if constexpr (kNormed) {
          // rms_norm.cu's numbers: the normed value rounded to T, then
          // the weight's product rounded to T.
          float wn[kVec];
          unpack16<T>(__ldg(reinterpret_cast<const uint4*>(norm_w) + p), wn);
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            xv[e] = round_to<T>(wn[e] * round_to<T>(xv[e] * scale));
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          acc += xv[e] * w[e];
      }
    }
    return warp_sum(acc);
  }
};

// rsqrt(sum(squares) / C + eps), the same in every thread of the block
// (a fixed order of sums: every block of a kernel gets the same value).
__device__ float norm_scale(
    const float* squares,
    int64_t n,
    int64_t C,
    float eps) {
  __shared__ float per_warp[kWarpsPerBlock];
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    v += squares[i];
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0)
    per_warp[threadIdx.x / kWarp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kWarpsPerBlock; ++w)
    total += per_warp[w];
  return rsqrtf(total / float(C) + eps);
}

// `parts` warps per output (1, 2, 4 or 8), each summing its share of the
// row; the block adds the shares in a fixed order. Gated (SwiGLU's
// product): W stacks `out` gate rows over `out` up rows, a block reads
// gate row o and up row out + o together, and writes
// y[o] = T(T(silu(T(gate))) * T(up)), silu_mul's numbers (silu_mul.cu) on
// the two outputs matvec would have written. kNormed, kResidual: Extras.
template <typename T, bool kGated, bool kNormed, bool kResidual>
__global__ void matvec_kernel(
    const T* __restrict__ x,
    const T* __restrict__ W,
    const T* __restrict__ bias,
    T* __restrict__ y,
    int64_t out,
    int64_t in,
    int parts,
    Extras<T> extra) {
  __shared__ float shares[kWarpsPerBlock];
  __shared__ float squares[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarp, part = warp % parts;
  const int slots = kWarpsPerBlock / parts; // rows a block reads
  const int slot = warp / parts;
  const int outputs = kGated ? slots / 2 : slots; // outputs a block writes
  const int64_t o = int64_t(blockIdx.x) * outputs + slot % outputs;
  const int64_t row = kGated && slot >= outputs ? out + o : o;
  RowDot<T> dot(
      reinterpret_cast<const uint4*>(W + row * in),
      in / RowDot<T>::kVec,
      part,
      parts);
  if (o < out)
    dot.load(dot.first);
  wait_for_previous_kernels();
  let_next_kernel_start();
  float scale = 1.f;
  if constexpr (kNormed)
    scale = norm_scale(extra.squares, extra.n_squares, in, extra.eps);
  const float s = o < out ? dot.template finish<kNormed>(x, extra.norm_w, scale) : 0.f;
  if (parts > 1 || kGated) {
    if (threadIdx.x % kWarp == 0)
      shares[warp] = s;
    __syncthreads();
  }
  const bool writer =
      slot < outputs && part == 0 && threadIdx.x % kWarp == 0;
  if (writer && o < out) {
    // Part 0's sum, then the other parts' in order (as plain matvec).
    auto total = [&](float sum, int first, int64_t r) {
      for (int j = 1; j < parts; ++j)
        sum += shares[first + j];
      return from_float<T>(bias ? sum + to_float(bias[r]) : sum);
    };
    const T v = total(s, warp, row);
    if constexpr (kGated) {
      const int up = warp + outputs * parts;
      const float g = to_float(v);
      const float u = to_float(total(shares[up], up, out + o));
      const float silu = round_to<T>(g / (1.0f + expf(-g)));
      y[o] = from_float<T>(__fmul_rn(silu, u));
    } else if constexpr (kResidual) {
      const T sum = from_float<T>(to_float(extra.residual[o]) + to_float(v));
      y[o] = sum;
      squares[slot] = to_float(sum) * to_float(sum);
    } else {
      y[o] = v;
    }
  } else if (kResidual && writer) {
    squares[slot] = 0.f;
  }
  if constexpr (kResidual) {
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.f;
      for (int j = 0; j < outputs; ++j)
        sum += squares[j];
      extra.squares_out[blockIdx.x] = sum;
    }
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

// Outputs a block writes, and the warps it gives each row.
struct Shape {
  int parts, outputs;
};
template <typename T>
Shape shape_of(bool gated, int64_t out, int64_t in) {
  // Gated: the parts of the plain product of all 2 * out rows (the same
  // sums), at most 4 so that a block holds a gate row and its up row.
  int parts = parts_for(gated ? 2 * out : out, in / (16 / sizeof(T)));
  if (gated && parts > kWarpsPerBlock / 2)
    parts = kWarpsPerBlock / 2;
  return {parts, kWarpsPerBlock / parts / (gated ? 2 : 1)};
}

template <bool kGated, bool kNormed, bool kResidual>
int launch(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    const Extras<char>& extra,
    void* stream) {
  if (N == 0 || out == 0)
    return 0;
  if (N > kMatvecMaxRows)
    return int(cudaErrorInvalidValue);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (in % (16 / sizeof(T)) != 0)
      return int(cudaErrorInvalidValue);
    const Shape sh = shape_of<T>(kGated, out, in);
    Extras<T> typed;
    typed.norm_w = reinterpret_cast<const T*>(extra.norm_w);
    typed.squares = extra.squares;
    typed.n_squares = extra.n_squares;
    typed.eps = extra.eps;
    typed.residual = reinterpret_cast<const T*>(extra.residual);
    typed.squares_out = extra.squares_out;
    return launch_dependent(
        matvec_kernel<T, kGated, kNormed, kResidual>,
        dim3(unsigned((out + sh.outputs - 1) / sh.outputs)),
        dim3(kWarpsPerBlock * kWarp),
        cudaStream_t(stream),
        static_cast<const T*>(x),
        static_cast<const T*>(W),
        static_cast<const T*>(bias),
        static_cast<T*>(y),
        out,
        in,
        sh.parts,
        typed);
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
  return launch<false, false, false>(
      dtype, x, W, bias, y, N, out, in, {}, stream);
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
  return launch<true, false, false>(
      dtype, x, W, bias, y, N, half, in, {}, stream);
}

int64_t matvec_residual_squares(Dtype dtype, int64_t out, int64_t in) {
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const int outputs = shape_of<T>(false, out, in).outputs;
    return int((out + outputs - 1) / outputs);
  });
}

int matvec_residual(
    Dtype dtype,
    const void* x,
    const void* W,
    const void* bias,
    const void* residual,
    void* sum,
    float* squares,
    int64_t N,
    int64_t out,
    int64_t in,
    void* stream) {
  Extras<char> extra;
  extra.residual = static_cast<const char*>(residual);
  extra.squares_out = squares;
  return launch<false, false, true>(
      dtype, x, W, bias, sum, N, out, in, extra, stream);
}

int matvec_normed(
    Dtype dtype,
    const void* s,
    const float* squares,
    int64_t n_squares,
    const void* norm_w,
    float eps,
    const void* W,
    const void* bias,
    void* y,
    int64_t N,
    int64_t out,
    int64_t in,
    bool silu_mul_halves,
    void* stream) {
  Extras<char> extra;
  extra.norm_w = static_cast<const char*>(norm_w);
  extra.squares = squares;
  extra.n_squares = n_squares;
  extra.eps = eps;
  return silu_mul_halves
      ? launch<true, true, false>(
            dtype, s, W, bias, y, N, out / 2, in, extra, stream)
      : launch<false, true, false>(
            dtype, s, W, bias, y, N, out, in, extra, stream);
}

} // namespace orchard::ops::cuda
