// attend(): reads a cache through its attention source (cache/attention_source.h)
// under the cache's reader lock, checks the call (kernels/attend_checks.h), then
//   plan     scale (and rotate) the query, cut every region into chunks (small
//            segments with no query inside them into runs of whole segments)
//   prepare  per-row state of the compressed segment (anchor scores, rotated queries)
//   run      one online-softmax partial per (row, chunk), in parallel
//   merge    fold the partials of a row in chunk order and finish each query
// Chunks are merged in a fixed order, so results never depend on the thread count.
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

namespace anchorkv {
namespace {

constexpr const char* kOp = "anchorkv::attend";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using namespace kernels::attend_plan;  // NOLINT: this file is the plan's one user
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

// Queries per row, scaled (and rotated): [R, nq, D], g = (hq - h * G) * Sq + i.
void AttendCall::prepare_queries() {
  scale_ = opt_.scale > 0 ? opt_.scale : 1.0f / std::sqrt(static_cast<float>(D_));
  ws_.Q.resize(static_cast<size_t>(R_ * nq_ * D_));
  qpos_.resize(static_cast<size_t>(nq_));
  for (int64_t g = 0; g < nq_; ++g) qpos_[g] = src_.n_total - Sq_ + g % Sq_;
  // The angles of each query position (exact sincos and the recurrence from
  // the first), shared by every head: one row per head cost 2.7 us each
  // (32 heads: 86 us, ~18% of a pre-RoPE decode at 4096).
  std::vector<float>& qcos = ws_.qcos;
  std::vector<float>& qsin = ws_.qsin;
  const int64_t half = D_ / 2;
  if (rope_) {
    qcos.resize(static_cast<size_t>(Sq_ * half));
    qsin.resize(qcos.size());
    core::rope_table(src_.n_total - Sq_ + rope_->position_offset, Sq_, D_, *rope_, qcos.data(),
                     qsin.data());
  }
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t hq = 0; hq < Hq_; ++hq)
      for (int64_t i = 0; i < Sq_; ++i) {
        const int64_t row = b * H_ + hq / G_, g = (hq % G_) * Sq_ + i;
        float* dst = &ws_.Q[static_cast<size_t>((row * nq_ + g) * D_)];
        for (int64_t d = 0; d < D_; ++d) {
          const float x = query_.at(b, hq, i, d);
          if (!std::isfinite(x))
            core::fail(ErrorCode::kNonFinite, kOp,
                       "query holds a non-finite value at [" + std::to_string(b) + ", " + std::to_string(hq) +
                           ", " + std::to_string(i) + ", " + std::to_string(d) + "]");
          dst[d] = x * scale_;
        }
        if (rope_) core::rope_rotate(dst, D_, rope_->style, &qcos[i * half], &qsin[i * half]);
      }
}

// Chunks in position order: dense regions before the segments, each segment's
// anchors and entries (planned from its longest row; shorter rows see empty
// ranges), then the regions after them.
void AttendCall::plan_chunks() {
  auto add_dense = [&](const cache::DenseRegion& reg) {
    const int64_t c = chunk_size(reg.n);
    for (int64_t a = 0; a < reg.n; a += c) chunks_.push_back({Chunk::kDense, &reg, a, std::min(reg.n, a + c)});
  };
  for (const auto& reg : src_.dense_before) add_dense(reg);
  plan_segments();
  for (const auto& reg : src_.dense_after) add_dense(reg);
  C_ = static_cast<int64_t>(chunks_.size());
  w_off_.resize(chunks_.size());
  w_row_ = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    w_off_[c] = w_row_;
    w_row_ += nq_ * chunk_k(chunks_[c]);
  }
}

