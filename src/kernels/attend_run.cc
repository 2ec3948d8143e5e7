// attend(), run and merge: one online-softmax partial per (row, chunk), then
// each row's partials folded in chunk order and every query finished.
#include "kernels/attend_call.h"

namespace anchorkv::kernels::attend_plan {

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

}  // namespace anchorkv::kernels::attend_plan
