// qmatmul.cc's helpers defined once (not per SIMD target): the constants
// and row geometry its kernels share, and the x86 byte kernels (AVX-512BW and
// VNNI intrinsics under target attributes) with their CPU checks. Included by
// model/qmatmul.cc only, before its per-target code: an anonymous namespace,
// so nothing here is part of any interface.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/half.h"
#include "model/kquant_scales.h"
#include "model/qmatmul.h"

namespace anchorkv::model {
namespace {

// Tokens whose activations one pass over a weight row serves.
constexpr int kMaxTokens = 4;
// How far ahead of the row being read weights are prefetched.
constexpr int64_t kPrefetchBytes = 4096;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ANCHORKV_BYTE_KERNELS 1
// GCC 12 warns inside its own AVX-512 headers (their _mm512_undefined_*
// placeholders) once they are inlined under a target attribute.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Q4_K rows with bytes: a 64-byte load holds chunks c and c + 1 (sub-blocks
// 2c / 2c + 2 in the low nibbles, 2c + 1 / 2c + 3 in the high ones); their
// activations are two 32-byte halves each. vpmaddubsw multiplies unsigned
// nibbles by signed bytes and adds pairs into int16 (|sum| <= 2 * 15 * 128,
// no saturation), vpmaddwd multiplies those by the sub-scales and adds pairs
// into int32. out[t] = this row's dot for token t.
#define ANCHORKV_AVX512BW __attribute__((target("avx512f,avx512bw,f16c"), always_inline)) inline
// An fp16 scale, converted in a register (a library call per block costs more than the block).
ANCHORKV_AVX512BW float f16_in_register(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// 32 bytes at a, then 32 at b (a masked load fills the high half: qwords
// 4..7 read from b - 32 + 32; the masked-out ones are never touched).
ANCHORKV_AVX512BW __m512i halves(const int8_t* a, const int8_t* b) {
  return _mm512_mask_loadu_epi64(_mm512_maskz_loadu_epi64(0x0F, a), 0xF0, b - 32);
}
// int16 lanes: a in the low 256 bits, b in the high.
ANCHORKV_AVX512BW __m512i scales(uint8_t a, uint8_t b) {
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(a), _mm512_set1_epi16(b));
}
#undef ANCHORKV_AVX512BW

// n_rows rows (row_bytes apart) times n_tok tokens, n_rows * n_tok <= 4:
// out[r * n_tok + t]. Decode passes four rows of one token, so the token's
// activations are loaded once per four rows.
__attribute__((target("avx512f,avx512bw,f16c"))) void rows_q4_k_bytes(const uint8_t* rows, int64_t row_bytes,
                                                                   int n_rows, int64_t nb, int n_tok,
                                                                   const int8_t* const* x, const float* const* xs,
                                                                   const int32_t* const* sums, float* out) {
  constexpr int kMaxPairs = 4;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc[kMaxPairs];
  float min_acc[kMaxPairs];
  for (int i = 0; i < n_rows * n_tok; ++i) {
    acc[i] = _mm512_setzero_ps();
    min_acc[i] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum[kMaxPairs];
    for (int i = 0; i < n_rows * n_tok; ++i) isum[i] = _mm512_setzero_si512();
    uint8_t sc[kMaxPairs][8], m[kMaxPairs][8];
    for (int r = 0; r < n_rows; ++r) {
      const uint8_t* blk = rows + r * row_bytes + b * 144;
      _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
      unpack_scales_k4(blk + 4, sc[r], m[r]);
    }
    for (int i = 0; i < 2; ++i) {  // chunks 2i and 2i + 1
      for (int t = 0; t < n_tok; ++t) {
        const int8_t* xb = x[t] + b * 256 + 128 * i;
        const __m512i x_lo = halves(xb, xb + 64), x_hi = halves(xb + 32, xb + 96);
        for (int r = 0; r < n_rows; ++r) {
          const __m512i q = _mm512_loadu_si512(rows + r * row_bytes + b * 144 + 16 + 64 * i);
          const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
          const __m512i s_lo = scales(sc[r][4 * i], sc[r][4 * i + 2]),
                        s_hi = scales(sc[r][4 * i + 1], sc[r][4 * i + 3]);
          __m512i& sum = isum[r * n_tok + t];
          sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(lo, x_lo), s_lo),
                                                       _mm512_madd_epi16(_mm512_maddubs_epi16(hi, x_hi), s_hi)));
        }
      }
    }
    for (int r = 0; r < n_rows; ++r) {
      const uint8_t* blk = rows + r * row_bytes + b * 144;
      const float d = f16_in_register(blk), dmin = f16_in_register(blk + 2);
      for (int t = 0; t < n_tok; ++t) {
        const int at = r * n_tok + t;
        acc[at] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[at]), _mm512_set1_ps(d * xs[t][b]), acc[at]);
        const int32_t* ks = sums[t] + b * 8;
        int32_t mdot = 0;
        for (int j = 0; j < 8; ++j) mdot += static_cast<int32_t>(m[r][j]) * ks[j];
        min_acc[at] += dmin * xs[t][b] * static_cast<float>(mdot);
      }
    }
  }
  for (int i = 0; i < n_rows * n_tok; ++i) out[i] = _mm512_reduce_add_ps(acc[i]) - min_acc[i];
}