// Small segments with no query inside them (a long session's streaming
// segments) are attended in runs of consecutive ones, each run about one
// entry chunk of work in one task (segment_run_quads); the others get an
// anchors chunk and entry chunks each. Runs depend on the segments' sizes
// only, never on the thread count.
void AttendCall::plan_segments() {
  const size_t n = src_.segments.size();
  k_max_.assign(n, 0);
  n_other_max_.assign(n, 0);
  masked_.assign(n, 0);
  entry_chunk0_.assign(n, 0);
  for (int s = 0; s < n_seg(); ++s) {
    const cache::CompressedRegion& g = seg(s);
    for (const auto& row : *g.rows) {
      k_max_[s] = std::max(k_max_[s], row.n_anchor);
      n_other_max_[s] = std::max(n_other_max_[s], row.n_other());
    }
    masked_[s] = (src_.n_total - Sq_) < g.pos0 + g.tokens - 1;
  }
  shared_codec_ = n > 0 ? seg(0).codec : nullptr;
  for (int s = 1; s < n_seg(); ++s)
    if (seg(s).codec != shared_codec_) shared_codec_ = nullptr;
  runs_ = quad_ && shared_codec_ && kernels::f16_rows_supported(D_);
  int64_t entries_in_runs = 0;
  for (int s = 0; s < n_seg(); ++s)
    if (in_run(s)) entries_in_runs += n_other_max_[s];
  const int64_t target = entry_chunk_size(entries_in_runs, R_, rope_ != nullptr);
  for (int s = 0; s < n_seg();) {
    if (!in_run(s)) {
      plan_segment(s++);
      continue;
    }
    const int s0 = s;
    for (int64_t e = 0; s < n_seg() && in_run(s) && e < target;) e += n_other_max_[s++];
    chunks_.push_back({Chunk::kRun, nullptr, s0, s});
  }
}

void AttendCall::plan_segment(int s) {
  const int64_t n_other_max = n_other_max_[static_cast<size_t>(s)];
  chunks_.push_back({Chunk::kAnchors, nullptr, 0, 0, s});
  const int64_t c = entry_chunk_size(n_other_max, R_, rope_ != nullptr);
  entry_chunk0_[static_cast<size_t>(s)] = chunks_.size();
  int entry_chunk = 0;
  for (int64_t a = 0; a < n_other_max; a += c)
    chunks_.push_back({Chunk::kEntries, nullptr, a, std::min(n_other_max, a + c), s, entry_chunk++});
}

// What every row's preparation shares: the per-segment arithmetic and, when
// the segments share a codec, room for the rows' rotated queries.
void AttendCall::prepare_segments() {
  values_in_place_ = !opt_.reference && kernels::f16_rows_supported(D_);
  anchors_in_place_ = values_in_place_ && !rope_;
  prep_.resize(src_.segments.size());
  for (auto& rows : prep_) rows.resize(static_cast<size_t>(R_));
  arith_.resize(static_cast<size_t>(n_seg()));
  for (int s = 0; s < n_seg(); ++s)
    arith_[s] = s > 0 && seg(s).codec == seg(s - 1).codec ? arith_[s - 1]
                                                          : kernels::residual_arithmetic(*seg(s).codec, opt_.bf16_residuals);
  if (shared_codec_) ws_.rq.assign(static_cast<size_t>(R_ * nq4() * D_), 0.0f);  // zero past nq
}

void AttendCall::rotate_row_queries(int64_t r) {
  float* rq = &ws_.rq[static_cast<size_t>(r * nq4() * D_)];
  for (int64_t g = 0; g < nq_; ++g) shared_codec_->rotation().forward(row_queries(r) + g * D_, rq + g * D_);
  if (arith_[0].bf16)
    for (int64_t i = 0; i < nq_ * D_; ++i) rq[i] = core::round_to_bf16(rq[i]);
}

// Row r's rotated queries and every segment's preparation of it.
void AttendCall::prepare_rows(int64_t r) {
  if (shared_codec_) rotate_row_queries(r);
  for (int s = 0; s < n_seg(); ++s) prepare_row(s, r);
}

// Every row's preparation at once: the rotations (cheap, in order), then
// (segment, row) tasks grouped by cost.
void AttendCall::prepare_all_rows() {
  if (shared_codec_)
    for (int64_t r = 0; r < R_; ++r) rotate_row_queries(r);
  core::parallel_for_grouped(
      n_seg() * R_, opt_.threads,
      [&](int64_t t) { return kTaskCost + seg_row(static_cast<int>(t / R_), t % R_).n_anchor * D_; },
      [&](int64_t t) { prepare_row(static_cast<int>(t / R_), t % R_); });
}

