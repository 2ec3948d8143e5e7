// Attention kernels on raw pointers (no knowledge of caches). Each works on
// one chunk of one KV row for a block of nq queries (the GQA group times Sq)
// and produces an online-softmax partial per query (FlashInfer style); chunks
// are merged in a fixed order, so results never depend on the thread count.
//
// Queries arrive pre-scaled (q * softmax_scale), f32 [nq, D]. A query at
// absolute position qpos[g] sees tokens at positions <= qpos[g].
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "anchorkv/attention.h"
#include "compress/codec.h"
#include "compress/segment.h"
#include "core/buffer.h"
#include "core/rope.h"
#include "kernels/kernel_types.h"

namespace anchorkv::kernels {

using core::kRopeStep;
using core::RopeTable;

// Online-softmax partial of one query over one chunk:
//   m = the shift: max score (the compressed fast path: up to 16 below it, see
//       kHeadroom), l = sum exp(score - m), acc = sum exp(score - m) * v  [D].
// Compressed chunks also carry w[k] (per-anchor value weights) and rot[D]
// (rotated-domain residual values), finished once per query after merging.
struct PartialView {
  float* m;    // [nq]
  float* l;    // [nq]
  float* acc;  // [nq, D]
  float* w;    // [nq, k] or nullptr
  float* rot;  // [nq, D] or nullptr
};

// Dense fp16 tokens: K16, V16 [n, D], token i at position pos0 + i.
// scratch: n * nq floats + 2 * D floats.
void dense_chunk(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16, const uint16_t* V16,
                 int64_t n, int64_t pos0, int64_t D, PartialView out, float* scratch);
void dense_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                     const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, PartialView out,
                     float* scratch);

// Per-query state of a compressed row, computed once per call.
struct CompressedQueries {
  const float* q;       // [nq, D] scaled queries
  const int64_t* qpos;  // [nq]
  int64_t nq = 0;
  const float* anchor_dot;  // [nq, k]  q . a^K_j
  // The same per quad of queries, interleaved: [ceil(nq / 4), k, 4] (lanes
  // past nq are 0); nullptr when the fast path is not prepared.
  const float* anchor_dot4 = nullptr;
  const float* rq;          // [ceil(nq / 4) * 4, D]  R q (rotated queries; zero rows past nq)
  // Pre-RoPE keys (rope != nullptr): q is already rotated to its position,
  // anchor_dot uses the anchors rotated to theirs, and an entry's anchor score
  // q . RoPE_t(a) comes from one of two forms of the same numbers:
  //   cs [nq, k, D]: per pair i, C_i = q_x a_x + q_y a_y (first D/2) and
  //     S_i = q_y a_x - q_x a_y (last D/2), so q . RoPE_t(a) = sum_i C_i cos + S_i sin;
  //   or, for the fast kernel (quad_rope_supported), split rows (core::rope_split):
  //     rope_anchors [k, D] (the fp16 anchors as stored, permuted: half the
  //     bytes per entry of f32 rows, the same values) and rope_queries
  //     [ceil(nq / 4) * 4, D] f32 (zero rows past nq), each anchor rotated by
  //     the entry's offset in its block of kRopeStep positions, then dotted
  //     with the quad rotated back to the block's start.
  const RopeOptions* rope = nullptr;
  const float* cs = nullptr;
  const uint16_t* rope_anchors = nullptr;
  const float* rope_queries = nullptr;
  const RopeTable* table = nullptr;  // covers every key position + rope->position_offset
  // How residual codes enter the arithmetic (nullptr: fp32). With bf16, rq
  // holds the rotated queries rounded to bf16 (core::round_to_bf16).
  const ResidualArithmetic* arith = nullptr;
  // The fast kernel's pre-RoPE anchor scores in bf16 products (split rows
  // only, where the CPU has AVX-512 BF16: AttentionOptions::bf16_scores).
  bool bf16_scores = false;
};

// The arithmetic of `codec`'s residuals: bf16 where asked, the codes are
// 2-bit and this CPU runs the bf16 kernels for the head dim; else fp32.
ResidualArithmetic residual_arithmetic(const compress::ResidualCodec& codec, bool bf16);
// Whether the fast kernel takes pre-RoPE anchor scores from split rows for head dim D.
bool quad_rope_supported(int64_t D);

// Dense fp16 tokens whose keys are pre-RoPE: each key is rotated to its
// position (pos + rope.position_offset, angles of `table`) before the dot.
// scratch: dense_rope_scratch(n, nq, D) floats.
inline int64_t dense_rope_scratch(int64_t n, int64_t nq, int64_t D) {
  return n * nq + n * D + nq * D + nq * core::kRopeStep;
}
void dense_chunk_rope(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                      const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope,
                      const RopeTable& table, PartialView out, float* scratch);
