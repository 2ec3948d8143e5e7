// Prefill matmuls on AMX int8 tiles (Intel Sapphire Rapids and later). One
// tile instruction multiplies 16 weight rows by 16 tokens over a 32-element
// block (8192 multiply-adds); in prefill that replaces the f32 tiles, whose
// two cores managed ~150 GFLOP/s.
//
// Numerics are those of qmatmul.h (the same int8 activations and the same
// exact integer sums per 32-element block), except that the float part is
// summed per block rather than per super-block: for the K-quants each
// sub-block's integer sum is converted and scaled by d * scale_j on its own.
// The results agree with the other integer kernels to float rounding (tested
// against them and the scalar twin); they depend only on row and token, never
// on the thread count.
//
// Layout. A weight block is the tiles' first operand as it lies in memory:
// 16 rows of 32 bytes, one row per weight row (Q8_0 is read straight from the
// GGUF blocks; the 4- and 5-bit types are unpacked first, once per 16 rows,
// into unsigned bytes with the offset or minimum moved into a correction
// through the activations' per-32 sums). The tokens are the second operand:
// per 16 tokens and block, 8 rows of 64 bytes (4 consecutive elements of each
// of the 16 tokens), rearranged once per call. Q8_0 weights held as
// kRows16 (qmatmul.h) swap the roles: their blocks are the second operand
// as they lie (8 rows of 64 bytes, unsigned w + 128), the tokens' bytes the
// first (16 tokens of 32 bytes), and 128 * the tokens' per-32 sums come back
// off each product in integers.
#pragma once

#include <cstdint>
#include <vector>

#include "model/qmatmul.h"

namespace anchorkv::model {

// Weight types with a tile kernel: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K (its 16-element
// sub-blocks on 16-byte-deep tiles).
bool amx_matmul_supported(io::GgmlType type);
// A type with a tile kernel, and the tiles in use (matmul_kernels().amx:
// the CPU has AMX-INT8, Linux granted the tile registers, nobody switched
// them off).
bool amx_matmul_usable(io::GgmlType type);

// Fewest tokens for which the tiles beat the row kernels (measured on a
// 2816 x 1024 matrix, one thread, tokens packed per call: from 4 tokens for
// Q8_0, 0.33 vs 0.41 ms; from 6 for Q4_K, 0.35 vs 0.52 ms; at 2 tokens the
// rows win, 0.27 vs 0.33 ms).
constexpr int64_t kAmxMinTokens = 6;

// T tokens' activations as the tiles' second operand (see Layout); tokens
// past T in the last 16 are zero.
struct AmxTokens {
  int64_t T = 0, cols = 0, tiles = 0, blocks = 0;
  std::vector<int8_t> q;        // [tiles][blocks][8][64]
  std::vector<float> scale;     // [tiles][blocks][16]: each token's activation scale of the block
  std::vector<float> scaled_sum;  // [tiles][blocks][16]: the block's sum of q times that scale
  std::vector<float> scaled_sum16;  // [tiles][blocks][2][16]: the same per 16 elements (Q6_K; else empty)
  std::vector<int8_t> rows;         // [tiles * 16][cols]: the tokens as they are, zero past T (kRows16 Q8_0; else empty)
  std::vector<int32_t> sum128;      // [tiles][blocks][16]: 128 x each token's per-32 sum of q (with rows)
  const int32_t* sums128(int64_t mt, int64_t b) const { return &sum128[static_cast<size_t>((mt * blocks + b) * 16)]; }
  const int8_t* tile(int64_t mt, int64_t b) const { return &q[static_cast<size_t>((mt * blocks + b) * 512)]; }
  const float* scales(int64_t mt, int64_t b) const { return &scale[static_cast<size_t>((mt * blocks + b) * 16)]; }
  const float* sums(int64_t mt, int64_t b) const { return &scaled_sum[static_cast<size_t>((mt * blocks + b) * 16)]; }
  // 16-element block h of the tokens' row (h = 2 b + half).
  const float* sums16(int64_t mt, int64_t h) const {
    return &scaled_sum16[static_cast<size_t>((mt * blocks * 2 + h) * 16)];
  }
};
// with_sums16: also the per-16 sums (only Q6_K's tiles read them); with_rows:
// also rows and sum128 (only kRows16 Q8_0 weights read them).
void pack_amx_tokens(const Int8Activations& a, AmxTokens* out, int threads, bool with_sums16, bool with_rows = false);

// Rows [r0, r0 + n) of W, n a multiple of 16, for every token of x:
// y[t * W.rows + r]. Needs amx_matmul_usable(W.type).
void rows_amx(const QuantMatrix& W, int64_t r0, int64_t n, const AmxTokens& x, float* y);

}  // namespace anchorkv::model