// Pre-RoPE keys: the row's anchors rotated to their own positions (returned:
// they score like any key), and what the entries' kernel reads: split rows
// (fast path) or the pair products.
const float* AttendCall::prepare_rope_row(int s, const compress::CompressedRow& row, const float* q,
                                          RowPrep& p) const {
  const int64_t k = row.n_anchor, D = D_;
  core::UninitVector<float>& ak_rot = task_scratch().anchors_at_pos;
  ak_rot = p.ak;
  for (int64_t j = 0; j < k; ++j)
    rtab_->rotate(&ak_rot[j * D], rope_->style, seg(s).pos0 + p.anchor_pos[j] + rope_->position_offset);
  if (quad_) {  // split rows
    p.rope_queries.assign(static_cast<size_t>((nq_ + 3) / 4 * 4 * D), 0.0f);  // whole quads
    if (rope_->style != RopeStyle::kNeox) {  // NeoX rows are split already (compressed_queries)
      p.rope_anchors.resize(static_cast<size_t>(k * D));
      for (int64_t j = 0; j < k; ++j)
        core::rope_split(&row.anchor_k[static_cast<size_t>(j * D)], D, rope_->style, &p.rope_anchors[j * D]);
    }
    for (int64_t g = 0; g < nq_; ++g) core::rope_split(q + g * D, D, rope_->style, &p.rope_queries[g * D]);
  } else {
    p.cs.resize(static_cast<size_t>(nq_ * k * D));
    core::rope_pair_products(q, nq_, p.ak.data(), k, D, rope_->style, p.cs.data());
  }
  return ak_rot.data();
}

void AttendCall::prepare_row(int s, int64_t r) {
  const compress::CompressedRow& row = seg_row(s, r);
  const cache::CompressedRegion& g_seg = seg(s);
  RowPrep& p = prep_[static_cast<size_t>(s)][static_cast<size_t>(r)];
  const int64_t k = row.n_anchor, D = D_;
  const float* q = row_queries(r);
  p.slot_k.clear();
  p.slot_v.clear();
  p.anchor_dot4.clear();
  p.anchor_pos = {};
  p.ak.clear();
  p.av.clear();
  p.cs.clear();
  p.rope_anchors.clear();
  p.rope_queries.clear();
  p.anchor_dot.resize(static_cast<size_t>(nq_ * k));
  if (anchors_in_place_) {  // the fp16 anchors are read where they are stored
    kernels::dot_rows_f16(q, nq_, row.anchor_k.data(), k, D, p.anchor_dot.data());
  } else {
    p.ak.resize(static_cast<size_t>(k * D));
    core::f16_to_f32_n(row.anchor_k.data(), p.ak.data(), k * D);
  }
  if (!values_in_place_) {  // (pre-RoPE keys need f32 anchors to rotate; values never do)
    p.av.resize(static_cast<size_t>(k * D));
    core::f16_to_f32_n(row.anchor_v.data(), p.av.data(), k * D);
  }
  if (masked_[static_cast<size_t>(s)] || rope_) {
    // compact and tight rows list them; seed-layout rows' come cached with the source, or are found
    const auto* known = g_seg.anchor_pos;
    const auto cached = [&] {
      return known && known->size() == g_seg.rows->size() &&
             static_cast<int64_t>((*known)[static_cast<size_t>(r)].size()) == k;
    };
    if (row.lists_positions()) {
      p.anchor_pos = row.anchor_pos;
    } else if (cached()) {
      p.anchor_pos = (*known)[static_cast<size_t>(r)];
    } else {
      p.anchor_pos_found = row.anchor_positions();
      p.anchor_pos = p.anchor_pos_found;
    }
  }
  const float* ak_scores = rope_ ? prepare_rope_row(s, row, q, p) : p.ak.data();
  if (!anchors_in_place_)
    kern_.dot_matrix(q, nq_, D, ak_scores, k, D, D, p.anchor_dot.data(), k);
  if (quad_) {  // the interleaved anchor dots
    const int64_t quads = (nq_ + 3) / 4;
    p.anchor_dot4.assign(static_cast<size_t>(quads * k * 4), 0.0f);
    for (int64_t g = 0; g < nq_; ++g)
      for (int64_t j = 0; j < k; ++j) p.anchor_dot4[((g / 4) * k + j) * 4 + g % 4] = p.anchor_dot[g * k + j];
  }
  p.rq.clear();
  if (!shares_codec(s)) {
    p.rq.assign(static_cast<size_t>(nq4() * D), 0.0f);  // whole quads, zero past nq
    for (int64_t g = 0; g < nq_; ++g) g_seg.codec->rotation().forward(q + g * D, &p.rq[g * D]);
    if (arith_[static_cast<size_t>(s)].bf16)
      for (float& x : p.rq) x = core::round_to_bf16(x);
  }
  // The residual slots before each of the segment's entry chunks, from the
  // row's slot index (chunks start on its blocks, or past the row's last entry).
  const std::vector<int64_t>& index = slot_index(s, r);
  for (size_t ci = entry_chunk0_[static_cast<size_t>(s)]; ci < chunks_.size(); ++ci) {
    const Chunk& c = chunks_[ci];
    if (c.kind != Chunk::kEntries || c.seg != s) break;
    const int64_t end = std::min(c.a, row.n_other());
    const size_t b = static_cast<size_t>(end == row.n_other() ? index.size() / 2 - 1 : end / compress::kSlotIndexBlock);
    p.slot_k.push_back(index[2 * b]);
    p.slot_v.push_back(index[2 * b + 1]);
  }
  count_task(task_scratch());
}