// Q6_K rows with bytes. Half h of a super-block (128 elements) takes ql[64h,
// 64h + 64), qh[32h, 32h + 32) and scales[8h, 8h + 8): element 32k + l (k = 0..3,
// l < 32) has low bits from ql[l] / ql[l + 32] (low nibble for k = 0, 1, high
// for k = 2, 3) and high bits 2k of qh[l], scale sc[2k + l / 16], value
// d * sc * (q - 32). One 512-bit register holds k = 0 and 1 (the 64 ql bytes
// as they lie, qh in both halves shifted by 0 and 2), another k = 2 and 3; q is
// unsigned (0..63), so vpmaddubsw takes it as is (pairs <= 2 * 63 * 128) and
// the -32 comes back as 32 * sum(sc * x), from the same instructions on a
// vector of 32s.
__attribute__((target("avx512f,avx512bw,f16c"))) void rows_q6_k_bytes(const uint8_t* rows, int64_t row_bytes,
                                                                   int n_rows, int64_t nb, int n_tok,
                                                                   const int8_t* const* x, const float* const* xs,
                                                                   float* out) {
  constexpr int kMaxPairs = 4;
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03), c32 = _mm512_set1_epi8(32);
  const __m512i shift01 = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_setzero_si512(), _mm512_set1_epi16(2));
  const __m512i shift23 = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(6));
  // byte j of each 128-bit lane picks scale (lane * 2 + j / 8) of the 8 in a 64-bit word
  const __m256i pick01 = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                          3, 3, 3, 3, 3, 3, 3);
  const __m256i pick23 = _mm256_add_epi8(pick01, _mm256_set1_epi8(4));
  __m512 acc[kMaxPairs];
  for (int i = 0; i < n_rows * n_tok; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum[kMaxPairs];
    for (int i = 0; i < n_rows * n_tok; ++i) isum[i] = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {
      for (int r = 0; r < n_rows; ++r) {
        const uint8_t* blk = rows + r * row_bytes + b * 210;
        if (half == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 128), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 192), _MM_HINT_T0);
        }
        const __m512i ql = _mm512_loadu_si512(blk + 64 * half);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * half)));
        const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift01), m2), 4));
        const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift23), m2), 4));
        int64_t sc8;
        std::memcpy(&sc8, blk + 192 + 8 * half, 8);
        const __m256i scb = _mm256_set1_epi64x(sc8);
        const __m512i s01 = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scb, pick01));
        const __m512i s23 = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scb, pick23));
        for (int t = 0; t < n_tok; ++t) {
          const int8_t* xb = x[t] + b * 256 + 128 * half;
          const __m512i x01 = _mm512_loadu_si512(xb), x23 = _mm512_loadu_si512(xb + 64);
          const __m512i dot = _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(q01, x01), s01),
                                               _mm512_madd_epi16(_mm512_maddubs_epi16(q23, x23), s23));
          const __m512i bias = _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(c32, x01), s01),
                                                _mm512_madd_epi16(_mm512_maddubs_epi16(c32, x23), s23));
          __m512i& sum = isum[r * n_tok + t];
          sum = _mm512_add_epi32(sum, _mm512_sub_epi32(dot, bias));
        }
      }
    }
    for (int r = 0; r < n_rows; ++r) {
      const float d = f16_in_register(rows + r * row_bytes + b * 210 + 208);
      for (int t = 0; t < n_tok; ++t) {
        const int at = r * n_tok + t;
        acc[at] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[at]), _mm512_set1_ps(d * xs[t][b]), acc[at]);
      }
    }
  }
  for (int i = 0; i < n_rows * n_tok; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

#define ANCHORKV_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
// The integer dot of one block with the token's 32 activations xv, in eight
// int32 lanes. Q8_0: |w| (unsigned) times x with w's sign (vpsignb twice;
// activations are within +-127, so the sign flip cannot overflow). Q4_0:
// the unsigned nibbles (low ones for elements 0-15, high ones for 16-31)
// as they are; the -8 offset is the caller's.
ANCHORKV_VNNI __attribute__((always_inline)) inline __m256i q8_0_dot(const uint8_t* blk, __m256i xv) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
}
ANCHORKV_VNNI __attribute__((always_inline)) inline __m256i q4_0_dot(const uint8_t* blk, __m256i xv) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)), m4 = _mm_set1_epi8(0x0f);
  const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, xv);
}
// acc[r] += block b of row r times the token's block b; for Q4_0, off[r]
// takes the block's -8 offset (-8 * its activation sum, scaled).
template <int kRows, bool kQ4>
ANCHORKV_VNNI __attribute__((always_inline)) inline void vnni_block(const uint8_t* rows, int64_t row_bytes, int64_t b,
                                                                  const int8_t* x, const float* xs,
                                                                  const int32_t* sums, __m256* acc, float* off) {
  constexpr int64_t kBlockBytes = kQ4 ? io::kQ4_0Block.bytes : io::kQ8_0Block.bytes;
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + b * 32));
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* blk = rows + r * row_bytes + b * kBlockBytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    const __m256i dot = kQ4 ? q4_0_dot(blk, xv) : q8_0_dot(blk, xv);
    const float scale = f16_in_register(blk) * xs[b];
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale), acc[r]);
    if constexpr (kQ4) off[r] += scale * static_cast<float>(-8 * sums[b]);
  }
}
template <int kRows, bool kQ4>
ANCHORKV_VNNI void rows_vnni(const uint8_t* rows, int64_t row_bytes, int64_t nb, const int8_t* x, const float* xs,
                             const int32_t* sums, float* out) {
  __m256 even[kRows], odd[kRows];  // even and odd blocks apart: two chains of adds per row
  float off[kRows];
  for (int r = 0; r < kRows; ++r) even[r] = odd[r] = _mm256_setzero_ps(), off[r] = 0.0f;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    vnni_block<kRows, kQ4>(rows, row_bytes, b, x, xs, sums, even, off);
    vnni_block<kRows, kQ4>(rows, row_bytes, b + 1, x, xs, sums, odd, off);
  }
  if (b < nb) vnni_block<kRows, kQ4>(rows, row_bytes, b, x, xs, sums, even, off);
  for (int r = 0; r < kRows; ++r) {
    const __m256 v = _mm256_add_ps(even[r], odd[r]);
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    out[r] = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
    if constexpr (kQ4) out[r] += off[r];
  }
}
// Q8_0 or Q4_0 rows of one token with bytes and VNNI on 256-bit lanes (as
// ggml's dot product): per 32-element block, vpdpbusd adds groups of four
// products into eight int32 lanes, exactly the block's integer dot; one float
// conversion and multiply-add by the two scales. A row's arithmetic is the
// same whichever of 1-4 rows pass together (which depends on where a
// thread's range starts). sums: the activations' per-32 sums (Q4_0's offset).
// out[r] = row r's dot.
template <bool kQ4>
void rows_vnni(const uint8_t* rows, int64_t row_bytes, int n_rows, int64_t nb, const int8_t* x, const float* xs,
               const int32_t* sums, float* out) {
  switch (n_rows) {
    case 4: return rows_vnni<4, kQ4>(rows, row_bytes, nb, x, xs, sums, out);
    case 3: return rows_vnni<3, kQ4>(rows, row_bytes, nb, x, xs, sums, out);
    case 2: return rows_vnni<2, kQ4>(rows, row_bytes, nb, x, xs, sums, out);
    default: return rows_vnni<1, kQ4>(rows, row_bytes, nb, x, xs, sums, out);
  }
}

