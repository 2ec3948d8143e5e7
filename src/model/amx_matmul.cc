// AMX tile kernels for prefill matmuls (amx_matmul.h has the numerics and the
// layout). Raw intrinsics under target attributes: Highway has no AMX.
#include "model/amx_matmul.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define ANCHORKV_AMX 1
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "io/ggml_blocks.h"
#include "model/kquant_scales.h"
#include "model/matmul_kernels.h"
#include "model/rows16.h"

namespace anchorkv::model {
namespace {

// Only the tile kernels read weights in this form: elsewhere (other CPUs,
// other compilers) the file keeps its entry points, which refuse.
#ifdef ANCHORKV_AMX
float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return core::half_to_float(h);
}

// 16 weight rows of one matrix as the tiles' first operand: block b of row i
// at base + b * block_step + i * stride, with a float scale and (unsigned
// types) a minimum per row and block: w = scale * q - min. Blocks are 32
// elements, 16 for Q6_K.
struct WeightTiles {
  const uint8_t* base = nullptr;
  int64_t stride = 0, block_step = 0;
  bool is_signed = false, has_min = false;
  std::vector<uint8_t> unpacked;  // [16][cols] for the 4-, 5- and 6-bit types
  std::vector<float> scale, min;  // [blocks][16]
};

// Q8_0 blocks are read in place: 2 bytes of fp16 scale, then 32 int8 values.
void prepare_q8_0(const QuantMatrix& W, int64_t r0, WeightTiles* w) {
  const int64_t nb = W.cols / 32;
  w->base = W.blocks + r0 * W.row_bytes + 2;
  w->stride = W.row_bytes;
  w->block_step = io::kQ8_0Block.bytes;
  w->is_signed = true;
  w->has_min = false;
  w->scale.resize(static_cast<size_t>(nb * 16));
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t b = 0; b < nb; ++b)
      w->scale[static_cast<size_t>(b * 16 + i)] = f16_at(W.blocks + (r0 + i) * W.row_bytes + b * io::kQ8_0Block.bytes);
}

// Q4_0: element j < 16 is the low nibble of byte j, j >= 16 the high nibble
// of byte j - 16; w = d * (q - 8).
void unpack_q4_0_row(const uint8_t* row, int64_t nb, uint8_t* out, float* scale, float* min) {
  for (int64_t b = 0; b < nb; ++b, out += 32) {
    const uint8_t* blk = row + b * io::kQ4_0Block.bytes;
    for (int j = 0; j < 16; ++j) {
      out[j] = blk[2 + j] & 0x0F;
      out[j + 16] = blk[2 + j] >> 4;
    }
    const float d = f16_at(blk);
    scale[b * 16] = d;
    min[b * 16] = 8.0f * d;
  }
}

// Q4_K / Q5_K super-blocks: sub-block 2c in the low nibbles of 32-byte chunk
// c, 2c + 1 in the high ones; Q5_K's bit j of qh[l] is the fifth bit of
// element l of sub-block j. w = d * sc_j * q - dmin * m_j.
void unpack_q45_k_row(const uint8_t* row, int64_t nsb, bool five, uint8_t* out, float* scale, float* min) {
  const int64_t block_bytes = five ? 176 : 144;
  for (int64_t s = 0; s < nsb; ++s, out += 256) {
    const uint8_t* blk = row + s * block_bytes;
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    uint8_t sc[8], m[8];
    unpack_scales_k4(blk + 4, sc, m);
    const uint8_t* qh = blk + 16;
    const uint8_t* ql = blk + (five ? 48 : 16);
    for (int c = 0; c < 4; ++c, ql += 32)
      for (int l = 0; l < 32; ++l) {
        const int lo = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0, hi = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
        out[64 * c + l] = static_cast<uint8_t>((ql[l] & 0x0F) | lo);
        out[64 * c + 32 + l] = static_cast<uint8_t>((ql[l] >> 4) | hi);
      }
    for (int j = 0; j < 8; ++j) {
      scale[(s * 8 + j) * 16] = d * static_cast<float>(sc[j]);
      min[(s * 8 + j) * 16] = dmin * static_cast<float>(m[j]);
    }
  }
}

