// One attend() call (attend.cc): the plan of its chunks and the per-row
// preparation (attend_prepare.cc), the online-softmax partials and their
// merge (attend_run.cc). Private to the kernels: attend() is its one user.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "anchorkv/attention.h"
#include "cache/attention_source.h"
#include "cache/core.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "core/rope.h"
#include "kernels/attend_checks.h"
#include "kernels/attend_plan.h"
#include "kernels/attention_kernels.h"
#include "kernels/coded_attention.h"
#include "kernels/kernel_set.h"

namespace anchorkv::kernels::attend_plan {

inline constexpr const char* kOp = "anchorkv::attend";
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One attend() call: the source, the query layout and every buffer it uses.
class AttendCall {
 public:
  AttendCall(const TensorView& query, const cache::AttentionSource& src, const AttentionOptions& opt)
      : query_(query),
        src_(src),
        opt_(opt),
        rope_(opt.rope.enabled ? &opt.rope : nullptr),
        kern_(kernels::KernelSet::of(opt.reference)),
        quad_(!opt.reference && (!opt.rope.enabled || kernels::quad_rope_supported(src.D))),
        ws_(tls_workspace()),
        prep_(ws_.prep) {
    B_ = src.B, H_ = src.H, D_ = src.D, R_ = B_ * H_;
    Hq_ = query.shape[1], Sq_ = query.shape[2], G_ = Hq_ / H_, nq_ = G_ * Sq_;
    if (rope_) rtab_ = core::shared_rope_table(*rope_, D_, src.n_total + rope_->position_offset);
  }

  Tensor run(AttentionStats* stats) {
    Tensor out(opt_.out_dtype, query_.shape);
    if (Sq_ == 0) return out;
    counting_ = stats != nullptr;
    prepare_queries();
    plan_chunks();
    size_partials();
    if (has_c()) prepare_segments();
    if (rows_in_one_pass()) {  // one task per row: no waiting between the phases
      core::parallel_for(R_, opt_.threads, [&](int64_t r) {
        if (has_c()) prepare_rows(r);
        for (int64_t c = 0; c < C_; ++c) run_task(r, c);
        finish_row(r, out);
      });
    } else {
      if (has_c()) prepare_all_rows();
      run_chunks();
      core::parallel_for(R_, opt_.threads, [&](int64_t r) { finish_row(r, out); });
    }
    if (stats) report(stats);
    return out;
  }

 private:
  static Workspace& tls_workspace() {
    thread_local Workspace ws;  // named once here: worker lambdas must see the caller's buffers
    return ws;
  }
  // The running thread's (a worker's inside a task), and what it holds now
  // counted towards the call's largest (report()).
  static TaskScratch& task_scratch() {
    thread_local TaskScratch ts;
    return ts;
  }
  void count_task(const TaskScratch& ts) {
    if (!counting_) return;  // only AttentionStats reads it
    const int64_t b = ts.bytes();
    for (int64_t seen = task_bytes_.load(std::memory_order_relaxed);
         b > seen && !task_bytes_.compare_exchange_weak(seen, b, std::memory_order_relaxed);) {
    }
  }
  int n_seg() const { return static_cast<int>(src_.segments.size()); }
  bool has_c() const { return !src_.segments.empty(); }
  const cache::CompressedRegion& seg(int s) const { return src_.segments[static_cast<size_t>(s)]; }
  const compress::CompressedRow& seg_row(int s, int64_t r) const { return (*seg(s).rows)[static_cast<size_t>(r)]; }
  // Row r's residual slot index (every compressed source has one).
  const std::vector<int64_t>& slot_index(int s, int64_t r) const {
    const cache::CompressedRegion& g = seg(s);
    const int64_t blocks = (seg_row(s, r).n_other() + compress::kSlotIndexBlock - 1) / compress::kSlotIndexBlock;
    if (!g.slot_index || g.slot_index->size() != g.rows->size() ||
        static_cast<int64_t>((*g.slot_index)[static_cast<size_t>(r)].size()) != 2 * (blocks + 1))
      core::fail(ErrorCode::kInvalidState, "anchorkv::attend", "a compressed segment without its residual slot index");
    return (*g.slot_index)[static_cast<size_t>(r)];
  }
  const float* row_queries(int64_t r) const { return &ws_.Q[static_cast<size_t>(r * nq_ * D_)]; }
  int64_t nq4() const { return (nq_ + 3) / 4 * 4; }  // whole quads
  // Segments of one cache share one codec: their queries are rotated once per
  // row, and their rotated residual values summed before one inverse.
  bool shares_codec(int s) const { return shared_codec_ && seg(s).codec == shared_codec_; }
  const float* rotated_queries(int s, int64_t r) const {
    return shares_codec(s) ? &ws_.rq[static_cast<size_t>(r * nq4() * D_)]
                           : prep_[static_cast<size_t>(s)][static_cast<size_t>(r)].rq.data();
  }
  // Per-anchor weights a chunk's partial carries per query: its segment's largest anchor count.
  int64_t chunk_k(const Chunk& c) const { return c.seg < 0 ? 0 : k_max_[static_cast<size_t>(c.seg)]; }
  // Whether segment s is attended inside a run (Chunk::kRun): small, no query inside it.
  bool in_run(int s) const {
    const int64_t n = n_other_max_[static_cast<size_t>(s)];
    return runs_ && !masked_[static_cast<size_t>(s)] && n <= entry_chunk_size(n, R_, rope_ != nullptr);
  }
  kernels::PartialView partial(int64_t r, int64_t c);
  kernels::CompressedQueries compressed_queries(int s, int64_t r) const;

