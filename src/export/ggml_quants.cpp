#include "export/ggml_quants.h"

#include "core/error.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

namespace orchard::gguf {

namespace {

constexpr int64_t kQK = 32;    // the simple types' block
constexpr int64_t kQK_K = 256; // the k-quants' super-block

// Scale search: the plain min/max fit, then kSteps candidates spread
// kStepSize apart around it (fractions of a quantisation level).
constexpr int kSteps = 20;
constexpr float kStepSize = 0.1f;

uint16_t half_bits(float v) {
  return c10::Half(v).x;
}
float half_value(uint16_t bits) {
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

void put_half(uint8_t* p, float v) {
  const uint16_t b = half_bits(v);
  std::memcpy(p, &b, 2);
}
float get_half(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return half_value(b);
}

// The value of largest magnitude, with its sign.
float signed_absmax(const float* x, int64_t n) {
  float amax = 0, v = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      v = x[i];
    }
  return v;
}

// Importance of each value in a sub-block's fit: larger values matter
// more, and a floor of the block's RMS keeps small ones in the fit.
void fit_weights(const float* x, int64_t n, float* w) {
  float sum2 = 0;
  for (int64_t i = 0; i < n; ++i)
    sum2 += x[i] * x[i];
  const float rms = std::sqrt(sum2 / static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i)
    w[i] = rms + std::fabs(x[i]);
}

// Round to nearest, ties to even, as std::nearbyint does in the default
// rounding mode, but inline: nearbyint is a libm call on baseline x86-64,
// and these loops run it tens of times for every value. Exact for
// |v| < 2^22, far past any level here.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f; // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// x ~ scale * q - min with integer q in [0, nmax], scale >= 0, min >= 0
// (the k-quants' sub-block): candidate inverse scales around the min/max
// fit assign q, and for each assignment the weighted least-squares scale
// and offset are solved; the assignment with the least weighted error wins
// (the error in closed form from the same sums).
struct Affine {
  float scale = 0, min = 0;
};
Affine fit_affine(const float* x, const float* w, int n, int nmax) {
  float lo = 0, hi = x[0], sw = 0, sx = 0, sx2 = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sw += w[i];
    sx += w[i] * x[i];
    sx2 += w[i] * x[i] * x[i];
  }
  if (hi <= lo)
    return {0.0f, -lo};
  Affine best{(hi - lo) / static_cast<float>(nmax), -lo};
  float best_err = std::numeric_limits<float>::infinity();
  const float top = static_cast<float>(nmax);
  for (int step = -1; step <= kSteps; ++step) {
    const float levels =
        step < 0 ? top : top - 1.0f + kStepSize * static_cast<float>(step);
    const float iscale = levels / (hi - lo);
    float sl = 0, sl2 = 0, slx = 0;
    for (int i = 0; i < n; ++i) {
      const float l = std::clamp(round_even(iscale * (x[i] - lo)), 0.0f, top);
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      slx += w[i] * l * x[i];
    }
    const float det = sw * sl2 - sl * sl;
    if (det <= 0)
      continue;
    float a = (sw * slx - sx * sl) / det;
    float b = (sl2 * sx - sl * slx) / det;
    if (b > 0) { // the offset may only lower values: refit the scale alone
      b = 0;
      a = sl2 > 0 ? slx / sl2 : 0;
    }
    if (a < 0)
      continue;
    // sum w (a l + b - x)^2, expanded.
    const float err = a * a * sl2 + 2 * a * b * sl + b * b * sw - 2 * a * slx -
        2 * b * sx + sx2;
    if (err < best_err) {
      best_err = err;
      best = {a, -b};
    }
  }
  return best;
}

// x ~ scale * q with integer q in [-nneg, nneg - 1] (Q6_K's sub-block). The
// scale may be negative, so that the largest magnitude lands on -nneg. For
// each candidate assignment the best scale is sum(w x l) / sum(w l^2), and
// its error sum(w x^2) - sum(w x l)^2 / sum(w l^2): the candidate with the
// largest sum(w x l)^2 / sum(w l^2) wins.
float fit_symmetric(const float* x, const float* w, int n, int nneg) {
  const float v = signed_absmax(x, n);
  if (v == 0)
    return 0;
  float best = -v / static_cast<float>(nneg);
  float best_gain = -1;
  const float lo = static_cast<float>(-nneg), hi = static_cast<float>(nneg - 1);
  for (int step = -kSteps / 2; step <= kSteps / 2; ++step) {
    const float iscale =
        -(static_cast<float>(nneg) + kStepSize * static_cast<float>(step)) / v;
    float sxl = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
      const float l = std::clamp(round_even(iscale * x[i]), lo, hi);
      sxl += w[i] * x[i] * l;
      sl2 += w[i] * l * l;
    }
    if (sl2 <= 0)
      continue;
    const float gain = sxl * sxl / sl2;
    if (gain > best_gain) {
      best_gain = gain;
      best = sxl / sl2;
    }
  }
  return best;
}

