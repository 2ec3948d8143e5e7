// What the two kernels over a compressed segment's entries share: the
// generic path (attention_kernels.cc, over SIMD or scalar Ops) and the quad
// kernel (quad_entries.cc, the fast path when no query sits inside the
// segment). Internal to kernels/.
#pragma once

#include <vector>

#include "core/buffer.h"
#include "kernels/attention_kernels.h"

namespace anchorkv::kernels {

// Buffers of the entries kernels, reused across calls (one per thread, owned
// through EntryWorkspace).
struct EntryScratch {
  std::vector<float> s;                 // [nq, n] scores, then probabilities
  core::UninitVector<float> gk, gv;     // [n] coefficients decoded (compact and tight layouts)
  const float* gk_at = nullptr;         // [n] the range's coefficients: gk / gv, or the seed
  const float* gv_at = nullptr;         //     layout's fp32 ones where they are stored
  // Per-range arrays are sized to each range and written before they are read:
  // uninitialised, so a resize is not a memset per sub-tile.
  core::UninitVector<int32_t> ak, av;        // [n] anchor ordinals
  core::UninitVector<int64_t> pos;           // [n] absolute positions (masking / RoPE)
  core::UninitVector<int32_t> res_k, res_v;  // chunk-local indices of entries with a residual
  int64_t slots_k = 0, slots_v = 0;     // after a call: the residual slots the range holds
  std::vector<float> z, zscale, zdot;   // decoded residual levels, scales, dots
  std::vector<uint8_t> codes;           // [D] unpacked codes of one residual
  std::vector<float> cs_row;            // [2D] a row scored, then its position's cos | sin (RoPE)
  std::vector<float> pt, wa, wb, w4;    // value-weight accumulators
  std::vector<float> ml;                // per quad: four softmax shifts, then four sums
  std::vector<int32_t> anchor_ids;      // 0, 1, ...: anchors folded in as tokens (segment runs)
  std::vector<float> anchor_ones;       //   with gamma 1
  std::vector<float> run_w;             // [4, k] a quad's anchor weights at the end of a segment
  // The tight layout's coefficient tables (compress::tight_coef_table) and
  // the exponents they were built for: rebuilt when a row's differ, not per
  // sub-tile (they were ~5% of a decode call).
  float tight_k[256], tight_v[256];
  int tight_k_exp = 1 << 30, tight_v_exp = 1 << 30;
  // decoded key / value residual rows (uninitialised: rewritten every sub-tile) and their scales
  core::UninitVector<float> zk, zv;
  bool zk_ready = false;  // zk holds the sub-tile's key residuals (decoded by its first quad)
  std::vector<float> zks, zvs;
  // Pre-RoPE keys: the quad kernel's rotated queries and the key residuals
  // fused into its anchor scores (QuadRopeScores).
  struct PreRope {
    std::vector<float> qb;                 // the quad's queries per block of positions
    int64_t qb0 = 0;                       //   (RopeQueryBlocks), the first block's index
    std::vector<float> ksigns;             // the codec rotation's signs / sqrt(D), split
    core::UninitVector<int32_t> zi;        // per entry its fused key residual's row in zk, or -1
    std::vector<float> zrs;                //   the rows' scales (scale / gamma, or 1 where not fused)
    std::vector<float> zero;               //   D zeros
    std::vector<float> zk_left, zks_left;  // residuals not fused (gamma = 0): split rows, scales,
    core::UninitVector<int32_t> res_left;  //   entries
  } rope;
};

// Key residuals coded before RoPE, slots [slot0, slot0 + nr) of `side`, as
// split rows (core::rope_split) of R^T levels(codes): z [nr, D], unscaled
// or, with row_scale, row j times row_scale[j].
// simd: decoded and transformed in registers where the codec allows (2-bit
// codes, Hadamard rotation, D = 64 or 128 on AVX-512); otherwise, and for
// simd = false, decode_levels, rotation().inverse() and rope_split one row
// at a time. The two give identical bits.
void split_key_residuals(const compress::CompressedSide& side, const compress::ResidualCodec& codec,
                         RopeStyle style, int64_t slot0, int64_t nr, bool simd, core::UninitVector<float>& z,
                         EntryScratch& scratch, const float* row_scale = nullptr);


// The arithmetic a call's residuals take (fp32 where attend() set none).
const ResidualArithmetic& arithmetic_of(const CompressedQueries& cq);

// Anchor ordinals, coefficients, residual lists and (for RoPE or masking)
// positions of the range's entries, into sc. Exact in either path.
void decode_entries(const CompressedQueries& cq, const compress::CompressedRow& row, const EntryRange& r,
                    EntryScratch& sc);

// The quad kernel: entries_chunk when entries_chunk_any_length holds. Same
// arithmetic as the generic path up to summation order and the rescaling of
// partial sums.
void entries_chunk_quads(const CompressedQueries& cq, const compress::CompressedRow& row,
                         const compress::ResidualCodec& codec, const EntryRange& r, PartialView out,
                         EntryScratch& sc);

}  // namespace anchorkv::kernels
