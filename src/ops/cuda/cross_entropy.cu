// The soft-capped cross-entropy of one chunk of logits rows, with its
// gradient written over the logits (ops/linear_cross_entropy.cpp's chunk
// loop; its plain ops are the oracle). The plain chunk is about ten passes
// over float32 (rows, V) tensors: cast, divide, tanh, multiply, logsumexp,
// subtract, exp, scatter, mask, the cap's derivative. Here: one read of the
// logits in their own dtype for the row's log-sum-exp, and one read and
// one write for the gradient, 16 bytes a thread at a time.
#include "ops/cuda/numeric.cuh"

#include <cmath>
#include <cstdint>

namespace orchard::ops::cuda {
namespace {

constexpr int kRowThreads = 512;

// cap * tanh(x / cap), or x when cap is 0; slope receives its derivative
// 1 - tanh^2 (1 without a cap). For float32 logits from one exponential,
// u = e^(2x / cap): tanh = 1 - 2 / (u + 1) and 1 - tanh^2 = 4u / (u + 1)^2,
// which keeps its precision where tanh is near +-1 (the form 1 - t * t
// cancels there); the exponent is clamped to +-40, where tanh is +-1 in
// float32, and NaN passes through. For 16-bit logits (kLow) the hardware's
// tanh.approx (relative error about 2^-11, below a bfloat16 logit's own
// rounding, 2^-9): one instruction. (tanhf and expf cost about twenty
// instructions each; with them the kernel was bound by arithmetic, not
// memory: 3.4 ms of a 35 ms GPT d12 step on an H200.)
__device__ inline float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool kLow>
__device__ inline float capped(float x, float cap, float& slope) {
  if (cap <= 0.0f) {
    slope = 1.0f;
    return x;
  }
  if constexpr (kLow) {
    const float t = tanh_approx(x * (1.0f / cap));
    slope = 1.0f - t * t;
    return cap * t;
  } else {
    float a = x * (2.0f / cap);
    a = a > 40.0f ? 40.0f : a < -40.0f ? -40.0f : a;
    const float u = __expf(a);
    const float r = __frcp_rn(u + 1.0f);
    slope = 4.0f * u * r * r;
    return cap * (1.0f - 2.0f * r);
  }
}

// Below this cap every exp(s - cap) of a row, s in [-cap, cap], is a
// normal float32 (e^-80 > 1e-35): the row's sum needs no running maximum.
constexpr float kFixedShiftCap = 40.0f;

// (m, l) with l = sum exp(s - m): two partial sums joined.
__device__ inline void join(float& m, float& l, float m2, float l2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY)
    return; // both empty
  l = l * expf(m - top) + l2 * expf(m2 - top);
  m = top;
}

// One block per row of z (rows, ld): its first V columns, VEC values (16
// bytes) a thread at a time; rows start 16-byte aligned (ld a multiple of
// VEC). Values of a piece past V are read but left out, and written back
// as they were.
template <typename T, int VEC>
__global__ void softcap_cross_entropy_kernel(
    T* __restrict__ z,
    const int64_t* __restrict__ targets,
    float* __restrict__ loss,
    int64_t V,
    int64_t ld,
    float cap,
    bool write_grad) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  constexpr bool kLow = sizeof(T) == 2;
  __shared__ float part_m[kRowThreads / kWarp], part_l[kRowThreads / kWarp];
  __shared__ float row_lse;
  T* zr = z + int64_t(blockIdx.x) * ld;
  const int64_t target = targets[blockIdx.x];
  const int64_t pieces = (V + VEC - 1) / VEC;
  float m = -INFINITY, l = 0.0f, t;
  if (cap > 0.0f && cap <= kFixedShiftCap) {
    // Soft-capped: every s is at most cap, so cap serves as the maximum.
    for (int64_t k = threadIdx.x; k < pieces; k += kRowThreads) {
      float v[VEC];
      load_values<T, VEC>(zr + k * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        if (k * VEC + e < V)
          l += __expf(capped<kLow>(v[e], cap, t) - cap);
    }
    m = l > 0.0f || l != l ? cap : -INFINITY;
  } else {
    for (int64_t k = threadIdx.x; k < pieces; k += kRowThreads) {
      float v[VEC];
      load_values<T, VEC>(zr + k * VEC, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (k * VEC + e >= V)
          break;
        const float s = capped<kLow>(v[e], cap, t);
        if (s > m) {
          l = l * __expf(m - s) + 1.0f;
          m = s;
        } else if (m > -INFINITY) {
          l += __expf(s - m);
        }
      }
    }
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
    join(m, l, m2, l2);
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
  __syncthreads();
  if (warp == 0) {
    constexpr int kWarps = kRowThreads / kWarp;
    m = lane < kWarps ? part_m[lane] : -INFINITY;
    l = lane < kWarps ? part_l[lane] : 0.0f;
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
      join(m, l, m2, l2);
    }
    if (lane == 0) {
      const float lse = m + logf(l);
      row_lse = lse;
      // A target past the vocabulary (the caller's bug) reads nothing and
      // makes the loss NaN, where the plain ops' gather would fault.
      loss[blockIdx.x] = target < 0 ? 0.0f
          : target < V ? lse - capped<kLow>(to_float(zr[target]), cap, t)
                       : NAN;
    }
  }
  __syncthreads(); // every thread has read its logits before any is written
  if (!write_grad)
    return;
  const float lse = row_lse;
  const bool valid = target >= 0;
  for (int64_t k = threadIdx.x; k < pieces; k += kRowThreads) {
    float v[VEC];
    load_values<T, VEC>(zr + k * VEC, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int64_t j = k * VEC + e;
      if (j >= V)
        break; // v[e] stays: written back unchanged
      float d = 0.0f;
      if (valid) {
        const float s = capped<kLow>(v[e], cap, t);
        d = (__expf(s - lse) - (j == target ? 1.0f : 0.0f)) * t;
      }
      v[e] = d;
    }
    store_values<T, VEC>(zr + k * VEC, v);
  }
}

// 2^x on the special-function unit, one instruction (what __expf uses
// after its multiply by log2(e), folded here into the caller's fma).
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// f(k, v) for each 16-byte piece k < pieces of a row that this thread
// takes (k = threadIdx.x, + kRowThreads, ...), v its values as float32;
// the loads of kAhead pieces are issued before any is used (one load in
// flight a thread left the memory idle between a block's loads).
template <typename T, int kAhead, typename F>
__device__ inline void each_piece_ahead(const T* row, int pieces, F&& f) {
  constexpr int VEC = 16 / sizeof(T);
  const uint4* p = reinterpret_cast<const uint4*>(row);
  for (int k0 = threadIdx.x; k0 < pieces; k0 += kAhead * kRowThreads) {
    uint4 raw[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (k0 + u * kRowThreads < pieces)
        raw[u] = p[k0 + u * kRowThreads];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int k = k0 + u * kRowThreads;
      if (k >= pieces)
        break;
      float v[VEC];
      unpack16<T>(raw[u], v);
      f(k, v);
    }
  }
}

// softcap_cross_entropy_kernel for 16-bit logits with 0 < cap <=
// kFixedShiftCap (the GPT's case), in fewer instructions an element: that
// kernel was bound by instruction issue, not by memory (1.6 ms of a 30 ms
// GPT d12 step on an H200, at about half the memory's bandwidth). Here
// 32-bit indices, whole pieces without per-value bounds checks, the
// target's -1 applied only in the piece that holds it, each exponential
// one fma and one ex2 (e^(s - a) = 2^(t cap log2(e) - a log2(e)) with
// s = cap t), and four loads in flight a thread: 1.09 ms. (Keeping the
// row in shared memory for the second pass, 1.20 ms, and an exponential
// on the FMA units instead of the special-function unit were slower.)
template <typename T>
__global__ void softcap_cross_entropy_low_kernel(
    T* __restrict__ z,
    const int64_t* __restrict__ targets,
    float* __restrict__ loss,
    int64_t V64,
    int64_t ld,
    float cap,
    bool write_grad) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  constexpr int VEC = 16 / sizeof(T);
  constexpr int kAhead = 4;
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ float part_l[kRowThreads / kWarp];
  __shared__ float row_lse;
  T* zr = z + int64_t(blockIdx.x) * ld;
  const int V = int(V64);
  const int64_t target = targets[blockIdx.x];
  const int pieces = (V + VEC - 1) / VEC, whole = V / VEC;
  const float inv_cap = 1.0f / cap, c = cap * kLog2e;
  // Every s is at most cap: l = sum e^(s - cap), no running maximum.
  float l = 0.0f;
  each_piece_ahead<T, kAhead>(zr, pieces, [&](int k, const float(&v)[VEC]) {
    if (k < whole) {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        l += exp2_approx(fmaf(tanh_approx(v[e] * inv_cap), c, -c));
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        if (k * VEC + e < V)
          l += exp2_approx(fmaf(tanh_approx(v[e] * inv_cap), c, -c));
    }
  });
  l = warp_sum(l);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0)
    part_l[warp] = l;
  __syncthreads();
  if (warp == 0) {
    constexpr int kWarps = kRowThreads / kWarp;
    l = warp_sum(lane < kWarps ? part_l[lane] : 0.0f);
    if (lane == 0) {
      const float lse = cap + logf(l);
      row_lse = lse;
      // A target past the vocabulary (the caller's bug) reads nothing and
      // makes the loss NaN, where the plain ops' gather would fault.
      loss[blockIdx.x] = target < 0 ? 0.0f
          : target < V
          ? lse - cap * tanh_approx(to_float(zr[target]) * inv_cap)
          : NAN;
    }
  }
  __syncthreads(); // every thread has read its logits before any is written
  if (!write_grad)
    return;
  const float lse2 = row_lse * kLog2e;
  each_piece_ahead<T, kAhead>(zr, pieces, [&](int k, const float(&in)[VEC]) {
    float v[VEC];
    const int j0 = k * VEC;
    const int64_t rel = target - j0; // where -1 is added to the softmax
    if (target < 0) { // an ignored row: zero gradient
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        v[e] = j0 + e < V ? 0.0f : in[e];
    } else if (k < whole && (rel < 0 || rel >= VEC)) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float t = tanh_approx(in[e] * inv_cap);
        v[e] = exp2_approx(fmaf(t, c, -lse2)) * fmaf(-t, t, 1.0f);
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float t = tanh_approx(in[e] * inv_cap);
        const float p = exp2_approx(fmaf(t, c, -lse2));
        // Past V: written back unchanged.
        v[e] = j0 + e < V ? (p - (e == rel ? 1.0f : 0.0f)) * fmaf(-t, t, 1.0f)
                          : in[e];
      }
    }
    store_values<T, VEC>(zr + j0, v);
  });
}

} // namespace

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
    void* stream) {
  if (rows == 0 || V == 0)
    return 0;
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kVec = 16 / sizeof(T);
    // The op pads rows to a multiple of 128 in a fresh product: rows are
    // always 16-byte aligned there.
    if (ld % kVec != 0 || reinterpret_cast<uintptr_t>(z) % 16 != 0)
      return int(cudaErrorInvalidValue);
    auto kernel = softcap_cross_entropy_kernel<T, kVec>;
    // The lean kernel for the GPT's case; 32-bit indices there (V and the
    // row's pieces well inside int).
    if constexpr (sizeof(T) == 2)
      if (softcap > 0.0f && softcap <= kFixedShiftCap &&
          V < (int64_t(1) << 30))
        kernel = softcap_cross_entropy_low_kernel<T>;
    return launch_dependent(
        kernel,
        dim3(unsigned(rows)),
        dim3(kRowThreads),
        cudaStream_t(stream),
        static_cast<T*>(z),
        targets,
        loss,
        V,
        ld,
        softcap,
        write_grad);
  });
}

} // namespace orchard::ops::cuda
