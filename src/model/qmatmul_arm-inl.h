// qmatmul.cc's AArch64 kernels, defined once (not per Highway target):
// Q8_0, Q4_0 and Q4_K rows times int8 activations with the dot-product
// instruction (SDOT, FEAT_DotProd) and Q8_0 / Q4_0 tiles of two rows and two
// tokens with the matrix-multiply instruction (SMMLA, FEAT_I8MM), as
// llama.cpp does on Graviton and Apple silicon. Debian's Highway has no
// targets for either, so they are ACLE intrinsics under target attributes;
// model/matmul_kernels.cc asks the kernel (getauxval) whether the CPU has
// them. Included by model/qmatmul.cc only, after model/qmatmul_bytes-inl.h.
//
// Numerics: every block's integer dot is exact (as in the twin); a row and
// token then accumulates, block after block,
//   acc += float(dot) * (d_w * d_x)
// in that order and rounding in both kernels (SMMLA's four lanes do the same
// three operations as the scalar code), so a token's outputs do not depend
// on whether it went through a tile or alone, nor on which rows shared a
// pass: the bits are the same for any thread count and split.
#pragma once

#include <cstdint>
#include <cstring>

#include "model/kquant_scales.h"

#if defined(__aarch64__) && defined(__GNUC__)
#define ANCHORKV_ARM_KERNELS 1
#include <arm_neon.h>

namespace anchorkv::model {
namespace {

#define ANCHORKV_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define ANCHORKV_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))

// An fp16 scale, converted in a register (exact, as core::half_to_float).
HWY_INLINE float f16_scale(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

// A Q8_0 (34 bytes: fp16 d, 32 int8) or Q4_0 block's (18 bytes: fp16 d, 16
// bytes; element i the low nibble of byte i, 16 + i its high nibble, value
// q - 8) 32 values as two vectors of int8.
template <bool kQ4>
HWY_INLINE void block_values(const uint8_t* blk, int8x16_t* lo, int8x16_t* hi) {
  if constexpr (kQ4) {
    const uint8x16_t v = vld1q_u8(blk + 2);
    const int8x16_t eight = vdupq_n_s8(8);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), eight);
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);
  } else {
    *lo = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
    *hi = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
  }
}

// n_rows (1-4) Q8_0 or Q4_0 rows, row_bytes apart, times one token's
// activations x (groups of 32, scales xs): out[r] = row r's dot.
template <bool kQ4>
ANCHORKV_DOTPROD void rows_sdot(const uint8_t* rows, int64_t row_bytes, int n_rows, int64_t nb, const int8_t* x,
                                const float* xs, float* out) {
  constexpr int64_t kBlock = kQ4 ? 18 : 34;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = 0; b < nb; ++b) {
    const int8x16_t x0 = vld1q_s8(x + 32 * b), x1 = vld1q_s8(x + 32 * b + 16);
    for (int r = 0; r < n_rows; ++r) {
      const uint8_t* blk = rows + r * row_bytes + b * kBlock;
      __builtin_prefetch(blk + kPrefetchBytes);
      int8x16_t w0, w1;
      block_values<kQ4>(blk, &w0, &w1);
      const int32_t dot = vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1));
      acc[r] += static_cast<float>(dot) * (f16_scale(blk) * xs[b]);
    }
  }
  for (int r = 0; r < n_rows; ++r) out[r] = acc[r];
}

// Two Q8_0 or Q4_0 rows (row_bytes apart) times two tokens' activations
// (x[0], x[1] with scales xs[0], xs[1]): SMMLA multiplies a 2x8 block of
// rows by an 8x2 block of tokens into the four int32 dots [r0 t0, r0 t1,
// r1 t0, r1 t1], four times per 32-value block. out[r * 2 + t].
template <bool kQ4>
ANCHORKV_I8MM void tile_smmla(const uint8_t* rows, int64_t row_bytes, int64_t nb, const int8_t* const* x,
                              const float* const* xs, float* out) {
  constexpr int64_t kBlock = kQ4 ? 18 : 34;
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* b0 = rows + b * kBlock;
    const uint8_t* b1 = b0 + row_bytes;
    __builtin_prefetch(b0 + kPrefetchBytes);
    __builtin_prefetch(b1 + kPrefetchBytes);
    int8x16_t w[2][2];  // [row][half]
    block_values<kQ4>(b0, &w[0][0], &w[0][1]);
    block_values<kQ4>(b1, &w[1][0], &w[1][1]);
    int32x4_t dots = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const int64x2_t r0 = vreinterpretq_s64_s8(w[0][h]), r1 = vreinterpretq_s64_s8(w[1][h]);
      const int64x2_t t0 = vreinterpretq_s64_s8(vld1q_s8(x[0] + 32 * b + 16 * h));
      const int64x2_t t1 = vreinterpretq_s64_s8(vld1q_s8(x[1] + 32 * b + 16 * h));
      // 8 values of each row (token) side by side: the low halves, then the high ones
      dots = vmmlaq_s32(dots, vreinterpretq_s8_s64(vzip1q_s64(r0, r1)), vreinterpretq_s8_s64(vzip1q_s64(t0, t1)));
      dots = vmmlaq_s32(dots, vreinterpretq_s8_s64(vzip2q_s64(r0, r1)), vreinterpretq_s8_s64(vzip2q_s64(t0, t1)));
    }
    const float d0 = f16_scale(b0), d1 = f16_scale(b1);
    const float dw[4] = {d0, d0, d1, d1}, dx[4] = {xs[0][b], xs[1][b], xs[0][b], xs[1][b]};
    const float32x4_t scale = vmulq_f32(vld1q_f32(dw), vld1q_f32(dx));
    acc = vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(dots), scale));
  }
  vst1q_f32(out, acc);
}

