// The embedding's gradient from its output's gradient, the same bits on
// every GPU and every run (plain definition and oracle: PyTorch's
// embedding_dense_backward, in src/ops/embedding.cpp). Several processes
// that each make the whole gradient from the same gathered rows
// (dist/gradient_averager.cpp) must make the same sum, which atomic adds
// do not promise.
//
// The ids come sorted, with the row each came from. Two kernels over
// chunks of kRowsChunk sorted positions: the first sums each run of equal
// ids inside its chunk, writing a run that is a whole id (it neither
// began in the chunk before nor goes on into the next) straight to out,
// and keeping the chunk's first and last run as partial sums; the second
// adds up, for each id whose rows span chunks, its partials in chunk
// order. A frequent id (a tenth of the tokens of English text) is then
// summed by many blocks, not walked by one. Each sum is scaled once, at
// its end (1 / processes: the mean).
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {
namespace {

// Chunk c's partial sums: its first run's, then its last run's.
template <typename P>
__device__ inline P* first_partial(P* partials, int64_t c, int64_t D) {
  return partials + (2 * c) * D;
}
template <typename P>
__device__ inline P* last_partial(P* partials, int64_t c, int64_t D) {
  return partials + (2 * c + 1) * D;
}

// One block per chunk of sorted positions [s, e). Where each run of equal
// ids ends and where its sum goes are worked out once, in shared memory;
// then one thread a column loads the chunk's kRowsChunk values of its
// column at once (all in flight together) and sums each run in order.
template <typename T>
__global__ void rows_in_chunk_kernel(
    const T* __restrict__ rows,
    const int64_t* __restrict__ sorted,
    const int64_t* __restrict__ order,
    float* __restrict__ partials,
    T* __restrict__ out,
    int64_t n,
    int64_t D,
    int64_t num_rows,
    float scale) {
  // Each row's place in rows, and where the sum of the run it ends goes:
  // kGoesOn (it ends no run), an offset into out, kFirst or kLast (the
  // chunk's partials), kNowhere (an id outside the weight).
  constexpr int64_t kGoesOn = -1, kFirst = -2, kLast = -3, kNowhere = -4;
  __shared__ int64_t at[kRowsChunk], dest[kRowsChunk];
  __shared__ int run_begins[kRowsChunk];
  const int64_t c = blockIdx.x;
  const int64_t s = c * kRowsChunk, e = min(n, s + kRowsChunk);
  const int m = int(e - s);
  for (int k = threadIdx.x; k < kRowsChunk; k += blockDim.x) {
    at[k] = k < m ? order[s + k] * D : 0;
    // Whether row k begins a run inside the chunk.
    run_begins[k] = k < m && (k == 0 || sorted[s + k - 1] != sorted[s + k]);
  }
  __syncthreads();
  for (int k = threadIdx.x; k < kRowsChunk; k += blockDim.x) {
    int64_t to = kGoesOn;
    if (k < m && (k + 1 == m || run_begins[k + 1])) {
      const int64_t id = sorted[s + k];
      int first = k;
      while (!run_begins[first])
        --first;
      const bool began_before = first == 0 && s > 0 && sorted[s - 1] == id;
      const bool goes_on = k + 1 == m && e < n && sorted[e] == id;
      if (began_before || goes_on)
        to = first == 0 ? kFirst : kLast;
      else
        to = id >= 0 && id < num_rows ? id * D : kNowhere;
    }
    dest[k] = to;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v[kRowsChunk];
#pragma unroll
    for (int k = 0; k < kRowsChunk; ++k)
      v[k] = k < m ? to_float(rows[at[k] + d]) : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kRowsChunk; ++k) {
      acc += v[k];
      const int64_t to = dest[k];
      if (to == kGoesOn)
        continue;
      if (to >= 0)
        out[to + d] = from_float<T>(acc * scale);
      else if (to == kFirst)
        first_partial(partials, c, D)[d] = acc;
      else if (to == kLast)
        last_partial(partials, c, D)[d] = acc;
      acc = 0.f;
    }
  }
}

// One block per chunk: the id whose rows begin in this chunk and go on into
// the next, if there is one, summed over the chunks it spans (found by a
// binary search for its last row), four sums in flight.
template <typename T>
__global__ void rows_across_chunks_kernel(
    const int64_t* __restrict__ sorted,
    const float* __restrict__ partials,
    T* __restrict__ out,
    int64_t n,
    int64_t D,
    int64_t num_rows,
    float scale) {
  const int64_t c = blockIdx.x;
  const int64_t s = c * kRowsChunk, e = min(n, s + kRowsChunk);
  const int64_t id = sorted[e - 1];
  if (e >= n || sorted[e] != id)
    return; // the chunk's last run ends in it
  const bool one_run = sorted[s] == id;
  if (one_run && s > 0 && sorted[s - 1] == id)
    return; // began in an earlier chunk, whose block sums it
  if (id < 0 || id >= num_rows)
    return;
  // The id's last row: the last position in [e, n) holding it.
  int64_t lo = e, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (sorted[mid] == id)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t last_chunk = lo / kRowsChunk;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc[4] = {
        one_run ? first_partial(partials, c, D)[d]
                : last_partial(partials, c, D)[d],
        0.f,
        0.f,
        0.f};
    int64_t k = c + 1;
    for (; k + 4 <= last_chunk + 1; k += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        acc[u] += first_partial(partials, k + u, D)[d];
    }
    for (int u = 0; k <= last_chunk; ++k, ++u)
      acc[u] += first_partial(partials, k, D)[d];
    out[id * D + d] =
        from_float<T>(((acc[0] + acc[1]) + (acc[2] + acc[3])) * scale);
  }
}

} // namespace

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
    void* stream) {
  if (n == 0 || D == 0)
    return 0;
  const dim3 grid(unsigned((n + kRowsChunk - 1) / kRowsChunk));
  const int threads =
      int(D < kThreads ? (D + kWarp - 1) / kWarp * kWarp : kThreads);
  return dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const auto s = cudaStream_t(stream);
    rows_in_chunk_kernel<T><<<grid, threads, 0, s>>>(
        static_cast<const T*>(rows),
        sorted_ids,
        order,
        partials,
        static_cast<T*>(out),
        n,
        D,
        num_rows,
        scale);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
      return int(err);
    rows_across_chunks_kernel<T><<<grid, threads, 0, s>>>(
        sorted_ids, partials, static_cast<T*>(out), n, D, num_rows, scale);
    return int(cudaGetLastError());
  });
}

} // namespace orchard::ops::cuda