// Layout per (row, chunk, query): m, l, acc[D]; a segment's chunks also
// w[k of the segment], rot[D].
kernels::PartialView AttendCall::partial(int64_t r, int64_t c) {
  const size_t base = static_cast<size_t>((r * C_ + c) * nq_);
  const Chunk& ch = chunks_[static_cast<size_t>(c)];
  return kernels::PartialView{&ws_.pm[base], &ws_.pl[base], &ws_.pacc[base * D_],
                              ch.seg >= 0 ? &ws_.pw[static_cast<size_t>(r * w_row_ + w_off_[c])] : nullptr,
                              ch.kind != Chunk::kDense ? &ws_.prot[base * D_] : nullptr};
}

kernels::CompressedQueries AttendCall::compressed_queries(int s, int64_t r) const {
  const RowPrep& p = prep_[static_cast<size_t>(s)][static_cast<size_t>(r)];
  return {row_queries(r),
          qpos_.data(),
          nq_,
          p.anchor_dot.data(),
          p.anchor_dot4.empty() ? nullptr : p.anchor_dot4.data(),
          rotated_queries(s, r),
          rope_,
          p.cs.empty() ? nullptr : p.cs.data(),
          p.rope_queries.empty()   ? nullptr  // split rows only for the fast kernel
          : p.rope_anchors.empty() ? seg_row(s, r).anchor_k.data()
                                   : p.rope_anchors.data(),
          p.rope_queries.empty() ? nullptr : p.rope_queries.data(),
          rtab_.get(),
          &arith_[static_cast<size_t>(s)],
          opt_.bf16_scores && !opt_.reference};
}

void AttendCall::size_partials() {
  const size_t n_part = static_cast<size_t>(R_ * C_ * nq_);
  ws_.pm.resize(n_part);
  ws_.pl.resize(n_part);
  ws_.pacc.resize(n_part * static_cast<size_t>(D_));
  ws_.pw.resize(static_cast<size_t>(R_ * w_row_));
  ws_.prot.resize(has_c() ? n_part * static_cast<size_t>(D_) : 0);
}

void AttendCall::run_chunks() {
  const auto cost = [&](int64_t task) {  // multiply-adds, roughly
    const Chunk& c = chunks_[static_cast<size_t>(task % C_)];
    if (c.kind == Chunk::kAnchors) return kTaskCost + k_max_[static_cast<size_t>(c.seg)] * nq_ * D_;
    if (c.kind == Chunk::kDense) return kTaskCost + (c.b - c.a) * nq_ * D_;
    int64_t entries = c.b - c.a;  // an entry costs about an eighth of a dense token
    if (c.kind == Chunk::kRun) {
      entries = 0;
      for (int64_t s = c.a; s < c.b; ++s)
        entries += n_other_max_[static_cast<size_t>(s)] + k_max_[static_cast<size_t>(s)];
    }
    return kTaskCost + entries * nq_ * D_ / 8;
  };
  core::parallel_for_grouped(R_ * C_, opt_.threads, cost, [&](int64_t task) { run_task(task / C_, task % C_); });
}

