// Integer matmuls on quantized weights (qmatmul.h has the numerics). One
// kernel per weight type decodes a block's integers in registers (never to
// memory) and multiplies them with up to kMaxTokens tokens' activations, so in
// prefill a weight block is decoded once for several tokens.
#include "model/qmatmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "io/ggml_blocks.h"
#include "model/amx_matmul.h"
#include "model/kquant_scales.h"
#include "model/matmul_kernels.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/qmatmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "core/vec_array-inl.h"
// clang-format on

// The helpers are defined once, before the per-target code.
#include "model/qmatmul_bytes-inl.h"
#include "model/qmatmul_arm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// At most 32 int16 lanes: one 32-element block per vector.
using D16 = hn::CappedTag<int16_t, 32>;
using D32 = hn::Repartition<int32_t, D16>;
using DF = hn::Rebind<float, D32>;
using V16 = hn::Vec<D16>;
// The K-quants' eight minimums per super-block.
using D8 = hn::CappedTag<int32_t, 8>;
using DF8 = hn::Rebind<float, D8>;
using VF8 = hn::Vec<DF8>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;
template <class D, int N>
using Accumulators = core::HWY_NAMESPACE::VecArray<D, N>;

// The quantized activations of kTok tokens, each at its token's first element.
template <int kTok>
struct Tokens {
  const int16_t* q[kTok];
};

// Integer dot-product accumulators of kTok tokens.
template <int kTok>
struct IntSums {
  // A written constructor: GCC will not inline the implicit one into the
  // NEON target's functions ("target specific option mismatch").
  IntSums() {}
  void zero() {
    for (int t = 0; t < kTok; ++t) a.set(t, hn::Zero(D32())), b.set(t, hn::Zero(D32()));
  }
  // sums[t] += w . x_t[0 .. lanes)
  template <int kT = kTok>
  void add(V16 w, const int16_t* const* x, int64_t offset) {
    for (int t = 0; t < kT; ++t) add_one(t, w, hn::LoadU(D16(), x[t] + offset));
  }
  // sums[t] += w . xv
  HWY_INLINE void add_one(int t, V16 w, V16 xv) {
    V32 odd = b.get(t);
    a.set(t, hn::ReorderWidenMulAccumulate(D32(), w, xv, a.get(t), odd));
    b.set(t, odd);
  }
  // acc[first + t] += float(sums[t]) * scale * token scale
  template <int kAcc>
  void flush(float scale, const float* tok_scale, Accumulators<DF, kAcc>& acc, int first) const {
    for (int t = 0; t < kTok; ++t)
      acc.set(first + t, hn::MulAdd(hn::ConvertTo(DF(), hn::RearrangeToOddPlusEven(a.get(t), b.get(t))),
                                    hn::Set(DF(), scale * tok_scale[t]), acc.get(first + t)));
  }

 private:
  Accumulators<D32, kTok> a, b;  // b: the odd lanes where a target keeps them apart
};

// An fp16 scale, converted in registers (a call would spill the accumulators).
HWY_INLINE float F16(const uint8_t* p) {
  const hn::CappedTag<float, 1> d1;
  return hn::GetLane(hn::PromoteTo(
      d1, hn::LoadU(hn::Rebind<hwy::float16_t, decltype(d1)>(), reinterpret_cast<const hwy::float16_t*>(p))));
}

HWY_INLINE V16 Bytes(const uint8_t* p) {
  return hn::PromoteTo(D16(), hn::LoadU(hn::Rebind<uint8_t, D16>(), p));
}

// Q8_0: 34-byte blocks of 32: d, 32 int8.
template <int kTok>
void RowQ8_0(const uint8_t* row, int64_t nb, Tokens<kTok> x, const float* const* xs,
             Accumulators<DF, 2 * kTok>& acc) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(D16()));
  IntSums<kTok> s;
  for (int64_t b = 0; b < nb; ++b, row += io::kQ8_0Block.bytes) {
    hwy::Prefetch(row + kPrefetchBytes);
    s.zero();
    const auto* q = reinterpret_cast<const int8_t*>(row + 2);
    for (int64_t i = 0; i < 32; i += N)
      s.add(hn::PromoteTo(D16(), hn::LoadU(hn::Rebind<int8_t, D16>(), q + i)), x.q, b * 32 + i);
    float ts[kTok];
    for (int t = 0; t < kTok; ++t) ts[t] = xs[t][b];
    s.flush(F16(row), ts, acc, (b & 1) * kTok);
  }
}