// Q6_K super-blocks (dequant.cc's q6_k): sub-block j (16 elements) has the
// int8 scale sc[j]; w = d * sc_j * (q - 32), q = 4 low bits from ql and 2
// high bits from qh.
void unpack_q6_k_row(const uint8_t* row, int64_t nsb, uint8_t* out, float* scale, float* min) {
  for (int64_t s = 0; s < nsb; ++s, out += 256) {
    const uint8_t* blk = row + s * 210;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = f16_at(blk + 208);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk + 64 * half;
      const uint8_t* qh = blk + 128 + 32 * half;
      uint8_t* o = out + 128 * half;
      for (int l = 0; l < 32; ++l) {
        o[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
        o[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        o[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        o[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    for (int j = 0; j < 16; ++j) {
      const float ds = d * static_cast<float>(sc[j]);
      scale[(s * 16 + j) * 16] = ds;
      min[(s * 16 + j) * 16] = 32.0f * ds;
    }
  }
}

void prepare_unpacked(const QuantMatrix& W, int64_t r0, WeightTiles* w) {
  const bool six = W.type == io::GgmlType::kQ6_K;
  const int64_t nb = W.cols / (six ? 16 : 32);
  w->unpacked.resize(static_cast<size_t>(16 * W.cols));
  w->scale.resize(static_cast<size_t>(nb * 16));
  w->min.resize(static_cast<size_t>(nb * 16));
  thread_local std::vector<uint8_t> gguf_row;  // a kRows16 row back in its GGUF bytes
  gguf_row.resize(static_cast<size_t>(W.row_bytes));
  for (int64_t i = 0; i < 16; ++i) {
    const uint8_t* row = W.blocks + (r0 + i) * W.row_bytes;
    if (W.layout == QuantLayout::kRows16) {
      unpack_rows16_row(W.type, W.blocks, W.cols, r0 + i, gguf_row.data());
      row = gguf_row.data();
    }
    uint8_t* out = &w->unpacked[static_cast<size_t>(i * W.cols)];
    if (W.type == io::GgmlType::kQ4_0)
      unpack_q4_0_row(row, nb, out, &w->scale[static_cast<size_t>(i)], &w->min[static_cast<size_t>(i)]);
    else if (six)
      unpack_q6_k_row(row, W.cols / 256, out, &w->scale[static_cast<size_t>(i)], &w->min[static_cast<size_t>(i)]);
    else
      unpack_q45_k_row(row, W.cols / 256, W.type == io::GgmlType::kQ5_K, out, &w->scale[static_cast<size_t>(i)],
                       &w->min[static_cast<size_t>(i)]);
  }
  w->base = w->unpacked.data();
  w->stride = W.cols;
  w->block_step = six ? 16 : 32;
  w->is_signed = false;
  w->has_min = true;
}

void prepare_weights(const QuantMatrix& W, int64_t r0, WeightTiles* w) {
  if (W.type == io::GgmlType::kQ8_0)
    prepare_q8_0(W, r0, w);
  else
    prepare_unpacked(W, r0, w);
}

// GCC 12 warns inside its own AVX-512 headers once they are inlined under a
// target attribute (as in qmatmul.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ANCHORKV_AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")))

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0, tmm1: products of blocks b and b + 1 (16 weight rows x 16 tokens,
// int32); tmm2, tmm3: their weights (16 rows x 32 bytes); tmm4, tmm5: their
// tokens (8 rows x 64 bytes).
// Half blocks (16 elements): weights 16 rows x 16 bytes, tokens 4 rows x 64 bytes.
ANCHORKV_AMX_TARGET void load_tile_config(bool half_blocks) {
  TileConfig c;
  for (int t : {0, 1}) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t : {2, 3}) c.rows[t] = 16, c.colsb[t] = half_blocks ? 16 : 32;
  for (int t : {4, 5}) c.rows[t] = half_blocks ? 4 : 8, c.colsb[t] = 64;
  // GCC 12 does not see ldtilecfg read the whole struct and drops the stores
  // above without a barrier.
  asm volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

// One weight group's operands as plain pointers, passed by value: the
// kernel then holds no reference to a thread_local (GCC had specialised it on
// one and spilled every accumulator around each thread-local lookup).
struct GroupOperands {
  const uint8_t* base;
  int64_t stride, block_step;
  const float* scale;  // [blocks][16]
  const float* min;    // [blocks][16], or nullptr
};

// The tokens' operand, activation scales and scaled sums of weight block b
// (kHalf: 16-element blocks, the upper or lower 4 rows of a 32-element tile).
template <bool kHalf>
struct TokenBlock {
  const int8_t* tile;
  const float *scales, *sums;
  TokenBlock(const AmxTokens& x, int64_t mt, int64_t b)
      : tile(kHalf ? x.tile(mt, b / 2) + 256 * (b % 2) : x.tile(mt, b)),
        scales(x.scales(mt, kHalf ? b / 2 : b)),
        sums(kHalf ? x.sums16(mt, b) : x.sums(mt, b)) {}
};

// acc[i] (16 tokens of weight row i) += the block's product times its scales.
ANCHORKV_AMX_TARGET inline void accumulate(const int32_t* c, const GroupOperands& w, const float* x_scales,
                                           const float* x_sums, int64_t b, __m512* acc) {
  const __m512 xs = _mm512_loadu_ps(x_scales);
  const float* ws = w.scale + b * 16;
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    const __m512 p = _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * i));
    acc[i] = _mm512_fmadd_ps(p, _mm512_mul_ps(_mm512_set1_ps(ws[i]), xs), acc[i]);
  }
  if (w.min != nullptr) {
    const __m512 xm = _mm512_loadu_ps(x_sums);
    const float* wm = w.min + b * 16;
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(wm[i]), xm, acc[i]);
  }
}

// Block `blk`'s product into tile C from weights in tile A and tokens in tile
// B (tile numbers must be literals: the intrinsics are macros).
#define ANCHORKV_TILE_PRODUCT(C, A, B, blk)                                       \
  do {                                                                            \
    _tile_zero(C);                                                                \
    _tile_loadd(A, w.base + (blk) * w.block_step, w.stride);                      \
    _tile_loadd(B, TokenBlock<kHalf>(x, mt, blk).tile, 64);                       \
    if (kSigned) _tile_dpbssd(C, A, B); else _tile_dpbusd(C, A, B);               \
  } while (0)
#define ANCHORKV_TILE_SCALE(blk)                                                  \
  do {                                                                            \
    const TokenBlock<kHalf> tb(x, mt, blk);                                       \
    accumulate(c, w, tb.scales, tb.sums, blk, acc);                               \
  } while (0)

// The 16 x 16 outputs of one weight group and one token tile, out[i * 16 + t].
// Software-pipelined: the tiles multiply block b + 1 while block b's
// products are scaled (waiting for each product before scaling it had left
// the cores idle for most of the tile instruction's latency).
template <bool kSigned, bool kHalf>
ANCHORKV_AMX_TARGET __attribute__((noinline)) void tile_outputs(const GroupOperands w, const AmxTokens& x,
                                                                int64_t mt, float* out) {
  __m512 acc[16];  // unrolled loops only: the array then lives in registers
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm512_setzero_ps();
  alignas(64) int32_t c[256];
  const int64_t nb = kHalf ? 2 * x.blocks : x.blocks;
  ANCHORKV_TILE_PRODUCT(0, 2, 4, 0);
  for (int64_t b = 0; b < nb; b += 2) {
    if (b + 1 < nb) ANCHORKV_TILE_PRODUCT(1, 3, 5, b + 1);
    _tile_stored(0, c, 64);
    ANCHORKV_TILE_SCALE(b);
    if (b + 1 >= nb) break;
    if (b + 2 < nb) ANCHORKV_TILE_PRODUCT(0, 2, 4, b + 2);
    _tile_stored(1, c, 64);
    ANCHORKV_TILE_SCALE(b + 1);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
}
#undef ANCHORKV_TILE_PRODUCT
#undef ANCHORKV_TILE_SCALE

// kRows16 Q8_0: one group of 16 rows (nb blocks of 512 bytes, then the fp16
// scales) and one tile of 16 tokens, out[t * 16 + i]. tmm2/tmm3: the tokens'
// bytes (16 x 32), tmm4/tmm5: the weights (8 x 64), tmm0/tmm1: products
// (16 tokens x 16 rows); pipelined as tile_outputs.
#define ANCHORKV_TILE_PRODUCT(C, A, B, blk)                                       \
  do {                                                                            \
    _tile_zero(C);                                                                \
    _tile_loadd(A, tokens + (blk) * 32, x.cols);                                  \
    _tile_loadd(B, group + (blk) * 512, 64);                                      \
    _tile_dpbsud(C, A, B);                                                        \
  } while (0)
ANCHORKV_AMX_TARGET inline void accumulate_rows16_q8_0(const int32_t* c, const uint8_t* scales, const float* x_scales,
                                                   const int32_t* x_sums128, int64_t b, __m512* acc) {
  const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + b * 32)));
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) {
    const __m512i p = _mm512_sub_epi32(_mm512_load_si512(c + 16 * t), _mm512_set1_epi32(x_sums128[t]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws, _mm512_set1_ps(x_scales[t])), acc[t]);
  }
}
ANCHORKV_AMX_TARGET __attribute__((noinline)) void tile_outputs_rows16_q8_0(const uint8_t* group, const AmxTokens& x,
                                                                        int64_t mt, float* out) {
  __m512 acc[16];  // unrolled loops only: the array then lives in registers
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm512_setzero_ps();
  alignas(64) int32_t c[256];
  const int64_t nb = x.blocks;
  const int8_t* tokens = &x.rows[static_cast<size_t>(mt * 16 * x.cols)];
  const uint8_t* scales = group + nb * 512;
  ANCHORKV_TILE_PRODUCT(0, 2, 4, 0);
  for (int64_t b = 0; b < nb; b += 2) {
    if (b + 1 < nb) ANCHORKV_TILE_PRODUCT(1, 3, 5, b + 1);
    _tile_stored(0, c, 64);
    accumulate_rows16_q8_0(c, scales, x.scales(mt, b), x.sums128(mt, b), b, acc);
    if (b + 1 >= nb) break;
    if (b + 2 < nb) ANCHORKV_TILE_PRODUCT(0, 2, 4, b + 2);
    _tile_stored(1, c, 64);
    accumulate_rows16_q8_0(c, scales, x.scales(mt, b + 1), x.sums128(mt, b + 1), b + 1, acc);
  }
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}
#undef ANCHORKV_TILE_PRODUCT