// The activations of up to four tokens, as the kRows16 kernels read them.
struct TokenRows {
  const int8_t* x[4];
  const float* xs[4];     // per activation group
  const int32_t* sums[4]; // per 32 elements
};

// One kRows16 Q8_0 or Q4_0 group (16 rows; qmatmul.h has the layouts) times
// kTok tokens. Per block, four steps each give two 64-byte vectors of four
// unsigned weight bytes per row (Q8_0: two loads of w + 128; Q4_0: one load,
// its low and high nibbles) and the offsets of the token's four matching
// bytes; vpdpbusd of each by those bytes, broadcast, sums each row's products
// into its own int32 lane, exactly; the offset (128 or 8) times the
// activations' per-32 sum comes back off, then one float conversion and
// multiply-add by the 16 rows' scales times the token's. A token's
// arithmetic is the same whatever kTok. out[t]: the 16 rows' dots.
template <int kTok, bool kQ4>
ANCHORKV_VNNI void group_32(const uint8_t* group, int64_t cols, const TokenRows& a, __m512* out) {
  constexpr int64_t kBlockBytes = kQ4 ? 256 : 512;
  constexpr int32_t kOffset = kQ4 ? 8 : 128;
  const int64_t nb = cols / 32;
  const uint8_t* scales = group + nb * kBlockBytes;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[kTok];
  for (int t = 0; t < kTok; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* w = group + b * kBlockBytes;
    _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + kBlockBytes / 2), _MM_HINT_T0);
    __m512i lo[kTok], hi[kTok];  // two chains of vpdpbusd per token
    for (int t = 0; t < kTok; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
      __m512i wl, wh;
      int64_t xl, xh;  // where the token's bytes for wl and wh start in the block
      if constexpr (kQ4) {
        const __m512i v = _mm512_loadu_si512(w + 64 * i);
        wl = _mm512_and_si512(v, nibble), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        xl = 4 * i, xh = 16 + 4 * i;
      } else {
        wl = _mm512_loadu_si512(w + 128 * i), wh = _mm512_loadu_si512(w + 128 * i + 64);
        xl = 8 * i, xh = 8 * i + 4;
      }
      for (int t = 0; t < kTok; ++t) {
        int32_t x0, x1;
        std::memcpy(&x0, a.x[t] + b * 32 + xl, 4);
        std::memcpy(&x1, a.x[t] + b * 32 + xh, 4);
        lo[t] = _mm512_dpbusd_epi32(lo[t], wl, _mm512_set1_epi32(x0));
        hi[t] = _mm512_dpbusd_epi32(hi[t], wh, _mm512_set1_epi32(x1));
      }
    }
    const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + b * 32)));
    for (int t = 0; t < kTok; ++t) {
      const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(lo[t], hi[t]), _mm512_set1_epi32(kOffset * a.sums[t][b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(ws, _mm512_set1_ps(a.xs[t][b])), acc[t]);
    }
  }
  for (int t = 0; t < kTok; ++t) out[t] = acc[t];
}