// Q4_0: 18-byte blocks of 32: d, 16 bytes (element i: low nibble of byte i,
// element 16 + i: high nibble), value q - 8. A vector takes N/2 bytes: their
// low nibbles then their high nibbles, matched by the same halves of x.
template <int kTok>
void RowQ4_0(const uint8_t* row, int64_t nb, Tokens<kTok> x, const float* const* xs,
             Accumulators<DF, 2 * kTok>& acc) {
  const hn::Half<D16> dh;
  const int64_t H = static_cast<int64_t>(hn::Lanes(dh));
  const auto k15 = hn::Set(dh, 15), k8 = hn::Set(dh, 8);
  IntSums<kTok> s;
  for (int64_t b = 0; b < nb; ++b, row += io::kQ4_0Block.bytes) {
    s.zero();
    for (int64_t j = 0; j < 16; j += H) {
      const auto v = hn::PromoteTo(dh, hn::LoadU(hn::Rebind<uint8_t, decltype(dh)>(), row + 2 + j));
      const V16 w = hn::Combine(D16(), hn::Sub(hn::ShiftRight<4>(v), k8), hn::Sub(hn::And(v, k15), k8));
      for (int t = 0; t < kTok; ++t) {
        const int16_t* xt = x.q[t] + b * 32;
        const V16 xv = H == 16 ? hn::LoadU(D16(), xt)
                               : hn::Combine(D16(), hn::LoadU(dh, xt + 16 + j), hn::LoadU(dh, xt + j));
        s.add_one(t, w, xv);
      }
    }
    float ts[kTok];
    for (int t = 0; t < kTok; ++t) ts[t] = xs[t][b];
    s.flush(F16(row), ts, acc, (b & 1) * kTok);
  }
}

// Q4_K (144 bytes) and Q5_K (176 bytes) super-blocks of 256: d, dmin, 12
// bytes of 6-bit sub-scales and minimums, [Q5_K: 32 bytes of fifth bits],
// 128 bytes of nibbles. Chunk c's 32 bytes hold sub-block 2c in their low
// nibbles and 2c + 1 in their high nibbles; Q5_K's fifth bits of those are
// bits 2c and 2c + 1 of qh[l]. Value d * sc * q - dmin * m.
template <bool kFive, int kTok>
void RowQ45_K(const uint8_t* row, int64_t nb, Tokens<kTok> x, const float* const* xs,
              const int32_t* const* sums, Accumulators<DF, 2 * kTok>& acc,
              Accumulators<DF8, kTok>& min_acc) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(D16()));
  const auto k15 = hn::Set(D16(), 15), k1 = hn::Set(D16(), 1);
  IntSums<kTok> s;
  for (int64_t b = 0; b < nb; ++b, row += kFive ? io::kQ5_KBlock.bytes : io::kQ4_KBlock.bytes) {
    const uint8_t* packed = row + 4;
    const uint8_t* qh = row + 16;
    const uint8_t* ql = row + (kFive ? 48 : 16);
    uint8_t sc[8], m[8];
    unpack_scales_k4(packed, sc, m);
    s.zero();
    for (int c = 0; c < 4; ++c) {
      const V16 s_lo = hn::Set(D16(), static_cast<int16_t>(sc[2 * c])),
                s_hi = hn::Set(D16(), static_cast<int16_t>(sc[2 * c + 1]));
      for (int64_t l = 0; l < 32; l += N) {
        const V16 v = Bytes(ql + 32 * c + l);
        V16 lo = hn::And(v, k15), hi = hn::ShiftRight<4>(v);
        if (kFive) {
          const V16 h = Bytes(qh + l);
          lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), k1)));
          hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), k1)));
        }
        s.add(hn::Mul(lo, s_lo), x.q, b * 256 + 64 * c + l);
        s.add(hn::Mul(hi, s_hi), x.q, b * 256 + 64 * c + 32 + l);
      }
    }
    float ts[kTok];
    for (int t = 0; t < kTok; ++t) ts[t] = xs[t][b];
    s.flush(F16(row), ts, acc, (b & 1) * kTok);
    // minus dmin * token scale * sum_j m_j * (sum of q over sub-block j)
    const float dmin = F16(row + 2);
    const int64_t N8 = static_cast<int64_t>(hn::Lanes(D8()));
    for (int t = 0; t < kTok; ++t) {
      const int32_t* ks = sums[t] + b * 8;
      auto dot = hn::Zero(D8());
      for (int64_t j = 0; j < 8; j += N8)
        dot = hn::Add(dot, hn::Mul(hn::PromoteTo(D8(), hn::LoadU(hn::Rebind<uint8_t, D8>(), m + j)),
                                   hn::LoadU(D8(), ks + j)));
      min_acc.set(t, hn::MulAdd(hn::ConvertTo(DF8(), dot), hn::Set(DF8(), dmin * ts[t]), min_acc.get(t)));
    }
  }
}

