// What the kernels share: conversions between the storage types and
// float32 (rounding to nearest even, as PyTorch's casts do), the Dtype to
// type dispatch, a warp's sum, and the launch that lets a kernel start
// before the one ahead of it has finished.
#pragma once

#include "ops/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace orchard::ops::cuda {

constexpr int kWarp = 32;

__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__half v) {
  return __half2float(v);
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// v rounded to T and back: what a PyTorch op on T tensors stores.
template <typename T>
__device__ inline float round_to(float v) {
  return to_float(from_float<T>(v));
}

__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// f(row) for each row this warp takes of `rows`: one warp a row, the grid
// looping over the rest (row is the same in every lane of the warp).
template <typename F>
__device__ inline void each_warp_row(int64_t rows, F&& f) {
  const int64_t per_block = blockDim.x / kWarp;
  const int64_t warps = int64_t(gridDim.x) * per_block;
  for (int64_t row = int64_t(blockIdx.x) * per_block + threadIdx.x / kWarp;
       row < rows;
       row += warps)
    f(row);
}

// The 16 / sizeof(T) values of T in a 16-byte load, as float32.
template <typename T>
__device__ inline void unpack16(const uint4& raw, float* out) {
  constexpr int n = 16 / sizeof(T);
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < n; ++e)
    out[e] = to_float(v[e]);
}

// V values of T from p as float32, in one load where V * sizeof(T) is 16,
// 8 or 4 bytes (p then aligned to that many bytes), else one at a time.
template <typename T, int V>
__device__ inline void load_values(const T* p, float (&out)[V]) {
  constexpr int bytes = V * int(sizeof(T));
  if constexpr (bytes == 16) {
    unpack16<T>(*reinterpret_cast<const uint4*>(p), out);
  } else if constexpr (bytes == 8 || bytes == 4) {
    using Raw = std::conditional_t<bytes == 8, uint2, uint32_t>;
    const Raw raw = *reinterpret_cast<const Raw*>(p);
    const T* t = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int e = 0; e < V; ++e)
      out[e] = to_float(t[e]);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e)
      out[e] = to_float(p[e]);
  }
}

// V float32 values to p as T, in one 16-byte store where
// V * sizeof(T) == 16.
template <typename T, int V>
__device__ inline void store_values(T* p, const float (&v)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    uint4 raw;
    T* t = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int e = 0; e < V; ++e)
      t[e] = from_float<T>(v[e]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e)
      p[e] = from_float<T>(v[e]);
  }
}

// A warp's partial sums of rows 0..N-1 of one output o, summed over the
// warp and written by lane 0 to y[n][o] (plus bias[o] where given), one
// rounding to T.
template <typename T, int MaxRows>
__device__ inline void write_warp_sums(
    const float (&acc)[MaxRows],
    int N,
    const T* bias,
    T* y,
    int64_t out,
    int64_t o) {
#pragma unroll
  for (int n = 0; n < MaxRows; ++n) {
    if (n >= N)
      break;
    float s = warp_sum(acc[n]);
    if (threadIdx.x % kWarp == 0) {
      if (bias)
        s += to_float(bias[o]);
      y[int64_t(n) * out + o] = from_float<T>(s);
    }
  }
}

// The training kernels' launches (train_fused.cu, gpt_train.cu): blocks of
// kThreads, enough of them to fill the GPU several times over (the kernels
// loop over the rest), and the alignment their 16-byte loads need.
constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

// Blocks for kernels that take one row a warp (each_warp_row).
inline unsigned row_blocks(int64_t rows) {
  return blocks_for(rows * kWarp);
}

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <typename T>
inline bool aligned16(const void* p) {
  return aligned_to(p, 16);
}

// Calls f(T{}) with T the storage type of `dtype`; returns f's result, or
// cudaErrorInvalidValue for an unknown dtype.
template <typename F>
int dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::float32:
      return f(float{});
    case Dtype::float16:
      return f(__half{});
    case Dtype::bfloat16:
      return f(__nv_bfloat16{});
  }
  return int(cudaErrorInvalidValue);
}

// Programmatic dependent launch (compute capability 9.0 and later). A
// decoding step is a chain of kernels of a few microseconds each; launched
// one after the other, each waits for the one before to end and then for
// its own blocks to be scheduled. Launched by launch_dependent(), a kernel
// may be scheduled while the previous one still runs: it does what needs
// nothing from earlier kernels (a product's first loads of its weights,
// which no decoding kernel writes), then wait_for_previous_kernels(), and
// only then reads its inputs or writes anything. Every kernel launched
// that way must call it before its first such access.
__device__ inline void wait_for_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream be scheduled now (it still waits for
// this one's end before it touches its results): called by each block
// once it has passed wait_for_previous_kernels().
__device__ inline void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether `kernel` can be launched early on the current device: the device
// has compute capability 9.0+, the code that runs was compiled for it (not
// a JIT of older PTX without the wait), and ORCHARD_PDL is not 0.
bool dependent_launch_usable(const void* kernel);

// kernel<<<grid, block, 0, stream>>>(args...), as a programmatic dependent
// launch where dependent_launch_usable(kernel). Returns the cudaError_t.
template <typename... Params, typename... Args>
int launch_dependent(
    void (*kernel)(Params...),
    dim3 grid,
    dim3 block,
    cudaStream_t stream,
    Args... args) {
  cudaLaunchAttribute early[1];
  early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = early;
  config.numAttrs =
      dependent_launch_usable(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  return int(cudaLaunchKernelEx(&config, kernel, Params(args)...));
}

} // namespace orchard::ops::cuda