// --- the blocks (ggml-common.h's block_q8_0, block_q4_0, ...) --------------

void encode_q8_0(const float* x, uint8_t* out) {
  float amax = 0;
  for (int64_t i = 0; i < kQK; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  put_half(out, d);
  auto* q = reinterpret_cast<int8_t*>(out + 2);
  for (int64_t i = 0; i < kQK; ++i)
    q[i] = static_cast<int8_t>(round_even(x[i] * id));
}
void decode_q8_0(const uint8_t* in, float* y) {
  const float d = get_half(in);
  const auto* q = reinterpret_cast<const int8_t*>(in + 2);
  for (int64_t i = 0; i < kQK; ++i)
    y[i] = d * static_cast<float>(q[i]);
}

// Q4_0 and Q5_0 put the value of largest magnitude on the lowest level
// (-8 or -16), the way llama.cpp's reference quantiser does.
void encode_q4_0(const float* x, uint8_t* out) {
  const float d = signed_absmax(x, kQK) / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  put_half(out, d);
  uint8_t* qs = out + 2;
  auto level = [&](float v) {
    return static_cast<uint8_t>(std::min(15, static_cast<int>(v * id + 8.5f)));
  };
  for (int64_t j = 0; j < kQK / 2; ++j)
    qs[j] = level(x[j]) | static_cast<uint8_t>(level(x[j + kQK / 2]) << 4);
}
void decode_q4_0(const uint8_t* in, float* y) {
  const float d = get_half(in);
  const uint8_t* qs = in + 2;
  for (int64_t j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + kQK / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void encode_q5_0(const float* x, uint8_t* out) {
  const float d = signed_absmax(x, kQK) / -16.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  put_half(out, d);
  uint32_t high = 0;
  uint8_t* qs = out + 6;
  for (int64_t j = 0; j < kQK / 2; ++j) {
    const int a = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    const int b = std::min(31, static_cast<int>(x[j + kQK / 2] * id + 16.5f));
    qs[j] = static_cast<uint8_t>((a & 0x0F) | ((b & 0x0F) << 4));
    high |= static_cast<uint32_t>((a >> 4) & 1) << j;
    high |= static_cast<uint32_t>((b >> 4) & 1) << (j + kQK / 2);
  }
  std::memcpy(out + 2, &high, 4);
}
void decode_q5_0(const uint8_t* in, float* y) {
  const float d = get_half(in);
  uint32_t high;
  std::memcpy(&high, in + 2, 4);
  const uint8_t* qs = in + 6;
  for (int64_t j = 0; j < kQK / 2; ++j) {
    const int a = (qs[j] & 0x0F) | static_cast<int>(((high >> j) & 1) << 4);
    const int b =
        (qs[j] >> 4) | static_cast<int>(((high >> (j + kQK / 2)) & 1) << 4);
    y[j] = d * static_cast<float>(a - 16);
    y[j + kQK / 2] = d * static_cast<float>(b - 16);
  }
}

// Q4_K's 12 bytes of scales: eight 6-bit scales and eight 6-bit mins.
// Sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scale) and
// 4-7 (min); sub-blocks 4-7 split theirs into a low nibble in bytes 8-11
// and the two high bits in the top of bytes 0-3 (scale) and 4-7 (min).
void put_scale_min(uint8_t* s, int j, int sc, int m) {
  if (j < 4) {
    s[j] = static_cast<uint8_t>((s[j] & 0xC0) | sc);
    s[j + 4] = static_cast<uint8_t>((s[j + 4] & 0xC0) | m);
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0x0F) | ((m & 0x0F) << 4));
    s[j - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
    s[j] |= static_cast<uint8_t>((m >> 4) << 6);
  }
}
void get_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// block_q4_K: f16 d, f16 dmin, scales[12], qs[128].
void encode_q4_k(const float* x, uint8_t* out) {
  constexpr int kSub = 32, kNmax = 15, kSixBits = 63;
  float w[kSub];
  Affine fit[kQK_K / kSub];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQK_K / kSub; ++j) {
    fit_weights(x + j * kSub, kSub, w);
    fit[j] = fit_affine(x + j * kSub, w, kSub, kNmax);
    max_scale = std::max(max_scale, fit[j].scale);
    max_min = std::max(max_min, fit[j].min);
  }
  const float d = max_scale / kSixBits, dmin = max_min / kSixBits;
  put_half(out, d);
  put_half(out + 2, dmin);
  uint8_t* scales = out + 4;
  std::memset(scales, 0, 12);
  int ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = d > 0
        ? std::min(kSixBits, static_cast<int>(round_even(fit[j].scale / d)))
        : 0;
    lm[j] = dmin > 0
        ? std::min(kSixBits, static_cast<int>(round_even(fit[j].min / dmin)))
        : 0;
    put_scale_min(scales, j, ls[j], lm[j]);
  }
  // Levels from the scales as stored (f16 d times the 6-bit factor).
  const float dh = get_half(out), dminh = get_half(out + 2);
  uint8_t level[kQK_K];
  for (int j = 0; j < 8; ++j) {
    const float s = dh * static_cast<float>(ls[j]);
    const float m = dminh * static_cast<float>(lm[j]);
    for (int i = 0; i < kSub; ++i) {
      const float v = x[j * kSub + i];
      level[j * kSub + i] = s > 0
          ? static_cast<uint8_t>(std::clamp(
                round_even((v + m) / s), 0.0f, static_cast<float>(kNmax)))
          : 0;
    }
  }
  uint8_t* qs = out + 16;
  for (int c = 0; c < kQK_K / 64; ++c)
    for (int l = 0; l < 32; ++l)
      qs[c * 32 + l] = static_cast<uint8_t>(
          level[c * 64 + l] | (level[c * 64 + 32 + l] << 4));
}
void decode_q4_k(const uint8_t* in, float* y) {
  const float d = get_half(in), dmin = get_half(in + 2);
  const uint8_t* scales = in + 4;
  const uint8_t* qs = in + 16;
  for (int c = 0; c < kQK_K / 64; ++c) {
    int sc0, m0, sc1, m1;
    get_scale_min(scales, 2 * c, sc0, m0);
    get_scale_min(scales, 2 * c + 1, sc1, m1);
    for (int l = 0; l < 32; ++l) {
      const uint8_t q = qs[c * 32 + l];
      y[c * 64 + l] =
          d * static_cast<float>(sc0) * static_cast<float>(q & 0x0F) -
          dmin * static_cast<float>(m0);
      y[c * 64 + 32 + l] =
          d * static_cast<float>(sc1) * static_cast<float>(q >> 4) -
          dmin * static_cast<float>(m1);
    }
  }
}