// Q6_K: 210-byte super-blocks of 256: ql[128], qh[64], 16 int8 scales, d.
// Each half (128 elements) takes 64 ql bytes, 32 qh bytes and 8 scales:
// element l + 32k (k = 0..3) has low bits from ql[l] / ql[l + 32] (low or high
// nibble), high bits from bits 2k of qh[l], scale sc[l / 16 + 2k]; value
// d * sc * (q - 32).
template <int kTok>
void RowQ6_K(const uint8_t* row, int64_t nb, Tokens<kTok> x, const float* const* xs,
             Accumulators<DF, 2 * kTok>& acc) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(D16()));
  const hn::Half<D16> dh;
  const auto k15 = hn::Set(D16(), 15), k3 = hn::Set(D16(), 3), k32 = hn::Set(D16(), 32);
  IntSums<kTok> s;
  for (int64_t b = 0; b < nb; ++b, row += io::kQ6_KBlock.bytes) {
    s.zero();
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = row + 64 * half;
      const uint8_t* qh = row + 128 + 32 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(row + 192 + 8 * half);
      for (int64_t l = 0; l < 32; l += N) {
        // the scales of lanes l .. l + N: one per 16 lanes
        auto scale = [&](int k) -> V16 {
          const int is = static_cast<int>(l / 16) + 2 * k;
          if (N == 32) return hn::Combine(D16(), hn::Set(dh, sc[is + 1]), hn::Set(dh, sc[is]));
          return hn::Set(D16(), sc[is]);
        };
        const V16 a = Bytes(ql + l), a2 = Bytes(ql + l + 32), h = Bytes(qh + l);
        const V16 q1 = hn::Or(hn::And(a, k15), hn::ShiftLeft<4>(hn::And(h, k3)));
        const V16 q2 = hn::Or(hn::And(a2, k15), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(h), k3)));
        const V16 q3 = hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(h), k3)));
        const V16 q4 = hn::Or(hn::ShiftRight<4>(a2), hn::ShiftLeft<4>(hn::ShiftRight<6>(h)));
        const int64_t at = b * 256 + 128 * half + l;
        s.add(hn::Mul(hn::Sub(q1, k32), scale(0)), x.q, at);
        s.add(hn::Mul(hn::Sub(q2, k32), scale(1)), x.q, at + 32);
        s.add(hn::Mul(hn::Sub(q3, k32), scale(2)), x.q, at + 64);
        s.add(hn::Mul(hn::Sub(q4, k32), scale(3)), x.q, at + 96);
      }
    }
    float ts[kTok];
    for (int t = 0; t < kTok; ++t) ts[t] = xs[t][b];
    s.flush(F16(row + 208), ts, acc, (b & 1) * kTok);
  }
}