// n_rows (1-4) Q4_K rows (144-byte super-blocks of 256: d, dmin, 12 bytes of
// 6-bit sub-scales and minimums, 128 bytes of nibbles; chunk c's 32 bytes
// hold sub-block 2c in their low nibbles and 2c + 1 in their high ones,
// value d * sc * q - dmin * m) times one token (x in groups of 256, scales
// xs, per-32 sums `sums`): out[r] = row r's dot.
ANCHORKV_DOTPROD void rows_q4_k_sdot(const uint8_t* rows, int64_t row_bytes, int n_rows, int64_t nsb,
                                     const int8_t* x, const float* xs, const int32_t* sums, float* out) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, mins[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint8x16_t nibble = vdupq_n_u8(0x0f);
  for (int64_t b = 0; b < nsb; ++b) {
    const int8_t* xb = x + 256 * b;
    for (int r = 0; r < n_rows; ++r) {
      const uint8_t* blk = rows + r * row_bytes + b * 144;
      __builtin_prefetch(blk + kPrefetchBytes);
      __builtin_prefetch(blk + kPrefetchBytes + 64);
      uint8_t sc[8], m[8];
      unpack_scales_k4(blk + 4, sc, m);
      int32x4_t sum = vdupq_n_s32(0);
      for (int c = 0; c < 4; ++c) {
        const uint8x16_t v0 = vld1q_u8(blk + 16 + 32 * c), v1 = vld1q_u8(blk + 32 + 32 * c);
        const int8_t* xc = xb + 64 * c;
        int32x4_t lo = vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(v0, nibble)), vld1q_s8(xc));
        lo = vdotq_s32(lo, vreinterpretq_s8_u8(vandq_u8(v1, nibble)), vld1q_s8(xc + 16));
        int32x4_t hi = vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), vld1q_s8(xc + 32));
        hi = vdotq_s32(hi, vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), vld1q_s8(xc + 48));
        sum = vmlaq_n_s32(sum, lo, sc[2 * c]);
        sum = vmlaq_n_s32(sum, hi, sc[2 * c + 1]);
      }
      int32_t msum = 0;
      for (int j = 0; j < 8; ++j) msum += m[j] * sums[8 * b + j];
      acc[r] += static_cast<float>(vaddvq_s32(sum)) * (f16_scale(blk) * xs[b]);
      mins[r] += static_cast<float>(msum) * (f16_scale(blk + 2) * xs[b]);
    }
  }
  for (int r = 0; r < n_rows; ++r) out[r] = acc[r] - mins[r];
}

#undef ANCHORKV_DOTPROD
#undef ANCHORKV_I8MM

// Rows [r0, r0 + n) of W for every token of `a` through the kernels above:
// tiles of 16 rows that stay in L2 while the tokens pass, token pairs in
// SMMLA tiles where k allows it, the rest four rows per pass with SDOT.
// False (nothing done) where these kernels do not take W's type or k has
// none of them.
bool arm_rows(const QuantMatrix& W, int64_t r0, int64_t n, const Int8Activations& a, float* y,
              const MatmulKernels& k) {
  const bool q8 = W.type == io::GgmlType::kQ8_0, q4 = W.type == io::GgmlType::kQ4_0;
  const bool q4k = W.type == io::GgmlType::kQ4_K;
  if (!k.dot_rows || W.layout != QuantLayout::kGguf || !(q8 || q4 || q4k)) return false;
  const int64_t groups = a.cols / a.group;
  auto token = [&](int64_t t) { return &a.q8[static_cast<size_t>(t * a.cols)]; };
  auto scales = [&](int64_t t) { return &a.scale[static_cast<size_t>(t * groups)]; };
  auto rows_one_token = [&](int64_t r, int n_rows, int64_t t, float* out) {
    const uint8_t* rows = W.blocks + r * W.row_bytes;
    if (q4k)
      rows_q4_k_sdot(rows, W.row_bytes, n_rows, a.cols / 256, token(t), scales(t),
                     &a.sum[static_cast<size_t>(t * (a.cols / 32))], out);
    else
      (q4 ? rows_sdot<true> : rows_sdot<false>)(rows, W.row_bytes, n_rows, a.cols / 32, token(t), scales(t), out);
  };
  const bool tiles = k.mmla_rows && !q4k;
  constexpr int64_t kTileRows = 16;
  for (int64_t tile = r0; tile < r0 + n; tile += kTileRows) {
    const int64_t end = std::min(r0 + n, tile + kTileRows);
    int64_t t = 0;
    for (; tiles && t + 2 <= a.T; t += 2) {
      const int8_t* x[2] = {token(t), token(t + 1)};
      const float* xs[2] = {scales(t), scales(t + 1)};
      int64_t r = tile;
      for (; r + 2 <= end; r += 2) {
        float out[4];
        (q4 ? tile_smmla<true> : tile_smmla<false>)(W.blocks + r * W.row_bytes, W.row_bytes, a.cols / 32, x, xs,
                                                    out);
        for (int i = 0; i < 4; ++i) y[(t + i % 2) * W.rows + r + i / 2] = out[i];
      }
      for (; r < end; ++r)
        for (int64_t u = t; u < t + 2; ++u) rows_one_token(r, 1, u, &y[u * W.rows + r]);
    }
    for (; t < a.T; ++t)
      for (int64_t r = tile; r < end; r += 4) {
        const int n_rows = static_cast<int>(std::min<int64_t>(4, end - r));
        float out[4];
        rows_one_token(r, n_rows, t, out);
        for (int i = 0; i < n_rows; ++i) y[t * W.rows + r + i] = out[i];
      }
  }
  return true;
}

}  // namespace
}  // namespace anchorkv::model
#endif  // __aarch64__
