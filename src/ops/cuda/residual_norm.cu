// A GPT block's residual add with the next norm, forward and backward
// (plain definition and oracle: src/ops/fused_train.cpp's
// residual_add_rms_norm_reference). Moved out of gpt_train.cu, whose
// rotary and ReLU² kernels it shares nothing with but numeric.cuh.
#include "ops/cuda/numeric.cuh"

namespace orchard::ops::cuda {

// The GPT block's residual add and norm (ops/fused_train.h's
// residual_add_rms_norm). One warp a row, four values a lane at a time;
// the second pass re-reads what the first wrote, from cache.
namespace {

template <typename TS, typename TB, typename TY>
__global__ void residual_add_rms_norm_kernel(
    const TS* __restrict__ x,
    const TB* __restrict__ b,
    TS* __restrict__ s,
    TY* __restrict__ y,
    float* __restrict__ rstd,
    int64_t rows,
    int64_t C,
    float eps) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp;
  each_warp_row(rows, [&](int64_t row) {
    const int64_t base = row * C;
    float ss = 0.f;
    for (int64_t c = lane * 4; c < C; c += kWarp * 4) {
      float xv[4], bv[4];
      load_values<TS, 4>(x + base + c, xv);
      load_values<TB, 4>(b + base + c, bv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        xv[e] = round_to<TS>(xv[e] + bv[e]);
        ss += xv[e] * xv[e];
      }
      store_values<TS, 4>(s + base + c, xv);
    }
    const float r = rsqrtf(warp_sum(ss) / float(C) + eps);
    if (lane == 0)
      rstd[row] = r;
    __syncwarp();
    for (int64_t c = lane * 4; c < C; c += kWarp * 4) {
      float v[4];
      load_values<TS, 4>(s + base + c, v);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        v[e] *= r;
      store_values<TY, 4>(y + base + c, v);
    }
  });
}

template <typename TS, typename TB, typename TY>
__global__ void residual_add_rms_norm_backward_kernel(
    const TS* __restrict__ ds,
    const TY* __restrict__ dy,
    const TS* __restrict__ s,
    const float* __restrict__ rstd,
    TS* __restrict__ dx,
    TB* __restrict__ db,
    int64_t rows,
    int64_t C) {
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp;
  each_warp_row(rows, [&](int64_t row) {
    const int64_t base = row * C;
    const float r = rstd[row];
    float dot = 0.f;
    for (int64_t c = lane * 4; c < C; c += kWarp * 4) {
      float d[4], v[4];
      load_values<TY, 4>(dy + base + c, d);
      load_values<TS, 4>(s + base + c, v);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dot += d[e] * (v[e] * r);
    }
    const float mean = warp_sum(dot) / float(C);
    for (int64_t c = lane * 4; c < C; c += kWarp * 4) {
      float d[4], v[4], g[4] = {0.f, 0.f, 0.f, 0.f};
      load_values<TY, 4>(dy + base + c, d);
      load_values<TS, 4>(s + base + c, v);
      if (ds)
        load_values<TS, 4>(ds + base + c, g);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        g[e] = round_to<TS>(g[e] + round_to<TS>(r * (d[e] - v[e] * r * mean)));
      store_values<TS, 4>(dx + base + c, g);
      if (db)
        store_values<TB, 4>(db + base + c, g);
    }
  });
}

// The same two kernels for a width known at compile time, C = 128 N: a
// lane keeps its N groups of four values of the row in registers, so every
// load of the row is issued before the sum needs any of them and nothing
// is read twice (the loops above reached 45-55 % of an H200's bandwidth at
// C = 768; the row in registers is what a compiled persistent reduction
// does). Same arithmetic, same roundings.
template <typename TS, typename TB, typename TY, int N>
__global__ void residual_add_rms_norm_row_kernel(
    const TS* __restrict__ x,
    const TB* __restrict__ b,
    TS* __restrict__ s,
    TY* __restrict__ y,
    float* __restrict__ rstd,
    int64_t rows,
    float eps) {
  constexpr int C = kWarp * 4 * N;
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp;
  each_warp_row(rows, [&](int64_t row) {
    const int64_t base = row * C + lane * 4;
    float xv[N][4], bv[N][4];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      load_values<TS, 4>(x + base + j * kWarp * 4, xv[j]);
      load_values<TB, 4>(b + base + j * kWarp * 4, bv[j]);
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        xv[j][e] = round_to<TS>(xv[j][e] + bv[j][e]);
        ss += xv[j][e] * xv[j][e];
      }
    const float r = rsqrtf(warp_sum(ss) / float(C) + eps);
    if (lane == 0)
      rstd[row] = r;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      store_values<TS, 4>(s + base + j * kWarp * 4, xv[j]);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        xv[j][e] *= r;
      store_values<TY, 4>(y + base + j * kWarp * 4, xv[j]);
    }
  });
}