// y[t * y_stride] for kTok tokens starting at t0, one weight row.
template <int kTok>
void DotRow(const QuantMatrix& W, const uint8_t* row, const Int8Activations& a, int64_t t0, float* y,
            int64_t y_stride, const MatmulKernels& k) {
#ifndef ANCHORKV_BYTE_KERNELS
  (void)k;  // it chooses among the byte kernels only
#endif
  const int64_t groups = a.cols / a.group;
  Tokens<kTok> x;
  const float* xs[kTok];
  const int32_t* sums[kTok];
  // Two accumulators per token, even and odd blocks: one chain of dependent
  // adds per block would bound the loop by the adds' latency.
  Accumulators<DF, 2 * kTok> acc;
  Accumulators<DF8, kTok> min_acc;
  for (int t = 0; t < kTok; ++t) {
    acc.set(kTok + t, hn::Zero(DF()));
    x.q[t] = &a.q[static_cast<size_t>((t0 + t) * a.cols)];
    xs[t] = &a.scale[static_cast<size_t>((t0 + t) * groups)];
    sums[t] = &a.sum[static_cast<size_t>((t0 + t) * (a.cols / 32))];
    acc.set(t, hn::Zero(DF()));
    min_acc.set(t, hn::Zero(DF8()));
  }
  switch (W.type) {
    case io::GgmlType::kQ8_0:
      RowQ8_0<kTok>(row, groups, x, xs, acc);
      break;
    case io::GgmlType::kQ4_0:
      RowQ4_0<kTok>(row, groups, x, xs, acc);
      break;
    case io::GgmlType::kQ4_K:
#ifdef ANCHORKV_BYTE_KERNELS
      if (k.byte_rows) {
        const int8_t* x8[kTok];
        float out[kTok];
        for (int t = 0; t < kTok; ++t) x8[t] = &a.q8[static_cast<size_t>((t0 + t) * a.cols)];
        rows_q4_k_bytes(row, W.row_bytes, 1, groups, kTok, x8, xs, sums, out);
        for (int t = 0; t < kTok; ++t) y[t * y_stride] = out[t];
        return;
      }
#endif
      RowQ45_K<false, kTok>(row, groups, x, xs, sums, acc, min_acc);
      break;
    case io::GgmlType::kQ5_K:
      RowQ45_K<true, kTok>(row, groups, x, xs, sums, acc, min_acc);
      break;
    case io::GgmlType::kQ6_K:
#ifdef ANCHORKV_BYTE_KERNELS
      if (k.byte_rows) {
        const int8_t* x8[kTok];
        float out[kTok];
        for (int t = 0; t < kTok; ++t) x8[t] = &a.q8[static_cast<size_t>((t0 + t) * a.cols)];
        rows_q6_k_bytes(row, W.row_bytes, 1, groups, kTok, x8, xs, out);
        for (int t = 0; t < kTok; ++t) y[t * y_stride] = out[t];
        return;
      }
#endif
      RowQ6_K<kTok>(row, groups, x, xs, acc);
      break;
    default:
      break;
  }
  for (int t = 0; t < kTok; ++t)
    y[t * y_stride] = hn::GetLane(hn::SumOfLanes(DF(), hn::Add(acc.get(t), acc.get(kTok + t)))) -
                      hn::GetLane(hn::SumOfLanes(DF8(), min_acc.get(t)));
}
#endif  // HWY_TARGET != HWY_SCALAR

