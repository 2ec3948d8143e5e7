// Attention over tokens coded whole, read as they are stored; no fp16 K/V is
// rebuilt.
// - TurboQuant's codes (compress::TokenCoder): each query is rotated into
//   every key group's domain once per call, a token's score is its scale times
//   the dot of its levels with the rotated query, and values accumulate in
//   their rotated domain, turned back once per query at the end.
// - Affine codes (cache/affine.h: group quantization, KIVI): a token's
//   (scale, zero) per channel group makes a level table per group, so a block
//   of tokens is rebuilt in L1 for the cost of decoding its codes; KIVI's keys,
//   with a pair per channel and group of tokens, are scored on their integer
//   codes against the query scaled once per token group.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/affine.h"
#include "compress/token_coder.h"
#include "kernels/attention_kernels.h"

namespace anchorkv::kernels {

// Buffers of one coded_chunk call, reused across calls (one per thread).
struct CodedScratch {
  std::vector<float> rq, s, levels, dots, w, acc, x, scale, bias;
  std::vector<uint8_t> bytes;
};

// Tokens a .. a + n - 1 of one row (token a at absolute position pos_a),
// queries q [nq, D] pre-scaled, query g at position qpos[g] sees tokens at
// positions <= qpos[g]. Writes out.m, out.l, out.acc [nq, D] (w, rot unused).
// The SIMD form (levels decoded per token, dot products and value sums by the
// core SIMD kernels) and its scalar twin (each token decoded back to its
// channels, then plain loops); they agree to float rounding.
void coded_chunk(const float* q, const int64_t* qpos, int64_t nq, const compress::CodedRowView& row, int64_t a,
                 int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& scratch);
void coded_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const compress::CodedRowView& row,
                     int64_t a, int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& scratch);

// The same contract over a row of affine codes (tokens a .. a + n - 1 of the
// region). The _ref twin rebuilds each token with AffineSideView::value and
// runs plain loops; they agree to float rounding.
void affine_chunk(const float* q, const int64_t* qpos, int64_t nq, const cache::AffineRowView& row, int64_t a,
                  int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& scratch);
void affine_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const cache::AffineRowView& row,
                      int64_t a, int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& scratch);

}  // namespace anchorkv::kernels