  void prepare_queries();
  void plan_chunks();
  void plan_segments();
  void plan_segment(int s);
  // Rows split across the threads whole (each a task of its preparation,
  // chunks and finish) when there are enough of them to share out evenly;
  // else three phases, each split finer. The bits are the same either way.
  bool rows_in_one_pass() const { return R_ >= 2 * core::resolve_threads(opt_.threads); }
  void size_partials();
  void prepare_segments();
  void rotate_row_queries(int64_t r);
  void prepare_rows(int64_t r);
  void prepare_all_rows();
  void prepare_row(int s, int64_t r);
  const float* prepare_rope_row(int s, const compress::CompressedRow& row, const float* q, RowPrep& p) const;
  void run_chunks();
  void run_task(int64_t r, int64_t ci);
  void run_anchors(int s, int64_t r, kernels::PartialView out);
  void run_dense(int64_t r, const Chunk& c, kernels::PartialView out);
  void merge_tile(const kernels::PartialView& t, kernels::PartialView out) const;
  void run_entries(int64_t r, const Chunk& c, kernels::PartialView out);
  void run_segments(int64_t r, const Chunk& c, kernels::PartialView out);
  void finish_row(int64_t r, Tensor& out);
  void merge_segment(int64_t r, int64_t g0, int64_t gn, size_t c0, size_t c1, float* m, float* l, float* acc,
                     float* rot);
  void add_anchor_values(int s, int64_t r, int64_t k, int64_t gn, const float* w, float* acc) const;
  void write_query(int64_t r, int64_t g, float l, float* y, Tensor& out) const;
  void report(AttentionStats* stats) const;

  const TensorView& query_;
  const cache::AttentionSource& src_;
  const AttentionOptions& opt_;
  const RopeOptions* rope_;
  const kernels::KernelSet kern_;
  // Whether the quad kernels run: their inputs are prepared per row (the
  // interleaved anchor dots, split pre-RoPE rows) and every unmasked segment
  // takes them, its entry chunks whole and small segments in runs. Not for
  // the scalar twins, nor for pre-RoPE keys of a head dim without split rows.
  const bool quad_;
  Workspace& ws_;
  std::shared_ptr<const core::RopeTable> rtab_;  // the angles of every key position
  int64_t B_, H_, D_, R_, Hq_, Sq_, G_, nq_;
  float scale_ = 1;
  std::vector<int64_t> qpos_;  // [nq] absolute position of each query of a row
  std::vector<Chunk> chunks_;
  std::vector<int64_t> w_off_;  // per chunk: its weights' offset in a row's block of pw
  int64_t C_ = 0, w_row_ = 0;   // chunks; floats of pw per row
  std::vector<int64_t> k_max_;  // per segment: the most anchors of any of its rows
  std::vector<int64_t> n_other_max_;  // per segment: the most entries of any of its rows
  std::vector<char> masked_;    // per segment: some query sits inside it (causal mask)
  std::vector<size_t> entry_chunk0_;  // per segment: the index of its first entry chunk
  const compress::ResidualCodec* shared_codec_ = nullptr;  // every segment's, if they share one
  std::vector<kernels::ResidualArithmetic> arith_;          // per segment: its residuals' arithmetic
  bool anchors_in_place_ = false;  // fp16 key anchors read in place (fast path, no RoPE)
  bool values_in_place_ = false;   // fp16 value anchors read in place (fast path)
  bool runs_ = false;              // small segments are attended in runs (fast path, one codec)
  std::vector<std::vector<RowPrep>>& prep_;  // the workspace's (buffers reused across calls)
  std::atomic<int64_t> task_bytes_{0};       // the most any thread's TaskScratch held after a task
  bool counting_ = false;                    // task_bytes_ is wanted (stats asked for)
};

}  // namespace anchorkv::kernels::attend_plan
