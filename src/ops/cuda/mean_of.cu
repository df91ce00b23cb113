// The mean of several float32 arrays of one length, summed in their order
// (dist/copy_engine_mean.cpp: a share of a gradient bucket from every
// rank's values). One pass: each thread reads four values of every part
// and writes four of the mean, in a grid-stride loop over few blocks, so
// that it leaves most SMs to the backward it runs beside. Each block can
// also sum the squares of the means it wrote (the gradient norm's part,
// so no later pass reads the buckets for it).
#include "ops/cuda/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace orchard::ops::cuda {
namespace {

constexpr int kThreads = 256, kMaxBlocks = 64;

struct Parts {
  const float* at[kMeanOfMaxParts];
};

__global__ void mean_of_kernel(
    Parts parts,
    int n,
    float* __restrict__ out,
    int64_t quads,
    float scale,
    float* __restrict__ squares) {
  float own = 0.f; // this thread's sum of squared means, in its order
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 s = reinterpret_cast<const float4*>(parts.at[0])[i];
    for (int k = 1; k < n; ++k) {
      const float4 v = reinterpret_cast<const float4*>(parts.at[k])[i];
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    s.x *= scale;
    s.y *= scale;
    s.z *= scale;
    s.w *= scale;
    reinterpret_cast<float4*>(out)[i] = s;
    own += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
  }
  if (squares == nullptr)
    return;
  // The block's sum in a fixed order: within each warp, then warp by warp.
  __shared__ float warp_sums[kThreads / 32];
  for (int d = 16; d > 0; d /= 2)
    own += __shfl_down_sync(0xffffffffu, own, d);
  if (threadIdx.x % 32 == 0)
    warp_sums[threadIdx.x / 32] = own;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kThreads / 32; ++w)
      sum += warp_sums[w];
    squares[blockIdx.x] = sum;
  }
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

} // namespace

int mean_of_blocks(int64_t count) {
  const int64_t quads = count / 4;
  return int(std::min<int64_t>(kMaxBlocks, (quads + kThreads - 1) / kThreads));
}

int mean_of(
    const float* const* parts,
    int n,
    float* out,
    int64_t count,
    float scale,
    float* squares,
    void* stream) {
  if (n < 1 || n > kMeanOfMaxParts || count % 4 != 0 || !aligned(out))
    return int(cudaErrorInvalidValue);
  Parts p{};
  for (int k = 0; k < n; ++k) {
    if (!aligned(parts[k]))
      return int(cudaErrorInvalidValue);
    p.at[k] = parts[k];
  }
  const int blocks = mean_of_blocks(count);
  if (blocks == 0)
    return 0;
  mean_of_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p, n, out, count / 4, scale, squares);
  return int(cudaGetLastError());
}

} // namespace orchard::ops::cuda