// One kRows16 Q4_K or Q5_K group times kTok tokens, per super-block: each
// 64-byte load holds four nibble bytes of the 16 rows, low nibbles of
// sub-block 2c and high ones of 2c + 1 (Q5_K: each row's byte of fifth bits
// for them, bits 0-3 and 4-7, added as 16 under a byte mask); vpdpbusd of
// each by the token's four bytes gives the sub-blocks' exact dots D_j per
// row, then in int32 P = sum_j sc_j D_j and M = sum_j m_j S_j (S_j: the
// activations' per-32 sums), and y += xs (d P - dmin M) in float once per
// super-block (P < 8 * 63 * 32 * 31 * 127 < 2^31).
template <int kTok, bool kFive>
ANCHORKV_VNNI void group_q45_k(const uint8_t* group, int64_t cols, const TokenRows& a, __m512* out) {
  constexpr KRows16 L = KRows16::of(kFive);
  const __m512i nibble = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(16);
  // A row's byte of fifth bits to all four bytes of its lane, then bit j of
  // it (4 + j) to byte j's low (high) element.
  const __m512i spread = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0x00000000);
  const __m512i bits_lo = _mm512_set1_epi32(0x08040201), bits_hi = _mm512_set1_epi32(static_cast<int>(0x80402010u));
  __m512 acc[kTok];
  for (int t = 0; t < kTok; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < cols / 256; ++s) {
    const uint8_t* blk = group + s * L.bytes;
    __m512i P[kTok], M[kTok];
    for (int t = 0; t < kTok; ++t) P[t] = M[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const uint8_t* w = blk + c * 512;
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + 256), _MM_HINT_T0);
      __m512i lo[kTok], hi[kTok];
      for (int t = 0; t < kTok; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        const __m512i v = _mm512_loadu_si512(w + 64 * k);
        __m512i wl = _mm512_and_si512(v, nibble), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        if constexpr (kFive) {
          const __m512i h = _mm512_shuffle_epi8(
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.high + (c * 8 + k) * 16))),
              spread);
          wl = _mm512_mask_add_epi8(wl, _mm512_test_epi8_mask(h, bits_lo), wl, sixteen);
          wh = _mm512_mask_add_epi8(wh, _mm512_test_epi8_mask(h, bits_hi), wh, sixteen);
        }
        for (int t = 0; t < kTok; ++t) {
          int32_t xl, xh;
          std::memcpy(&xl, a.x[t] + s * 256 + 64 * c + 4 * k, 4);
          std::memcpy(&xh, a.x[t] + s * 256 + 64 * c + 32 + 4 * k, 4);
          lo[t] = _mm512_dpbusd_epi32(lo[t], wl, _mm512_set1_epi32(xl));
          hi[t] = _mm512_dpbusd_epi32(hi[t], wh, _mm512_set1_epi32(xh));
        }
      }
      const __m512i sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.sc + 32 * c)));
      const __m512i sc_hi =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.sc + 32 * c + 16)));
      for (int t = 0; t < kTok; ++t)
        P[t] = _mm512_add_epi32(P[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sc_lo), _mm512_mullo_epi32(hi[t], sc_hi)));
    }
    for (int j = 0; j < 8; ++j) {
      const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.m + 16 * j)));
      for (int t = 0; t < kTok; ++t)
        M[t] = _mm512_add_epi32(M[t], _mm512_mullo_epi32(m, _mm512_set1_epi32(a.sums[t][s * 8 + j])));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L.d)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L.dmin)));
    for (int t = 0; t < kTok; ++t) {
      const __m512 xs = _mm512_set1_ps(a.xs[t][s]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P[t]), _mm512_mul_ps(d, xs), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[t]), _mm512_mul_ps(dmin, xs), acc[t]);
    }
  }
  for (int t = 0; t < kTok; ++t) out[t] = acc[t];
}

