// What the two kernels over a compressed segment's entries share: the
// generic path (attention_kernels.cc, over SIMD or scalar Ops) and the quad
// kernel (quad_entries.cc, the fast path when no query sits inside the
// segment). Internal to kernels/.
#pragma once

#include "kernels/attention_kernels.h"

namespace anchorkv::kernels {

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