void AttendCall::run_task(int64_t r, int64_t ci) {
  const Chunk& c = chunks_[static_cast<size_t>(ci)];
  kernels::PartialView out = partial(r, ci);
  std::fill_n(out.m, nq_, kNegInf);  // start empty, then fold tiles in order (the
  std::fill_n(out.l, nq_, 0.0f);     // first fold overwrites acc, w and rot)
  switch (c.kind) {
    case Chunk::kAnchors:
      run_anchors(c.seg, r, out);
      break;
    case Chunk::kDense:
      run_dense(r, c, out);
      break;
    case Chunk::kEntries:
      run_entries(r, c, out);
      break;
    case Chunk::kRun:
      run_segments(r, c, out);
      break;
  }
  count_task(task_scratch());
}

void AttendCall::run_anchors(int s, int64_t r, kernels::PartialView out) {
  const int64_t k = seg_row(s, r).n_anchor, kc = k_max_[static_cast<size_t>(s)];
  const bool masked = masked_[static_cast<size_t>(s)];
  std::vector<float>& tw = task_scratch().anchor_w;
  tw.resize(static_cast<size_t>(nq_ * k));
  // anchor_pos holds segment-relative positions; the mask compares absolute ones.
  std::vector<int32_t> abs_pos;
  if (masked) {
    const RowPrep& p = prep_[static_cast<size_t>(s)][static_cast<size_t>(r)];
    abs_pos.assign(p.anchor_pos.begin(), p.anchor_pos.end());
    for (auto& x : abs_pos) x += static_cast<int32_t>(seg(s).pos0);
  }
  // Anchors contribute through w only: acc and rot are left unwritten (merge_segment reads m, l and w).
  kern_.anchors_chunk(compressed_queries(s, r), k, abs_pos.data(), masked,
                      {out.m, out.l, out.acc, tw.data(), out.rot});
  for (int64_t g = 0; g < nq_; ++g) std::copy_n(&tw[g * k], k, out.w + g * kc);  // stride k -> the segment's k_max
}

void AttendCall::run_dense(int64_t r, const Chunk& c, kernels::PartialView out) {
  const cache::DenseRegion& reg = *c.region;
  const float* q = row_queries(r);
  TaskScratch& ts = task_scratch();
  auto &scratch = ts.dense, &tm = ts.tm, &tl = ts.tl, &tacc = ts.tacc;
  kernels::CodedScratch& coded = ts.coded;
  tm.resize(static_cast<size_t>(nq_));
  tl.resize(static_cast<size_t>(nq_));
  tacc.resize(static_cast<size_t>(nq_ * D_));
  scratch.resize(static_cast<size_t>(
      std::max(kTile * nq_ + kTile * D_ + 2 * D_, kernels::dense_rope_scratch(kTile, nq_, D_))));
  for (int64_t a = c.a; a < c.b; a += kTile) {
    const int64_t n = std::min(c.b, a + kTile) - a;
    kernels::PartialView t{tm.data(), tl.data(), tacc.data(), nullptr, nullptr};
    if (reg.is_coded()) {
      kern_.coded_chunk(q, qpos_.data(), nq_, reg.coded[r], a, n, reg.pos0 + a, D_, t, coded);
      merge_tile(t, out);
      continue;
    }
    if (reg.is_affine()) {
      kern_.affine_chunk(q, qpos_.data(), nq_, reg.affine[r], a, n, reg.pos0 + a, D_, t, coded);
      merge_tile(t, out);
      continue;
    }
    const uint16_t* K = reg.k[r] + a * D_;
    const uint16_t* V = reg.v[r] + a * D_;
    if (rope_)
      kern_.dense_chunk_rope(q, qpos_.data(), nq_, K, V, n, reg.pos0 + a, D_, *rope_, *rtab_, t, scratch.data());
    else
      kern_.dense_chunk(q, qpos_.data(), nq_, K, V, n, reg.pos0 + a, D_, t, scratch.data());
    merge_tile(t, out);
  }
}

// A dense tile's partial (m, l, acc) folded into its chunk's.
void AttendCall::merge_tile(const kernels::PartialView& t, kernels::PartialView out) const {
  for (int64_t g = 0; g < nq_; ++g)
    kernels::merge_partial(out.m[g], out.l[g], out.acc + g * D_, nullptr, nullptr, t.m[g], t.l[g], t.acc + g * D_,
                           nullptr, nullptr, D_, 0);
}