// block_q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16],
// f16 d. Within each half of 128 values, value l (< 32) and l+32, l+64,
// l+96 share the bytes ql[l], ql[l+32] and qh[l].
void encode_q6_k(const float* x, uint8_t* out) {
  constexpr int kSub = 16, kNneg = 32, kScaleMax = 127;
  float w[kSub];
  float scale[kQK_K / kSub];
  float amax = 0;
  for (int j = 0; j < kQK_K / kSub; ++j) {
    fit_weights(x + j * kSub, kSub, w);
    scale[j] = fit_symmetric(x + j * kSub, w, kSub, kNneg);
    amax = std::max(amax, std::fabs(scale[j]));
  }
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  auto* sc = reinterpret_cast<int8_t*>(out + 192);
  const float d = amax / kScaleMax;
  put_half(out + 208, d);
  const float dh = get_half(out + 208);
  uint8_t level[kQK_K];
  for (int j = 0; j < kQK_K / kSub; ++j) {
    const int s = d > 0
        ? std::clamp(
              static_cast<int>(round_even(scale[j] / d)), -kScaleMax, kScaleMax)
        : 0;
    sc[j] = static_cast<int8_t>(s);
    const float step = dh * static_cast<float>(s);
    for (int i = 0; i < kSub; ++i) {
      const int q = step != 0 ? static_cast<int>(std::clamp(
                                    round_even(x[j * kSub + i] / step),
                                    static_cast<float>(-kNneg),
                                    static_cast<float>(kNneg - 1)))
                              : 0;
      level[j * kSub + i] = static_cast<uint8_t>(q + kNneg);
    }
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* L = level + half * 128;
    uint8_t* lo = ql + half * 64;
    uint8_t* hi = qh + half * 32;
    for (int l = 0; l < 32; ++l) {
      lo[l] = static_cast<uint8_t>((L[l] & 0x0F) | ((L[l + 64] & 0x0F) << 4));
      lo[l + 32] =
          static_cast<uint8_t>((L[l + 32] & 0x0F) | ((L[l + 96] & 0x0F) << 4));
      hi[l] = static_cast<uint8_t>(
          (L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) |
          ((L[l + 96] >> 4) << 6));
    }
  }
}
void decode_q6_k(const uint8_t* in, float* y) {
  const uint8_t* ql = in;
  const uint8_t* qh = in + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(in + 192);
  const float d = get_half(in + 208);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* lo = ql + half * 64;
    const uint8_t* hi = qh + half * 32;
    const int8_t* s = sc + half * 8;
    float* out = y + half * 128;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((lo[l] & 0x0F) | (((hi[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((lo[l + 32] & 0x0F) | (((hi[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((lo[l] >> 4) | (((hi[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((lo[l + 32] >> 4) | (((hi[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(s[is + 0] * q1);
      out[l + 32] = d * static_cast<float>(s[is + 2] * q2);
      out[l + 64] = d * static_cast<float>(s[is + 4] * q3);
      out[l + 96] = d * static_cast<float>(s[is + 6] * q4);
    }
  }
}

using BlockEncoder = void (*)(const float*, uint8_t*);
using BlockDecoder = void (*)(const uint8_t*, float*);

BlockEncoder block_encoder(TensorType t) {
  switch (t) {
    case TensorType::Q8_0:
      return encode_q8_0;
    case TensorType::Q4_0:
      return encode_q4_0;
    case TensorType::Q5_0:
      return encode_q5_0;
    case TensorType::Q4_K:
      return encode_q4_k;
    case TensorType::Q6_K:
      return encode_q6_k;
    default:
      return nullptr;
  }
}
BlockDecoder block_decoder(TensorType t) {
  switch (t) {
    case TensorType::Q8_0:
      return decode_q8_0;
    case TensorType::Q4_0:
      return decode_q4_0;
    case TensorType::Q5_0:
      return decode_q5_0;
    case TensorType::Q4_K:
      return decode_q4_k;
    case TensorType::Q6_K:
      return decode_q6_k;
    default:
      return nullptr;
  }
}

torch::ScalarType float_type(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return torch::kFloat32;
    case TensorType::F16:
      return torch::kFloat16;
    case TensorType::BF16:
      return torch::kBFloat16;
    default:
      return torch::kFloat32;
  }
}

// Blocks a thread takes at least (about 64 KiB of input).
constexpr int64_t kBlocksPerTask = 64;

// f(b0, b1) over [0, n) blocks, split across the intra-op threads
// (torch::set_num_threads). Plain threads: at::parallel_for's OpenMP form
// is a pragma in a header, which does nothing in a file built without
// -fopenmp (measured: one core busy).
void for_blocks(int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t threads = std::clamp<int64_t>(
      at::get_num_threads(), 1, std::max<int64_t>(1, n / kBlocksPerTask));
  if (threads == 1) {
    f(0, n);
    return;
  }
  const int64_t per = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(f, std::min(n, t * per), std::min(n, (t + 1) * per));
  f(0, std::min(n, per));
  for (auto& th : pool)
    th.join();
}

} // namespace

TypeTraits traits(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return {"f32", 1, 4};
    case TensorType::F16:
      return {"f16", 1, 2};
    case TensorType::BF16:
      return {"bf16", 1, 2};
    case TensorType::Q8_0:
      return {"q8_0", kQK, 2 + kQK};
    case TensorType::Q4_0:
      return {"q4_0", kQK, 2 + kQK / 2};
    case TensorType::Q5_0:
      return {"q5_0", kQK, 2 + 4 + kQK / 2};
    case TensorType::Q4_K:
      return {"q4_K", kQK_K, 2 + 2 + 12 + kQK_K / 2};
    case TensorType::Q6_K:
      return {"q6_K", kQK_K, kQK_K / 2 + kQK_K / 4 + kQK_K / 16 + 2};
  }
  throw std::logic_error("[gguf] unknown tensor type");
}

int64_t encoded_bytes(TensorType t, int64_t values, int64_t row) {
  const TypeTraits tt = traits(t);
  if (row % tt.block != 0)
    throw UserError(
        std::string("[gguf] ") + tt.name + " packs rows in blocks of " +
        std::to_string(tt.block) + " values, and this row has " +
        std::to_string(row) + "; choose another --type.");
  return values / tt.block * tt.block_bytes;
}

std::string encode(const torch::Tensor& x, TensorType t) {
  const int64_t row = x.dim() == 0 ? 1 : x.size(-1);
  std::string out(static_cast<size_t>(encoded_bytes(t, x.numel(), row)), '\0');
  if (BlockEncoder enc = block_encoder(t)) {
    const torch::Tensor v = x.to(torch::kFloat32).contiguous();
    const float* src = v.data_ptr<float>();
    auto* dst = reinterpret_cast<uint8_t*>(out.data());
    const TypeTraits tt = traits(t);
    const int64_t blocks = v.numel() / tt.block;
    for_blocks(blocks, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        enc(src + b * tt.block, dst + b * tt.block_bytes);
    });
    return out;
  }
  const torch::Tensor v = x.to(float_type(t)).contiguous();
  std::memcpy(out.data(), v.data_ptr(), out.size());
  return out;
}

torch::Tensor decode(
    const std::string& bytes,
    TensorType t,
    const std::vector<int64_t>& shape) {
  auto y = torch::empty(shape, torch::kFloat32);
  const int64_t row = shape.empty() ? 1 : shape.back();
  if (static_cast<int64_t>(bytes.size()) != encoded_bytes(t, y.numel(), row))
    throw UserError("[gguf] tensor data has the wrong size for its shape");
  if (BlockDecoder dec = block_decoder(t)) {
    const TypeTraits tt = traits(t);
    const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
    float* dst = y.data_ptr<float>();
    for (int64_t b = 0; b < y.numel() / tt.block; ++b)
      dec(src + b * tt.block_bytes, dst + b * tt.block);
    return y;
  }
  auto raw = torch::empty(shape, float_type(t));
  std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
  return raw.to(torch::kFloat32);
}

} // namespace orchard::gguf
