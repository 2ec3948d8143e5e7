// Dequantization of GGML tensor rows to f32, following the block layouts of
// ggml's reference `dequantize_row_*` (ggml-common.h / ggml-quants.c). All
// multi-byte fields are little-endian; fp16 scales are IEEE half.
//
//   type  block  bytes  layout
//   Q4_0   32     18    d, qs[16]                 x = d * (q - 8)
//   Q4_1   32     20    d, m, qs[16]              x = d * q + m
//   Q5_0   32     22    d, qh[4], qs[16]          x = d * (q - 16), q = 4 low bits | high bit from qh
//   Q5_1   32     24    d, m, qh[4], qs[16]       x = d * q + m
//   Q8_0   32     34    d, qs[32] (int8)          x = d * q
//   Q2_K  256     84    scales[16], qs[64], d, dmin          16 groups of 16, 4-bit scale + 4-bit min
//   Q3_K  256    110    hmask[32], qs[64], scales[12], d     16 groups of 16, 6-bit signed scales
//   Q4_K  256    144    d, dmin, scales[12], qs[128]         8 groups of 32, 6-bit scale + 6-bit min
//   Q5_K  256    176    d, dmin, scales[12], qh[32], qs[128] as Q4_K plus a fifth bit
//   Q6_K  256    210    ql[128], qh[64], scales[16] (int8), d  16 groups of 16
#include <cstdint>
#include <cstring>
#include <string>

#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
#include "io/dequant_simd.h"
#include "io/gguf.h"

namespace anchorkv::io {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return core::half_to_float(h);
}

// The 6-bit scale and min of group j (0..7) in the 12 packed bytes of Q4_K / Q5_K:
// bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; groups 4-7 take
// their low 4 bits from bytes 8-11 and their high 2 bits from the top of bytes 0-7.
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>((b[2 + i] & 0x0F) - 8);
    y[i + 16] = d * static_cast<float>((b[2 + i] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(b[4 + i] & 0x0F) + m;
    y[i + 16] = d * static_cast<float>(b[4 + i] >> 4) + m;
  }
}

// Q5_0 / Q5_1: bit j of qh is the fifth bit of element j (0..31).
void q5(const uint8_t* b, float* y, bool with_min) {
  const float d = f16_at(b), m = with_min ? f16_at(b + 2) : 0.0f;
  const uint8_t* p = b + (with_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  const int offset = with_min ? 0 : 16;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 0x0F) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = d * static_cast<float>(lo - offset) + m;
    y[i + 16] = d * static_cast<float>(hi - offset) + m;
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
}

void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  int is = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
      }
}

void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  const float d = f16_at(b + 108);
  // 16 six-bit scales: low 4 bits from bytes 0-7 (low nibbles give scales 0-7,
  // high nibbles 8-15), high 2 bits from bytes 8-11 (scale i: byte 8 + i % 4, bits 2 * (i / 4)).
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? (packed[i] & 0xF) : (packed[i - 8] >> 4);
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
  int is = 0;
  uint8_t m = 1;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1))
      for (int part = 0; part < 2; ++part) {
        const float dl = d * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int idx = l + 16 * part;
          const int v = ((q[idx] >> shift) & 3) - ((hmask[idx] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
}

// Q4_K and Q5_K: 4 chunks of 64 = two groups of 32 (low nibbles, then high
// nibbles of the same 32 bytes); Q5_K's fifth bit for chunk c sits in bits
// 2c (first group) and 2c + 1 (second group) of qh[l].
void q45_k(const uint8_t* b, float* y, bool five) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = five ? b + 16 : nullptr;
  const uint8_t* ql = b + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c, ql += 32) {
    int sc, m;
    scale_min_k4(2 * c, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(2 * c + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const int h = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) | h) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int h = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
      *y++ = d2 * static_cast<float>((ql[l] >> 4) | h) - m2;
    }
  }
}

void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
}

}  // namespace

bool can_dequantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

namespace {
using BlockFn = void (*)(const uint8_t* block, float* out);

// The scalar decoder of one block of `type` (nullptr for the element types).
BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return q4_0;
    case GgmlType::kQ4_1: return q4_1;
    case GgmlType::kQ5_0: return [](const uint8_t* b, float* y) { q5(b, y, false); };
    case GgmlType::kQ5_1: return [](const uint8_t* b, float* y) { q5(b, y, true); };
    case GgmlType::kQ8_0: return q8_0;
    case GgmlType::kQ2_K: return q2_k;
    case GgmlType::kQ3_K: return q3_k;
    case GgmlType::kQ4_K: return [](const uint8_t* b, float* y) { q45_k(b, y, false); };
    case GgmlType::kQ5_K: return [](const uint8_t* b, float* y) { q45_k(b, y, true); };
    case GgmlType::kQ6_K: return q6_k;
    default: return nullptr;
  }
}

void check_row(GgmlType type, int64_t n, int64_t* be, int64_t* bb) {
  constexpr const char* kOp = "anchorkv::dequantize_row";
  if (!can_dequantize(type) || !ggml_block(type, be, bb))
    core::fail(ErrorCode::kUnsupported, kOp,
               std::string("tensor type ") + ggml_type_name(type) + " is not supported");
  if (n < 0 || n % *be != 0)
    core::fail(ErrorCode::kInvalidArgument, kOp,
               std::to_string(n) + " elements is not a multiple of the " + ggml_type_name(type) +
                   " block of " + std::to_string(*be));
}

// The scalar path, after check_row.
void dequantize_checked(GgmlType type, const uint8_t* src, int64_t n, int64_t be, int64_t bb, float* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      if (reinterpret_cast<uintptr_t>(src) % alignof(uint16_t) == 0) {
        core::f16_to_f32_n(reinterpret_cast<const uint16_t*>(src), dst, n);  // SIMD
      } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = core::bf16_to_float(h);
      }
      return;
    default:
      break;
  }
  const BlockFn decode = block_fn(type);
  for (int64_t blk = 0; blk < n / be; ++blk) decode(src + blk * bb, dst + blk * be);
}
}  // namespace

void dequantize_row(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  int64_t be = 0, bb = 0;
  check_row(type, n, &be, &bb);
  const int simd = type == GgmlType::kQ8_0   ? kSimdQ8_0
                   : type == GgmlType::kQ4_0 ? kSimdQ4_0
                   : type == GgmlType::kQ4_K ? kSimdQ4_K
                   : type == GgmlType::kQ6_K ? kSimdQ6_K
                                             : 0;
  if (simd != 0 && dequant_blocks_simd(simd, src, n / be, dst)) return;
  dequantize_checked(type, src, n, be, bb, dst);
}

void dequantize_row_ref(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  int64_t be = 0, bb = 0;
  check_row(type, n, &be, &bb);
  dequantize_checked(type, src, n, be, bb, dst);
}

}  // namespace anchorkv::io