ANCHORKV_AMX_TARGET void release_tiles() { _tile_release(); }
#pragma GCC diagnostic pop
#undef ANCHORKV_AMX_TARGET
#endif  // ANCHORKV_AMX

}  // namespace

bool amx_matmul_supported(io::GgmlType type) {
  return type == io::GgmlType::kQ8_0 || type == io::GgmlType::kQ4_0 || type == io::GgmlType::kQ4_K ||
         type == io::GgmlType::kQ5_K || type == io::GgmlType::kQ6_K;
}

bool amx_matmul_usable(io::GgmlType type) {
  return amx_matmul_supported(type) && matmul_kernels().amx;
}

void pack_amx_tokens(const Int8Activations& a, AmxTokens* out, int threads, bool with_sums16, bool with_rows) {
  const int64_t K = a.cols, nb = K / 32, per_group = a.group / 32;
  out->T = a.T;
  out->cols = K;
  out->tiles = (a.T + 15) / 16;
  out->blocks = nb;
  out->q.assign(static_cast<size_t>(out->tiles * nb * 512), 0);
  out->scale.assign(static_cast<size_t>(out->tiles * nb * 16), 0.0f);
  out->scaled_sum.assign(out->scale.size(), 0.0f);
  out->scaled_sum16.assign(with_sums16 ? 2 * out->scale.size() : 0, 0.0f);
  out->rows.assign(with_rows ? static_cast<size_t>(out->tiles * 16 * K) : 0, 0);
  out->sum128.assign(with_rows ? out->scale.size() : 0, 0);
  if (with_rows) std::copy(a.q8.begin(), a.q8.begin() + a.T * K, out->rows.begin());
  core::parallel_for(out->tiles, threads, [&](int64_t mt) {
    for (int64_t t = mt * 16; t < std::min(a.T, mt * 16 + 16); ++t) {
      const int64_t lane = t - mt * 16;
      const int8_t* row = &a.q8[static_cast<size_t>(t * K)];
      for (int64_t b = 0; b < nb; ++b) {
        int8_t* tile = &out->q[static_cast<size_t>((mt * nb + b) * 512)];
        for (int k4 = 0; k4 < 8; ++k4) std::memcpy(tile + k4 * 64 + lane * 4, row + b * 32 + k4 * 4, 4);
        const float s = a.scale[static_cast<size_t>(t * (K / a.group) + b / per_group)];
        const size_t at = static_cast<size_t>((mt * nb + b) * 16 + lane);
        out->scale[at] = s;
        out->scaled_sum[at] = static_cast<float>(a.sum[static_cast<size_t>(t * nb + b)]) * s;
        if (with_rows) out->sum128[at] = 128 * a.sum[static_cast<size_t>(t * nb + b)];
        for (int h = 0; h < 2 && with_sums16; ++h) {  // per 16 elements (Q6_K's sub-blocks)
          int32_t sum16 = 0;
          for (int k = 0; k < 16; ++k) sum16 += row[b * 32 + 16 * h + k];
          out->scaled_sum16[static_cast<size_t>(((mt * nb + b) * 2 + h) * 16 + lane)] = static_cast<float>(sum16) * s;
        }
      }
    }
  });
}

