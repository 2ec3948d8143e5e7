// The plan of one attend() call (kernels/attend.cc, its one user): how
// regions are cut into chunks of work, what each row of a compressed segment
// prepares once per call, and the buffers a calling thread keeps across calls.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "cache/attention_source.h"
#include "compress/segment.h"
#include "core/buffer.h"
#include "kernels/attention_kernels.h"
#include "kernels/coded_attention.h"

namespace anchorkv::kernels::attend_plan {

constexpr int64_t kTile = 512;        // dense tokens per kernel call (bounds scratch)
constexpr int64_t kEntryTile = 8192;  // compressed entries per kernel call: each call ends in a
                                      // merge over every anchor, so tiles are long
constexpr int64_t kMaxChunks = 16;    // chunks per region: bounds the partials
constexpr int64_t kMinChunk = 8192;   // tokens (or entries) per chunk at least
// Entries with pre-RoPE keys cost ~4 x 128 multiply-adds each (as much as a
// dense token), so short rows are split finer: at 4096 entries and one KV
// head a decode step would otherwise attend on one thread.
constexpr int64_t kMinRopeEntryChunk = 2048;
// What a parallel task costs before its work, in multiply-adds (~1 us):
// tasks cheaper than this are run together (core::parallel_for_grouped).
constexpr int64_t kTaskCost = 4096;

// Chunks of n tokens (or entries) in `parts` parts at most; they start on
// the blocks of the rows' residual slot indexes.
inline int64_t chunk_size(int64_t n, int64_t parts = kMaxChunks, int64_t min_chunk = kMinChunk) {
  constexpr int64_t kB = compress::kSlotIndexBlock;
  static_assert(kMinChunk % kB == 0 && kMinRopeEntryChunk % kB == 0);
  return std::max<int64_t>(min_chunk, ((n + parts - 1) / parts + kB - 1) / kB * kB);
}

// A compressed row's entries in as few chunks as keep kEntryTasks tasks over
// all rows (many-core machines stay busy). A chunk's first lines are not
// requested ahead, and each chunk adds a merge over every anchor: at 131072
// entries and 8 rows, 16 chunks per row made a decode from memory 3-5%
// slower than 2 or 4 (medians of alternated runs); at 32768, 2 chunks of
// 16384 per row were ~10% slower than 4 (coarser tasks balance worse over
// two threads). The count depends on the rows only, never on the thread
// count (a chunking is a summation order: bits stay the same for any).
constexpr int64_t kEntryTasks = 32;
inline int64_t entry_chunk_size(int64_t n, int64_t rows, bool rope) {
  return chunk_size(n, std::clamp<int64_t>((kEntryTasks + rows - 1) / rows, 1, kMaxChunks),
                    rope ? kMinRopeEntryChunk : kMinChunk);
}

struct Chunk {
  enum Kind { kDense, kAnchors, kEntries, kRun } kind;
  const cache::DenseRegion* region = nullptr;  // kDense
  int64_t a = 0, b = 0;                        // token / entry range; kRun: segments [a, b)
  int seg = -1;                                // kAnchors, kEntries: the segment
  int entry_chunk = 0;                         // kEntries: index among its segment's entry chunks
};

// Per-row state of the compressed segment, computed once per call.
// Buffers written whole before they are read are uninitialised: clear() and
// resize() would otherwise zero ~1 MB per row and call (pre-RoPE anchors).
struct RowPrep {
  core::UninitVector<float> ak, av;        // [k, D] anchors f32
  core::UninitVector<float> anchor_dot;    // [nq, k]
  std::vector<float> anchor_dot4;          // [ceil(nq / 4), k, 4] (see CompressedQueries)
  std::vector<float> rq;                   // [nq, D]
  std::span<const int32_t> anchor_pos;     // [k] when masked or with RoPE: the row's, the source's,
  std::vector<int32_t> anchor_pos_found;   //     or these, found for this call
  core::UninitVector<float> cs;            // with RoPE: pair products, or for the fast kernel
  core::UninitVector<uint16_t> rope_anchors;  // split fp16 anchors and f32 queries (see CompressedQueries)
  std::vector<float> rope_queries;
  std::vector<int64_t> slot_k, slot_v;  // residual slots before each entry chunk
};

// What one task works in besides its chunk's partial: a tile's partial
// before it is folded, the kernels' own workspaces, a run's segment list and
// a quad's sums while its row finishes. One per thread (the calling thread's
// and each worker's), reused across calls.
struct TaskScratch {
  core::UninitVector<float> tm, tl, tacc, tw, trot;  // a tile's partial
  core::UninitVector<float> dense;                   // a dense tile's kernel scratch
  kernels::CodedScratch coded;
  kernels::EntryWorkspace entries;
  core::UninitVector<float> anchors_at_pos;          // pre-RoPE anchors rotated to their positions
  std::vector<float> anchor_w;                       // [nq, k] an anchors chunk's weights
  std::vector<kernels::CompressedQueries> run_queries;  // a run's segments
  std::vector<kernels::SegmentPass> run_passes;
  std::vector<float> acc, acc_s, rot, rot_s, w;      // finishing a quad of queries
  int64_t bytes() const {
    const auto n = [](const auto&... v) { return core::bytes_held(v...); };
    const kernels::CodedScratch& c = coded;
    return n(tm, tl, tacc, tw, trot, dense, anchors_at_pos, anchor_w, run_queries, run_passes) +
           n(acc, acc_s, rot, rot_s, w) + n(c.rq, c.s, c.levels, c.dots, c.w, c.acc, c.x, c.scale, c.bias, c.bytes) +
           entries.bytes();
  }
};

// Workspaces are kept per calling thread and reused across calls: decode
// calls attend once per token, and fresh pages cost more than the work.
struct Workspace {
  core::UninitVector<float> Q, pm, pl, pacc, pw, prot;
  std::vector<float> qcos, qsin;           // [Sq, D/2]: the angles of each query position
  std::vector<float> rq;                   // [R, ceil(nq / 4) * 4, D]: queries in the shared codec's rotation
  std::vector<std::vector<RowPrep>> prep;  // per segment, per row
};

}  // namespace anchorkv::kernels::attend_plan