void AttendCall::run_entries(int64_t r, const Chunk& c, kernels::PartialView out) {
  const int s = c.seg;
  const cache::CompressedRegion& g_seg = seg(s);
  const compress::CompressedRow& row = seg_row(s, r);
  const int64_t e_end = std::min(c.b, row.n_other());
  if (c.a >= e_end) return;
  const int64_t k = row.n_anchor, kc = k_max_[static_cast<size_t>(s)];
  const bool masked = masked_[static_cast<size_t>(s)];
  const kernels::CompressedQueries cq = compressed_queries(s, r);
  const RowPrep& p = prep_[static_cast<size_t>(s)][static_cast<size_t>(r)];
  int64_t sk = p.slot_k[c.entry_chunk], sv = p.slot_v[c.entry_chunk];
  TaskScratch& ts = task_scratch();
  auto &tm = ts.tm, &tl = ts.tl, &tacc = ts.tacc, &tw = ts.tw, &trot = ts.trot;
  tm.resize(static_cast<size_t>(nq_));
  tl.resize(static_cast<size_t>(nq_));
  tacc.resize(static_cast<size_t>(nq_ * D_));
  tw.resize(static_cast<size_t>(nq_ * k));
  trot.resize(static_cast<size_t>(nq_ * D_));
  // The quad kernel takes a whole chunk per call: tiles of it cost a merge
  // over every anchor each (~5% of a 131072-entry decode in 8192-entry tiles).
  const int64_t tile = quad_ && !masked ? e_end - c.a : kEntryTile;
  for (int64_t a = c.a; a < e_end; a += tile) {
    const int64_t b = std::min(e_end, a + tile);
    const kernels::EntryRange range{a, b, sk, sv, g_seg.pos0, masked, e_end};
    // A chunk of one tile is written in place; longer ones fold tiles in order.
    const bool in_place = a == c.a && b == e_end && k == kc;
    const kernels::PartialView t =
        in_place ? out : kernels::PartialView{tm.data(), tl.data(), tacc.data(), tw.data(), trot.data()};
    const kernels::ResidualSlots held = kern_.entries_chunk(cq, row, *g_seg.codec, range, t, ts.entries);
    sk += held.k;
    sv += held.v;
    if (in_place) break;
    for (int64_t g = 0; g < nq_; ++g)  // w in the tile is [nq, k]; the chunk's is strided by the segment's k_max
      kernels::merge_partial(out.m[g], out.l[g], out.acc + g * D_, out.w + g * kc, out.rot + g * D_, tm[g], tl[g],
                             &tacc[g * D_], &tw[g * k], &trot[g * D_], D_, k);
  }
}

void AttendCall::run_segments(int64_t r, const Chunk& c, kernels::PartialView out) {
  TaskScratch& ts = task_scratch();
  std::vector<kernels::CompressedQueries>& cqs = ts.run_queries;
  std::vector<kernels::SegmentPass>& passes = ts.run_passes;
  cqs.clear();
  passes.clear();
  for (int s = static_cast<int>(c.a); s < c.b; ++s) cqs.push_back(compressed_queries(s, r));
  for (int s = static_cast<int>(c.a); s < c.b; ++s) {
    const compress::CompressedRow& row = seg_row(s, r);
    passes.push_back({&cqs[static_cast<size_t>(s - c.a)], &row, {0, row.n_other(), 0, 0, seg(s).pos0}});
  }
  kernels::segment_run_quads(passes.data(), static_cast<int64_t>(passes.size()), *shared_codec_, out, ts.entries);
}

void AttendCall::report(AttentionStats* stats) const {
  int64_t bytes = static_cast<int64_t>(ws_.Q.size() * 4 + qpos_.size() * 8 +
                                       (ws_.pm.size() + ws_.pl.size() + ws_.pacc.size()) * 4 +
                                       (ws_.pw.size() + ws_.prot.size()) * 4 +
                                       (shared_codec_ ? ws_.rq.size() * 4 : 0) + (ws_.qcos.size() + ws_.qsin.size()) * 4);
  for (int s = 0; s < n_seg(); ++s) {
    for (const RowPrep& p : prep_[static_cast<size_t>(s)])
      bytes += static_cast<int64_t>((p.ak.size() + p.av.size() + p.anchor_dot.size() + p.anchor_dot4.size() +
                                     p.rq.size() + p.cs.size() + p.rope_queries.size()) *
                                        4 +
                                    p.rope_anchors.size() * 2 + p.anchor_pos_found.size() * 4 +
                                    (p.slot_k.size() + p.slot_v.size()) * 8);
  }
  // Every thread that ran a task holds a TaskScratch: counted at the largest
  // one held after any task of this call.
  const int64_t threads = std::min<int64_t>(core::resolve_threads(opt_.threads), R_ * C_);
  bytes += threads * task_bytes_.load(std::memory_order_relaxed);
  for (const auto& o : src_.owned) bytes += static_cast<int64_t>(o->keys.nbytes() + o->values.nbytes());
  stats->workspace_bytes = bytes;
  stats->chunks_per_row = C_;
  stats->compressed = has_c();
}