void rows_amx(const QuantMatrix& W, int64_t r0, int64_t n, const AmxTokens& x, float* y) {
  constexpr const char* kOp = "anchorkv::rows_amx";
  if (!amx_matmul_usable(W.type)) core::fail(ErrorCode::kUnsupported, kOp, "no AMX tile kernel for these weights");
  if (n % 16 != 0 || r0 < 0 || r0 + n > W.rows || x.cols != W.cols)
    core::fail(ErrorCode::kInvalidArgument, kOp, "rows must be whole groups of 16 of a matrix as wide as x");
  if (W.type == io::GgmlType::kQ6_K && x.scaled_sum16.size() != 2 * x.scale.size())
    core::fail(ErrorCode::kInvalidArgument, kOp, "Q6_K tiles need tokens packed with their per-16 sums");
#ifdef ANCHORKV_AMX
  thread_local WeightTiles w;
  alignas(64) float out[256];
  const bool half_blocks = W.type == io::GgmlType::kQ6_K;
  load_tile_config(half_blocks);
  if (W.layout == QuantLayout::kRows16 && W.type == io::GgmlType::kQ8_0) {
    if (x.rows.size() != static_cast<size_t>(x.tiles * 16 * x.cols))
      core::fail(ErrorCode::kInvalidArgument, kOp, "Q8_0 in groups of 16 rows needs tokens packed with their rows");
    for (int64_t g = r0; g < r0 + n; g += 16) {
      const uint8_t* group = W.blocks + g / 16 * rows16_group_bytes(W.type, W.cols);
      for (int64_t mt = 0; mt < x.tiles; ++mt) {
        tile_outputs_rows16_q8_0(group, x, mt, out);
        for (int64_t t = mt * 16; t < std::min(x.T, mt * 16 + 16); ++t)
          std::copy_n(out + (t - mt * 16) * 16, 16, y + t * W.rows + g);
      }
    }
    release_tiles();
    return;
  }
  for (int64_t g = r0; g < r0 + n; g += 16) {
    prepare_weights(W, g, &w);
    const GroupOperands ops{w.base, w.stride, w.block_step, w.scale.data(), w.has_min ? w.min.data() : nullptr};
    for (int64_t mt = 0; mt < x.tiles; ++mt) {
      if (w.is_signed)
        tile_outputs<true, false>(ops, x, mt, out);
      else if (half_blocks)
        tile_outputs<false, true>(ops, x, mt, out);
      else
        tile_outputs<false, false>(ops, x, mt, out);
      for (int64_t t = mt * 16; t < std::min(x.T, mt * 16 + 16); ++t)
        for (int64_t i = 0; i < 16; ++i) y[t * W.rows + g + i] = out[i * 16 + (t - mt * 16)];
    }
  }
  release_tiles();
#else
  (void)y;
#endif
}

}  // namespace anchorkv::model