// Rows [r0, r0 + n) for every token: token blocks of kMaxTokens share each
// pass over a row, through the kernels k allows. False on the scalar target
// (the caller uses the twin).
bool DotRows(const QuantMatrix& W, int64_t r0, int64_t n, const Int8Activations& a, float* y,
             const MatmulKernels& k) {
#if HWY_TARGET == HWY_SCALAR
  (void)W, (void)r0, (void)n, (void)a, (void)y, (void)k;
  return false;
#else
  if (n == 0) return true;  // the caller asks whether this target has the kernels
#ifdef ANCHORKV_ARM_KERNELS
  if (arm_rows(W, r0, n, a, y, k)) return true;
#endif
#ifdef ANCHORKV_BYTE_KERNELS
  if (W.layout == QuantLayout::kRows16) {  // check_matrix: only where the CPU has VNNI
    if (W.type == io::GgmlType::kQ4_K)
      rows16<io::GgmlType::kQ4_K>(W, r0, n, a, y);
    else if (W.type == io::GgmlType::kQ5_K)
      rows16<io::GgmlType::kQ5_K>(W, r0, n, a, y);
    else if (W.type == io::GgmlType::kQ4_0)
      rows16<io::GgmlType::kQ4_0>(W, r0, n, a, y);
    else
      rows16<io::GgmlType::kQ8_0>(W, r0, n, a, y);
    return true;
  }
#endif
  // Tiles of rows small enough to stay in L2 while every token passes over them.
  constexpr int64_t kTileRows = 16;
  for (int64_t tile = r0; tile < r0 + n; tile += kTileRows) {
    const int64_t end = std::min(r0 + n, tile + kTileRows);
    int64_t t = 0;
    for (; t + kMaxTokens <= a.T; t += kMaxTokens)
      for (int64_t r = tile; r < end; ++r)
        DotRow<kMaxTokens>(W, W.blocks + r * W.row_bytes, a, t, y + t * W.rows + r, W.rows, k);
    for (; t < a.T; ++t) {
      int64_t r = tile;
#ifdef ANCHORKV_BYTE_KERNELS
      const bool k4 = W.type == io::GgmlType::kQ4_K, k6 = W.type == io::GgmlType::kQ6_K;
      if ((k4 || k6) && k.byte_rows) {  // four rows per pass share the token's activations
        const int8_t* x8 = &a.q8[static_cast<size_t>(t * a.cols)];
        const float* xs = &a.scale[static_cast<size_t>(t * (a.cols / a.group))];
        const int32_t* sums = &a.sum[static_cast<size_t>(t * (a.cols / 32))];
        for (; r + 4 <= end; r += 4) {
          float out[4];
          const uint8_t* rows = W.blocks + r * W.row_bytes;
          if (k4)
            rows_q4_k_bytes(rows, W.row_bytes, 4, a.cols / 256, 1, &x8, &xs, &sums, out);
          else
            rows_q6_k_bytes(rows, W.row_bytes, 4, a.cols / 256, 1, &x8, &xs, out);
          for (int i = 0; i < 4; ++i) y[t * W.rows + r + i] = out[i];
        }
      }
#endif
#ifdef ANCHORKV_BYTE_KERNELS
      const bool q8 = W.type == io::GgmlType::kQ8_0, q4 = W.type == io::GgmlType::kQ4_0;
      if ((q8 || q4) && k.vnni_rows) {  // four rows per pass; every row the same arithmetic
        const int8_t* x8 = &a.q8[static_cast<size_t>(t * a.cols)];
        const float* xs = &a.scale[static_cast<size_t>(t * (a.cols / 32))];
        const int32_t* sums = &a.sum[static_cast<size_t>(t * (a.cols / 32))];
        for (; r < end; r += 4) {
          const int n_rows = static_cast<int>(std::min<int64_t>(4, end - r));
          float out[4];
          const uint8_t* rows = W.blocks + r * W.row_bytes;
          (q8 ? rows_vnni<false> : rows_vnni<true>)(rows, W.row_bytes, n_rows, a.cols / 32, x8, xs, sums, out);
          for (int i = 0; i < n_rows; ++i) y[t * W.rows + r + i] = out[i];
        }
      }
#endif
      for (; r < end; ++r) DotRow<1>(W, W.blocks + r * W.row_bytes, a, t, y + t * W.rows + r, W.rows, k);
    }
  }
  return true;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::model {

HWY_EXPORT(DotRows);

bool int8_matmul_supported(io::GgmlType type) {
  switch (type) {
    case io::GgmlType::kQ4_0:
    case io::GgmlType::kQ8_0:
    case io::GgmlType::kQ4_K:
    case io::GgmlType::kQ5_K:
    case io::GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

int64_t int8_group(io::GgmlType type) {
  return type == io::GgmlType::kQ4_0 || type == io::GgmlType::kQ8_0 ? io::kQ8_0Block.elems : io::kQ4_KBlock.elems;
}

namespace {
// The types kRows16 has a format for, whatever the CPU.
bool rows16_format(io::GgmlType type) {
  return type == io::GgmlType::kQ8_0 || type == io::GgmlType::kQ4_0 || type == io::GgmlType::kQ4_K ||
         type == io::GgmlType::kQ5_K;
}
}  // namespace

bool rows16_supported(io::GgmlType type) {
#ifdef ANCHORKV_BYTE_KERNELS
  return rows16_format(type) && cpu_matmul_kernels().vnni_rows;
#else
  (void)type;
  return false;
#endif
}

namespace {
constexpr const char* kOp = "anchorkv::matmul_int8";

void check_matrix(const QuantMatrix& W) {
  if (!int8_matmul_supported(W.type))
    core::fail(ErrorCode::kUnsupported, kOp,
               std::string("weights of type ") + io::ggml_type_name(W.type) + " have no integer kernel");
  int64_t be = 0, bb = 0;
  io::ggml_block(W.type, &be, &bb);
  if (W.rows < 0 || W.cols < 0 || W.cols % be != 0 || W.row_bytes != W.cols / be * bb ||
      (W.rows > 0 && W.blocks == nullptr))
    core::fail(ErrorCode::kInvalidArgument, kOp, "matrix shape does not match its block type");
  if (W.layout == QuantLayout::kRows16 && !rows16_format(W.type))
    core::fail(ErrorCode::kInvalidArgument, kOp, "only Q8_0, Q4_0, Q4_K and Q5_K matrices are held in groups of 16 rows");
  if (W.layout == QuantLayout::kRows16 && !rows16_supported(W.type))
    core::fail(ErrorCode::kUnsupported, kOp, "weights in groups of 16 rows need AVX-512 VNNI, which this CPU lacks");
}
}  // namespace

namespace {
// Prefill on AMX tiles: rows in groups of 16 (a matrix's last, partial group
// goes through the row kernels), contiguous ranges of groups per thread.
void matmul_amx_batch(Int8Activations* const acts[2], const bool quantized[2], const QuantMatrix* W,
                      float* const* y, int n, int threads, const MatmulKernels& kernels) {
  thread_local AmxTokens buffers[2];  // named outside the lambda: see matmul_int8_batch
  AmxTokens* packed = buffers;
  auto slot_of = [&](int m) { return int8_group(W[m].type) == 32 ? 0 : 1; };
  bool sums16[2] = {false, false}, token_rows[2] = {false, false};
  for (int m = 0; m < n; ++m) {
    sums16[slot_of(m)] |= W[m].type == io::GgmlType::kQ6_K;
    token_rows[slot_of(m)] |= W[m].layout == QuantLayout::kRows16 && W[m].type == io::GgmlType::kQ8_0;
  }
  for (int slot = 0; slot < 2; ++slot)
    if (quantized[slot]) pack_amx_tokens(*acts[slot], &packed[slot], threads, sums16[slot], token_rows[slot]);
  int64_t total = 0;
  for (int m = 0; m < n; ++m) total += (W[m].rows + 15) / 16;
  const int64_t parts = std::min<int64_t>(core::resolve_threads(threads), std::max<int64_t>(total, 1));
  core::parallel_for(parts, threads, [&](int64_t i) {
    const int64_t begin = total * i / parts, end = total * (i + 1) / parts;
    int64_t first = 0;  // the first group of matrix m in the joined group space
    for (int m = 0; m < n; first += (W[m].rows + 15) / 16, ++m) {
      const int64_t g0 = std::max(begin, first) - first, g1 = std::min(end, first + (W[m].rows + 15) / 16) - first;
      if (g1 <= g0) continue;
      const int64_t r0 = 16 * g0, r1 = std::min(W[m].rows, 16 * g1), whole = (r1 - r0) / 16 * 16;
      if (whole > 0) rows_amx(W[m], r0, whole, packed[slot_of(m)], y[m]);
      if (r0 + whole < r1)
        HWY_DYNAMIC_DISPATCH(DotRows)(W[m], r0 + whole, r1 - r0 - whole, *acts[slot_of(m)], y[m], kernels);
    }
  });
}
}  // namespace

void matmul_int8(const float* x, int64_t T, const QuantMatrix& W, float* y, int threads) {
  matmul_int8_batch(x, T, &W, &y, 1, threads);
}

void matmul_int8_batch(const float* x, int64_t T, const QuantMatrix* W, float* const* y, int n, int threads) {
  if (n <= 0) return;
  for (int m = 0; m < n; ++m) {
    check_matrix(W[m]);
    if (W[m].cols != W[0].cols)
      core::fail(ErrorCode::kInvalidArgument, kOp, "matrices of one batch must share their input width");
  }
  const MatmulKernels kernels = matmul_kernels();  // one choice for the whole call
  if (!HWY_DYNAMIC_DISPATCH(DotRows)(W[0], 0, 0, Int8Activations{}, y[0], kernels)) {
    for (int m = 0; m < n; ++m) matmul_int8_ref(x, T, W[m], y[m]);
    return;
  }
  // Activations once per group size. The buffers are reused across calls; a
  // lambda names thread_locals of the thread running it, so the workers get
  // this thread's buffers through references.
  thread_local Int8Activations buffers[2];
  Int8Activations* acts[2] = {&buffers[0], &buffers[1]};
  bool quantized[2] = {false, false};
  int64_t total = 0;
  for (int m = 0; m < n; ++m) {
    const int slot = int8_group(W[m].type) == 32 ? 0 : 1;
    if (!quantized[slot]) quantize_int8(x, T, W[m].cols, int8_group(W[m].type), acts[slot], threads);
    quantized[slot] = true;
    total += W[m].rows;
  }
  bool tiles = T >= kAmxMinTokens && kernels.amx;
  for (int m = 0; m < n; ++m) tiles = tiles && amx_matmul_supported(W[m].type);
  if (tiles) return matmul_amx_batch(acts, quantized, W, y, n, threads, kernels);
  // One contiguous range of the matrices' rows, taken one after another, per
  // thread: each core then streams its weights in order, which the hardware
  // prefetchers follow (interleaved small tasks halved the two-thread
  // bandwidth), and the batch costs one synchronization.
  // Cuts on multiples of 16 rows: a kRows16 group is then read by one thread.
  const int64_t parts = std::min<int64_t>(core::resolve_threads(threads), std::max<int64_t>(total, 1));
  auto cut = [&](int64_t i) { return i == parts ? total : total * i / parts / 16 * 16; };
  core::parallel_for(parts, threads, [&](int64_t i) {
    const int64_t begin = cut(i), end = cut(i + 1);
    int64_t first = 0;  // the first row of matrix m in the joined row space
    for (int m = 0; m < n; first += W[m].rows, ++m) {
      const int64_t r0 = std::max(begin, first) - first, r1 = std::min(end, first + W[m].rows) - first;
      if (r1 > r0)
        HWY_DYNAMIC_DISPATCH(DotRows)(W[m], r0, r1 - r0, *acts[int8_group(W[m].type) == 32 ? 0 : 1], y[m],
                                      kernels);
    }
  });
}

void matmul_int8_ref(const float* x, int64_t T, const QuantMatrix& W, float* y) {
  check_matrix(W);
  Int8Activations a;
  quantize_int8_ref(x, T, W.cols, int8_group(W.type), &a);
  const int64_t G = a.group;
  std::vector<float> w(static_cast<size_t>(W.cols));
  std::vector<uint8_t> row(static_cast<size_t>(W.row_bytes));
  for (int64_t r = 0; r < W.rows; ++r) {
    const uint8_t* blocks = W.blocks + r * W.row_bytes;
    if (W.layout == QuantLayout::kRows16) {
      unpack_rows16_row(W.type, W.blocks, W.cols, r, row.data());
      blocks = row.data();
    }
    io::dequantize_row_ref(W.type, blocks, W.cols, w.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0.0;
      for (int64_t i = 0; i < W.cols; ++i)
        s += static_cast<double>(w[i]) * a.q[static_cast<size_t>(t * W.cols + i)] *
             a.scale[static_cast<size_t>((t * W.cols + i) / G)];
      y[t * W.rows + r] = static_cast<float>(s);
    }
  }
}

}  // namespace anchorkv::model
#endif  // HWY_ONCE