// Rows [r0, r0 + n) of a kRows16 matrix for every token of a: y[t * W.rows
// + r]. Tokens four at a time over each group of 16 rows.
template <io::GgmlType kType>
ANCHORKV_VNNI void rows16(const QuantMatrix& W, int64_t r0, int64_t n, const Int8Activations& a, float* y) {
  const int64_t group_bytes = rows16_group_bytes(W.type, W.cols);
  for (int64_t g = r0 / 16; g * 16 < r0 + n; ++g) {
    const uint8_t* group = W.blocks + g * group_bytes;
    const int64_t lo = std::max(r0, g * 16), hi = std::min(r0 + n, g * 16 + 16);
    for (int64_t t = 0; t < a.T; t += 4) {
      const int kt = static_cast<int>(std::min<int64_t>(4, a.T - t));
      TokenRows x;
      for (int i = 0; i < kt; ++i) {
        x.x[i] = &a.q8[static_cast<size_t>((t + i) * a.cols)];
        x.xs[i] = &a.scale[static_cast<size_t>((t + i) * (a.cols / a.group))];
        x.sums[i] = &a.sum[static_cast<size_t>((t + i) * (a.cols / 32))];
      }
      __m512 out[4];
      auto kernel = [&](auto tok) {
        if constexpr (kType == io::GgmlType::kQ4_K || kType == io::GgmlType::kQ5_K)
          group_q45_k<decltype(tok)::value, kType == io::GgmlType::kQ5_K>(group, W.cols, x, out);
        else
          group_32<decltype(tok)::value, kType == io::GgmlType::kQ4_0>(group, W.cols, x, out);
      };
      switch (kt) {
        case 4: kernel(std::integral_constant<int, 4>{}); break;
        case 3: kernel(std::integral_constant<int, 3>{}); break;
        case 2: kernel(std::integral_constant<int, 2>{}); break;
        default: kernel(std::integral_constant<int, 1>{}); break;
      }
      for (int i = 0; i < kt; ++i) {
        alignas(64) float lanes[16];
        _mm512_store_ps(lanes, out[i]);
        std::copy(lanes + (lo - g * 16), lanes + (hi - g * 16), y + (t + i) * W.rows + lo);
      }
    }
  }
}
#undef ANCHORKV_VNNI

#pragma GCC diagnostic pop

#endif

}  // namespace
}  // namespace anchorkv::model