template <typename TS, typename TB, typename TY, int N>
__global__ void residual_add_rms_norm_row_backward_kernel(
    const TS* __restrict__ ds,
    const TY* __restrict__ dy,
    const TS* __restrict__ s,
    const float* __restrict__ rstd,
    TS* __restrict__ dx,
    TB* __restrict__ db,
    int64_t rows) {
  constexpr int C = kWarp * 4 * N;
  wait_for_previous_kernels();
  let_next_kernel_start();
  const int lane = threadIdx.x % kWarp;
  each_warp_row(rows, [&](int64_t row) {
    const int64_t base = row * C + lane * 4;
    const float r = rstd[row];
    float d[N][4], v[N][4], g[N][4];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      load_values<TY, 4>(dy + base + j * kWarp * 4, d[j]);
      load_values<TS, 4>(s + base + j * kWarp * 4, v[j]);
      if (ds)
        load_values<TS, 4>(ds + base + j * kWarp * 4, g[j]);
      else
#pragma unroll
        for (int e = 0; e < 4; ++e)
          g[j][e] = 0.f;
    }
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dot += d[j][e] * (v[j][e] * r);
    const float mean = warp_sum(dot) / float(C);
#pragma unroll
    for (int j = 0; j < N; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        g[j][e] = round_to<TS>(
            g[j][e] + round_to<TS>(r * (d[j][e] - v[j][e] * r * mean)));
      store_values<TS, 4>(dx + base + j * kWarp * 4, g[j]);
      if (db)
        store_values<TB, 4>(db + base + j * kWarp * 4, g[j]);
    }
  });
}

// f(std::integral_constant<int, N>{}) for the widths C = 128 N with a
// kernel of their own (the GPT widths 256 to 1536; wider rows would not
// fit a lane's registers three times over), else
// f(std::integral_constant<int, 0>{}): the loops.
template <typename F>
int by_row_groups(int64_t C, F&& f) {
  switch (C / (kWarp * 4)) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 10:
      return f(std::integral_constant<int, 10>{});
    case 12:
      return f(std::integral_constant<int, 12>{});
  }
  return f(std::integral_constant<int, 0>{});
}

// f(TS{}, TB{}, TY{}) for the supported triples, else
// cudaErrorInvalidValue.
template <typename F>
int dispatch_residual(Dtype residual, Dtype branch, Dtype out, F&& f) {
  if (branch == residual && out == residual)
    return dispatch(residual, [&](auto z) { return f(z, z, z); });
  if (residual != Dtype::float32 || branch == Dtype::float32)
    return int(cudaErrorInvalidValue);
  if (out != branch && out != Dtype::float32)
    return int(cudaErrorInvalidValue);
  return dispatch(branch, [&](auto low) {
    if (out == Dtype::float32)
      return f(float{}, low, float{});
    return f(float{}, low, low);
  });
}

} // namespace

bool residual_add_rms_norm_supports(
    Dtype residual,
    Dtype branch,
    Dtype out,
    int64_t C) {
  if (C <= 0 || C % (kWarp * 4) != 0)
    return false;
  if (branch == residual && out == residual)
    return true;
  return residual == Dtype::float32 && branch != Dtype::float32 &&
      (out == branch || out == Dtype::float32);
}

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
    void* stream) {
  if (!residual_add_rms_norm_supports(residual, branch, out, C))
    return int(cudaErrorInvalidValue);
  if (rows == 0)
    return 0;
  return dispatch_residual(residual, branch, out, [&](auto zs, auto zb, auto zy) {
    using TS = decltype(zs);
    using TB = decltype(zb);
    using TY = decltype(zy);
    return by_row_groups(C, [&](auto n) {
      constexpr int N = decltype(n)::value;
      if constexpr (N > 0)
        return launch_dependent(
            residual_add_rms_norm_row_kernel<TS, TB, TY, N>,
            dim3(row_blocks(rows)), dim3(kThreads), cudaStream_t(stream),
            static_cast<const TS*>(x), static_cast<const TB*>(b),
            static_cast<TS*>(s), static_cast<TY*>(y), rstd, rows, eps);
      else
        return launch_dependent(
            residual_add_rms_norm_kernel<TS, TB, TY>, dim3(row_blocks(rows)),
            dim3(kThreads), cudaStream_t(stream), static_cast<const TS*>(x),
            static_cast<const TB*>(b), static_cast<TS*>(s),
            static_cast<TY*>(y), rstd, rows, C, eps);
    });
  });
}

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
    void* stream) {
  if (!residual_add_rms_norm_supports(residual, branch, out, C))
    return int(cudaErrorInvalidValue);
  if (rows == 0)
    return 0;
  return dispatch_residual(residual, branch, out, [&](auto zs, auto zb, auto zy) {
    using TS = decltype(zs);
    using TB = decltype(zb);
    using TY = decltype(zy);
    return by_row_groups(C, [&](auto n) {
      constexpr int N = decltype(n)::value;
      if constexpr (N > 0)
        return launch_dependent(
            residual_add_rms_norm_row_backward_kernel<TS, TB, TY, N>,
            dim3(row_blocks(rows)), dim3(kThreads), cudaStream_t(stream),
            static_cast<const TS*>(ds), static_cast<const TY*>(dy),
            static_cast<const TS*>(s), rstd, static_cast<TS*>(dx),
            static_cast<TB*>(db), rows);
      else
        return launch_dependent(
            residual_add_rms_norm_backward_kernel<TS, TB, TY>,
            dim3(row_blocks(rows)), dim3(kThreads), cudaStream_t(stream),
            static_cast<const TS*>(ds), static_cast<const TY*>(dy),
            static_cast<const TS*>(s), rstd, static_cast<TS*>(dx),
            static_cast<TB*>(db), rows, C);
    });
  });
}

} // namespace orchard::ops::cuda