// Per row, quads of queries: the chunks folded in position order. A
// segment's chunks are folded first among themselves (their per-anchor
// weights and rotated residual values), finished into plain sums (its
// anchors' values added, R^T rot), then folded like a dense chunk; so the
// order, and the bits, never depend on the thread count.
void AttendCall::finish_row(int64_t r, Tensor& out) {
  float m[4], l[4], ms[4], ls[4];
  TaskScratch& ts = task_scratch();
  auto &acc = ts.acc, &acc_s = ts.acc_s, &rot = ts.rot, &rot_s = ts.rot_s;
  acc.resize(static_cast<size_t>(4 * D_));
  acc_s.resize(static_cast<size_t>(4 * D_));
  rot.resize(static_cast<size_t>(4 * D_));
  rot_s.resize(static_cast<size_t>(4 * D_));
  for (int64_t g0 = 0; g0 < nq_; g0 += 4) {
    const int64_t gn = std::min<int64_t>(4, nq_ - g0);
    std::fill_n(m, 4, kNegInf);
    std::fill_n(l, 4, 0.0f);
    for (size_t c = 0; c < chunks_.size();) {
      size_t c1 = c + 1;
      const bool plain = chunks_[c].seg < 0;  // dense, or a run of segments finished in its task
      const bool dense = chunks_[c].kind == Chunk::kDense;
      if (plain) {  // its partial as it is
        const kernels::PartialView v = partial(r, static_cast<int64_t>(c));
        for (int64_t g = 0; g < gn; ++g) {
          ms[g] = v.m[g0 + g];
          ls[g] = v.l[g0 + g];
          std::copy_n(v.acc + (g0 + g) * D_, D_, &acc_s[g * D_]);
          if (!dense) std::copy_n(v.rot + (g0 + g) * D_, D_, &rot_s[g * D_]);
        }
      } else {
        while (c1 < chunks_.size() && chunks_[c1].seg == chunks_[c].seg) ++c1;
        merge_segment(r, g0, gn, c, c1, ms, ls, acc_s.data(), rot_s.data());
      }
      for (int64_t g = 0; g < gn; ++g)
        kernels::merge_partial(m[g], l[g], &acc[g * D_], nullptr, shared_codec_ ? &rot[g * D_] : nullptr, ms[g],
                               ls[g], &acc_s[g * D_], nullptr, dense ? nullptr : &rot_s[g * D_], D_, 0);
      c = c1;
    }
    for (int64_t g = 0; g < gn; ++g) {
      if (shared_codec_ && m[g] != kNegInf) {  // the shared codec's rotated residual values, back once
        shared_codec_->rotation().inverse(&rot[g * D_], &rot[g * D_]);
        for (int64_t d = 0; d < D_; ++d) acc[g * D_ + d] += rot[g * D_ + d];
      }
      write_query(r, g0 + g, l[g], &acc[g * D_], out);
    }
  }
  count_task(ts);
}