void dense_chunk_rope_ref(const float* q, const int64_t* qpos, int64_t nq, const uint16_t* K16,
                          const uint16_t* V16, int64_t n, int64_t pos0, int64_t D, const RopeOptions& rope,
                          const RopeTable& table, PartialView out, float* scratch);

// The anchors of a compressed row as tokens (gamma = 1, own value): scores
// anchor_dot, values accumulate into w[j]. anchor_pos: positions (only read
// when `masked`). The _ref twin's softmax is scalar.
void anchors_chunk(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                   PartialView out);
void anchors_chunk_ref(const CompressedQueries& cq, int64_t k, const int32_t* anchor_pos, bool masked,
                       PartialView out);

// Entries [e0, e1) of a compressed row. slot_k0/slot_v0: residual slots owned
// by entries before e0. seg_pos0: absolute position of the segment's first
// token. masked: some query sits inside the segment (causal mask needed).
struct EntryRange {
  int64_t e0 = 0, e1 = 0;
  int64_t slot_k0 = 0, slot_v0 = 0;
  int64_t seg_pos0 = 0;
  bool masked = false;
  int64_t ahead_end = 0;  // the caller reads entries up to here next: lines are requested up to it (0: e1)
};

// The entries kernels' working memory (their private EntryScratch,
// kernels/entries.h): one per calling thread, reused across calls, its
// buffers grown to the largest range seen and kept.
struct EntryScratch;
class EntryWorkspace {
 public:
  EntryWorkspace();
  ~EntryWorkspace();
  EntryWorkspace(const EntryWorkspace&) = delete;
  EntryWorkspace& operator=(const EntryWorkspace&) = delete;
  int64_t bytes() const;  // what its buffers hold
  EntryScratch& scratch() { return *scratch_; }  // for the kernels

 private:
  std::unique_ptr<EntryScratch> scratch_;
};

// The residual slots a range of entries holds, per side: where the next range's start.
struct ResidualSlots {
  int64_t k = 0, v = 0;
};

// Whether entries_chunk takes ranges of any length in the same scratch (the
// quad kernel streams sub-tiles; the others hold [nq, n] scores).
bool entries_chunk_any_length(const CompressedQueries& cq, bool masked);

// Partial over the entries: scores gamma * (q . a_K) + residual dots, value
// weights per anchor (w) and rotated-domain residual values (rot). The SIMD
// kernel and its scalar twin; they agree to float rounding.
ResidualSlots entries_chunk(const CompressedQueries& cq, const compress::CompressedRow& row,
                            const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                            EntryWorkspace& workspace);
ResidualSlots entries_chunk_ref(const CompressedQueries& cq, const compress::CompressedRow& row,
                                const compress::ResidualCodec& codec, const EntryRange& range, PartialView out,
                                EntryWorkspace& workspace);

// One segment of a run (segment_run_quads): its queries (anchor_dot4 and the
// quad path's inputs prepared), its row and all of its entries.
struct SegmentPass {
  const CompressedQueries* cq;
  const compress::CompressedRow* row;
  EntryRange range;
};

// Whole segments of one row that no query sits inside, in position order,
// under one online softmax per query: each segment's anchors as tokens,
// its entries, then its anchor values (fp16 in place: f16_rows_supported)
// added to acc. out holds m, l, acc and rot (residual values in the
// codec's rotated domain, which every pass shares); w is not written. What
// a decode over many small streaming segments pays per segment is one
// pass, not a task, a partial and a merge. The same arithmetic as
// entries_chunk and anchors_chunk per segment, merged (the scalar twin),
// up to summation order and the rescaling of partial sums.
void segment_run_quads(const SegmentPass* passes, int64_t n_pass, const compress::ResidualCodec& codec,
                       PartialView out, EntryWorkspace& workspace);

// fp16 rows read in place (when f16_rows_supported(D); otherwise convert):
//   dot_rows_f16:        out[g, j] = q[g] . A[j]      q [nq, D] f32, A [k, D] fp16
//   accumulate_rows_f16_queries: Y[g * ldy + :D] += sum_j W[g * ldw + j] * A[j], g < nq
//     (each row read once for all queries)
bool f16_rows_supported(int64_t D);
void dot_rows_f16(const float* q, int64_t nq, const uint16_t* A16, int64_t k, int64_t D, float* out);
void accumulate_rows_f16_queries(const float* W, int64_t ldw, int64_t nq, int64_t k, const uint16_t* A16,
                                 int64_t D, float* Y, int64_t ldy);

// Merge partial `b` into `a` (same layout); k may be 0 and w/rot null. When a
// is empty (m_a = -inf) its buffers are overwritten, so they need no zeroing.
void merge_partial(float& m_a, float& l_a, float* acc_a, float* w_a, float* rot_a, float m_b, float l_b,
                   const float* acc_b, const float* w_b, const float* rot_b, int64_t D, int64_t k);

}  // namespace anchorkv::kernels
