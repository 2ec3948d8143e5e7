// attend(), plan and prepare: the queries scaled (and rotated), every
// region cut into chunks, and each row's preparation of its segments.
#include "kernels/attend_call.h"

namespace anchorkv::kernels::attend_plan {

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

}  // namespace anchorkv::kernels::attend_plan