// Chunks [c0, c1) of one segment for queries g0 .. g0 + gn - 1 of row r,
// folded and finished: m, l, acc [gn, D] plain sums; rot [gn, D] its rotated
// residual values when its codec is the shared one (else folded into acc).
void AttendCall::merge_segment(int64_t r, int64_t g0, int64_t gn, size_t c0, size_t c1, float* m, float* l,
                               float* acc, float* rot) {
  const int s = chunks_[c0].seg;
  const int64_t k = seg_row(s, r).n_anchor, kc = k_max_[static_cast<size_t>(s)];
  std::vector<float>& w = task_scratch().w;
  w.resize(static_cast<size_t>(4 * k));
  for (int64_t g = 0; g < gn; ++g) {
    m[g] = kNegInf;
    l[g] = 0;
    std::fill_n(&acc[g * D_], D_, 0.0f);
    std::fill_n(&w[g * k], k, 0.0f);
    std::fill_n(&rot[g * D_], D_, 0.0f);
    const int64_t q = g0 + g;
    const kernels::PartialView a = partial(r, static_cast<int64_t>(c0));  // the anchors: first, and w alone
    if (a.m[q] != kNegInf) {  // what merging it into the empty sums gives, bit for bit
      m[g] = a.m[q];
      l[g] = a.l[q];
      std::copy_n(a.w + q * kc, k, &w[g * k]);
    }
    for (size_t c = c0 + 1; c < c1; ++c) {
      const kernels::PartialView v = partial(r, static_cast<int64_t>(c));
      kernels::merge_partial(m[g], l[g], &acc[g * D_], &w[g * k], &rot[g * D_], v.m[q], v.l[q], v.acc + q * D_,
                             v.w + q * kc, v.rot + q * D_, D_, k);
    }
  }
  add_anchor_values(s, r, k, gn, w.data(), acc);
  if (shares_codec(s)) return;
  for (int64_t g = 0; g < gn; ++g) {
    seg(s).codec->rotation().inverse(&rot[g * D_], &rot[g * D_]);
    for (int64_t d = 0; d < D_; ++d) acc[g * D_ + d] += rot[g * D_ + d];
    std::fill_n(&rot[g * D_], D_, 0.0f);
  }
}

// acc[g] += sum_j w[g, j] a^V_j for gn queries of row r (w [gn, k], acc [gn, D]):
// the fp16 anchors are read once for all of them.
void AttendCall::add_anchor_values(int s, int64_t r, int64_t k, int64_t gn, const float* w, float* acc) const {
  const RowPrep& p = prep_[static_cast<size_t>(s)][static_cast<size_t>(r)];
  if (opt_.reference) {
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t j = 0; j < k; ++j)
        if (w[g * k + j] != 0.0f) core::axpy_ref(w[g * k + j], &p.av[j * D_], acc + g * D_, D_);
  } else if (values_in_place_) {
    kernels::accumulate_rows_f16_queries(w, k, gn, k, seg_row(s, r).anchor_v.data(), D_, acc, D_);
  } else {
    core::accumulate_rows(w, k, p.av.data(), k, gn, D_, acc, D_);
  }
}

// y / l into the output.
void AttendCall::write_query(int64_t r, int64_t g, float l, float* y, Tensor& out) const {
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  const int64_t b = r / H_, h = r % H_, hq = h * G_ + g / Sq_, i = g % Sq_;
  const int64_t o = ((b * Hq_ + hq) * Sq_ + i) * D_;
  if (opt_.out_dtype == DType::kF32) {
    for (int64_t d = 0; d < D_; ++d) out.data_as<float>()[o + d] = y[d] * inv;
  } else {
    for (int64_t d = 0; d < D_; ++d) y[d] *= inv;
    core::f32_to_f16_n(y, out.data_as<uint16_t>() + o, D_);
  }
}

}  // namespace

Tensor attend(const TensorView& query, const std::vector<const KVCache*>& caches, const AttentionOptions& opt,
              AttentionStats* stats) {
  // Every cache stays read-locked until the output is written (writers wait).
  std::vector<internal::ReadLocked<internal::CacheStore>> locked;
  cache::AttentionSource src;
  bool evicts = false;
  std::string evicting;
  for (const KVCache* c : caches) {
    if (!c) core::fail(ErrorCode::kInvalidArgument, kOp, "a null cache");
    locked.push_back(internal::CacheAccess::read(*c));
    const auto& l = locked.back();
    if (l.store.kept_per_row(l.shape) < l.shape.seen) {
      evicts = true;
      evicting = l.store.name();
    }
    cache::AttentionSource own = l.store.attention_source(l.shape);
    // RoPE inside attention rotates each key at its position: affine codes are
    // scored as stored, so such a call reads the cache's dense fetch instead.
    if (opt.rope.enabled && own.holds_affine()) own = cache::dense_source(l.store.fetch(l.shape));
    cache::append_source(src, std::move(own), kOp);
  }
  kernels::check_attend_call(query, src, opt, evicts, evicting);
  return AttendCall(query, src, opt).run(stats);
}

Tensor attend(const TensorView& query, const KVCache& cache, const AttentionOptions& opt,
              AttentionStats* stats) {
  return attend(query, std::vector<const KVCache*>{&cache}, opt, stats);
}

}  // namespace anchorkv
