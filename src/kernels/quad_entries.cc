// The quad kernel over a compressed segment's entries (the fast path of
// kernels::entries_chunk when no query sits inside the segment): queries in
// quads, each entry's four scores in one vector, anchor scores from the
// quad's interleaved table (post-RoPE) or its anchor rotated to the entry's
// position (pre-RoPE), residuals decoded once per sub-tile for all quads,
// one online softmax per quad over the sub-tiles. Compiled once per SIMD
// target with the ops it is made of (kernels/ops_quad-inl.h,
// ops_rope-inl.h, ops_residuals-inl.h), so they inline into it; one entry
// point is exported (entries_chunk_quads), beside the queries attend() asks
// of these ops (quad_rope_supported, residual_arithmetic) and the split key
// decode tests compare with its twin (split_key_residuals).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/convert.h"
#include "core/half.h"
#include "core/linalg.h"
#include "core/rope.h"
#include "kernels/attention_kernels.h"
#include "kernels/entries.h"
#include "kernels/kernel_types.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quad_entries.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "core/simd-inl.h"
// clang-format on

#include "kernels/ops_quad-inl.h"
#include "kernels/ops_rope-inl.h"
#include "kernels/ops_residuals-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::kernels {
namespace HWY_NAMESPACE {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Scales of residual slots [slot0, slot0 + nr) of one side, times `factor`
// (ResidualArithmetic::inv_lambda where its levels apply, else 1).
void residual_scales(const compress::CompressedSide& side, int64_t slot0, int64_t nr, float factor,
                     std::vector<float>& out) {
  out.resize(static_cast<size_t>(nr));
  if (nr > 0) core::f16_to_f32_n(side.scales.data() + slot0, out.data(), nr);
  if (factor != 1.0f)
    for (float& x : out) x *= factor;
}

// Residual rows of one side decoded to their unscaled levels (z [nr, D]),
// once per tile and shared by every query.
void decode_residual_rows(const compress::CompressedSide& side, const compress::ResidualCodec& codec,
                          int64_t slot0, int64_t nr, core::UninitVector<float>& z, EntryScratch& sc) {
  const int64_t D = codec.dim(), cb = codec.code_bytes();
  z.resize(static_cast<size_t>(nr * D));
  if (nr == 0) return;
  if (codec.bits() == 2 && Supports2BitRows(D))
    return DecodeRows2Bit(side.codes.data(), cb, slot0, nr, codec.levels().data(), D,
                                                z.data());
  sc.codes.resize(static_cast<size_t>(D));
  for (int64_t j = 0; j < nr; ++j)
    codec.decode_levels(&side.codes[static_cast<size_t>((slot0 + j) * cb)], &z[j * D], sc.codes.data());
}

// The quad's queries rotated back to the start of each block of positions
// the sub-tile's n entries touch (sc.rope.qb, first block sc.rope.qb0). Positions
// increase with the entry (anchors_before never decreases, checked on
// load), so the first and last entries bound them (a scan for the extremes
// took ~4% of a pre-RoPE decode's samples).
void rope_query_blocks(const CompressedQueries& cq, int64_t q0, int64_t n, int64_t D, EntryScratch& sc) {
  const int64_t offset = cq.rope->position_offset;
  assert(std::is_sorted(sc.pos.begin(), sc.pos.begin() + n));
  sc.rope.qb0 = (sc.pos[0] + offset) / kRopeStep;
  const int64_t nb = (sc.pos[n - 1] + offset) / kRopeStep - sc.rope.qb0 + 1;
  sc.rope.qb.resize(static_cast<size_t>(nb * 4 * D));
  RopeQueryBlocks
  (cq.rope_queries + q0 * D, D, sc.rope.qb0, nb, cq.table->step_cos.data(), cq.table->step_sin.data(),
   sc.rope.qb.data());
}

// Pre-RoPE key residuals coded as given, once per sub-tile for all quads:
// split rows (sc.zk), each scaled by scale / gamma of its entry so that the
// anchor kernel adds it to the anchor before the rotation and the dot
// (FusedKeys: one rotation and one dot per entry, where a residual of its
// own cost both again). An entry with gamma = 0 (or a ratio past 2^60)
// keeps its residual apart (sc.rope.res_left).
void fuse_key_residuals(const CompressedQueries& cq, const compress::CompressedRow& row,
                        const compress::ResidualCodec& codec, const EntryRange& r, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, nr = static_cast<int64_t>(sc.res_k.size()), D = codec.dim();
  sc.rope.zi.resize(static_cast<size_t>(n));
  std::fill_n(sc.rope.zi.data(), n, -1);
  sc.rope.zrs.resize(static_cast<size_t>(nr));
  constexpr float kMaxRatio = 0x1p60f;
  for (int64_t j = 0; j < nr; ++j) {
    const int32_t e = sc.res_k[j];
    const float gamma = sc.gk_at[e], ratio = sc.zks[j] / gamma;
    const bool fused = gamma != 0.0f && std::fabs(ratio) <= kMaxRatio;
    sc.rope.zrs[j] = fused ? ratio : 1.0f;
    if (fused) sc.rope.zi[e] = static_cast<int32_t>(j);
  }
  // the ratios ride on the levels: no pass over the rows
  split_key_residuals(row.k, codec, cq.rope->style, r.slot_k0, nr, true, sc.zk, sc, sc.rope.zrs.data());
  sc.rope.zero.assign(static_cast<size_t>(D), 0.0f);
  sc.rope.zk_left.clear();
  sc.rope.zks_left.clear();
  sc.rope.res_left.resize(0);
  for (int64_t j = 0; j < nr; ++j) {
    const int32_t e = sc.res_k[j];
    if (sc.rope.zi[e] == j) continue;
    const float* z = &sc.zk[static_cast<size_t>(j * D)];
    sc.rope.zk_left.insert(sc.rope.zk_left.end(), z, z + D);
    sc.rope.zks_left.push_back(sc.zks[j]);
    sc.rope.res_left.push_back(e);
  }
}

// The quad's pre-RoPE scores over the sub-tile, key residuals included; m4
// their maxima.
void quad_rope_scores(const CompressedQueries& cq, const compress::CompressedRow& row,
                      const compress::ResidualCodec& codec, const EntryRange& r, int64_t q0, EntryScratch& sc,
                      float* m4) {
  const int64_t n = r.e1 - r.e0, D = codec.dim(), offset = cq.rope->position_offset;
  const bool fuse = !sc.res_k.empty() && !row.key_rope.enabled;
  if (fuse && !sc.zk_ready) {  // once per sub-tile, for its first quad
    fuse_key_residuals(cq, row, codec, r, sc);
    sc.zk_ready = true;
  }
  rope_query_blocks(cq, q0, n, D, sc);
  const FusedKeys fk = fuse ? FusedKeys{sc.rope.zi.data(), sc.zk.data(), sc.rope.zero.data()} : FusedKeys{};
  const float *near_cos = cq.table->near_cos.data(), *near_sin = cq.table->near_sin.data();
  float* s4 = sc.s.data();
  QuadRopeScores
  (cq.rope_anchors, sc.rope.qb.data(), sc.rope.qb0, D, sc.ak.data(), sc.gk_at, sc.pos.data(), offset,
   near_cos, near_sin, &fk, n, cq.bf16_scores && SupportsBf16Residuals(D), s4);
  QuadMax(s4, n, m4);
  const EntryScratch::PreRope& pr = sc.rope;
  if (fuse && !pr.res_left.empty()) {
    QuadRopeKeyResiduals
    (pr.zk_left.data(), pr.zks_left.data(), pr.res_left.data(), static_cast<int64_t>(pr.res_left.size()),
     pr.qb.data(), pr.qb0, D, sc.pos.data(), offset, near_cos, near_sin, s4, m4);
  }
}

// Key residuals of the quad at q0 added to its scores s4 (keys after RoPE,
// or coded at their positions: key_rope); m4 raised to the largest score
// they change.
void add_quad_key_residuals(const CompressedQueries& cq, const compress::CompressedRow& row,
                            const compress::ResidualCodec& codec, const EntryRange& r, int64_t q0, int64_t gn,
                            EntryScratch& sc, float* m4, LinesAhead& ahead) {
  const int64_t nr = static_cast<int64_t>(sc.res_k.size()), D = codec.dim();
  if (nr == 0) return;
  float* s4 = sc.s.data();
  if (const ResidualArithmetic& a = arithmetic_of(cq); a.bf16)
    return QuadKeyResiduals2BitBf16(row.k.codes.data(), codec.code_bytes(), r.slot_k0,
                                                          sc.zks.data(), sc.res_k.data(), nr, a.pairs,
                                                          cq.rq + q0 * D, D, s4, m4, &ahead);
  if (codec.bits() == 2 && Supports2BitRows(D))  // decoded in registers
    return QuadKeyResiduals2Bit(
        row.k.codes.data(), codec.code_bytes(), r.slot_k0, sc.zks.data(), sc.res_k.data(), nr,
        codec.levels().data(), cq.rq + q0 * D, D, s4, m4, &ahead);
  if (!sc.zk_ready) {
    decode_residual_rows(row.k, codec, r.slot_k0, nr, sc.zk, sc);
    sc.zk_ready = true;
  }
  sc.zdot.resize(static_cast<size_t>(4 * nr));
  core::dot_matrix(cq.rq + q0 * D, gn, D, sc.zk.data(), nr, D, D, sc.zdot.data(), nr);
  for (int64_t j = 0; j < nr; ++j) {
    float* s = &s4[sc.res_k[j] * 4];
    for (int64_t g = 0; g < gn; ++g) s[g] += sc.zks[j] * sc.zdot[g * nr + j];
    for (int g = 0; g < 4; ++g) m4[g] = std::max(m4[g], s[g]);
  }
}

// Entries per pass of the quad kernel: a sub-tile's scores, anchor ordinals
// and residual lists stay in L1, and each stream of the cache (metadata,
// coefficients, codes) is read at the pace of the arithmetic. Whole tiles per
// pass read each stream in a burst that the prefetchers did not hide. (512
// on an Intel Sapphire Rapids machine; 1024 is ~10% faster on AMD Zen 5 and
// requests the next sub-tile's lines twice as far ahead.)
constexpr int64_t kSubTile = 1024;

// A quad's softmax runs over the sub-tiles of a tile with a shift m4 per
// query that is at most kHeadroom below the scores seen (exps up to e^16,
// sums far from overflow), so later sub-tiles rarely move it. When one does,
// to its maximum m_new[g], what the quad has summed for g so far (l4, the
// interleaved anchor weights W0 / W1, rot) is scaled by exp(old - new).
// (Raising at every new maximum made the kernel ~1.5x slower.)
constexpr float kHeadroom = 16.0f;

// What a quad has summed over a tile's sub-tiles so far.
struct QuadRun {
  float* m4;         // [4] shifts
  float* l4;         // [4] sums of exp(score - shift)
  float *W0, *W1;    // [k, 4] interleaved anchor weights (even / odd entries)
  float* rot;        // [gn, D] rotated-domain residual values
  float* acc = nullptr;  // [gn, D] values finished so far (a run over several segments), or none
};

void raise_quad_shifts(const float* m_new, int64_t gn, int64_t k, int64_t D, const QuadRun& q) {
  float *m4 = q.m4, *l4 = q.l4, *W0 = q.W0, *W1 = q.W1, *rot = q.rot;
  float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  bool raised = false;
  for (int g = 0; g < 4; ++g) {
    if (!(m_new[g] > m4[g] + kHeadroom)) continue;  // -inf + 16 = -inf: the first sub-tile sets m4
    // a lane's first shift (m4 = -inf) finds its sums, weights and rot still
    // zero: nothing to rescale (every tile's first sub-tile)
    if (m4[g] != kNegInf) {
      f[g] = std::exp(m4[g] - m_new[g]);
      raised = true;
    }
    m4[g] = m_new[g];
  }
  if (!raised) return;
  for (int g = 0; g < 4; ++g) l4[g] *= f[g];
  for (int64_t j = 0; j < k; ++j)
    for (int g = 0; g < 4; ++g) W0[j * 4 + g] *= f[g], W1[j * 4 + g] *= f[g];
  for (int64_t g = 0; g < gn; ++g)
    for (int64_t d = 0; d < D; ++d) rot[g * D + d] *= f[g];
  if (q.acc)
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t d = 0; d < D; ++d) q.acc[g * D + d] *= f[g];
}

// One quad (queries q0 .. q0 + gn) over the sub-tile whose entries
// decode_entries left in sc: scores, key residuals, the running maxima,
// exps with their value weights into W0 / W1, and value residuals into rot.
void quad_sub_tile(const CompressedQueries& cq, const compress::CompressedRow& row,
                   const compress::ResidualCodec& codec, const EntryRange& r, int64_t q0, int64_t gn, bool fused_v,
                   const QuadRun& run, LinesAhead& ahead, EntryScratch& sc) {
  const int64_t n = r.e1 - r.e0, D = codec.dim(), k = row.n_anchor;
  const int64_t nrv = static_cast<int64_t>(sc.res_v.size());
  float* s4 = sc.s.data();
  float m_sub[4];
  if (cq.rope)
    quad_rope_scores(cq, row, codec, r, q0, sc, m_sub);
  else
    QuadAnchorScoresMax(cq.anchor_dot4 + q0 * k, sc.ak.data(), sc.gk_at, n, s4, m_sub);
  if (!cq.rope || row.key_rope.enabled) add_quad_key_residuals(cq, row, codec, r, q0, gn, sc, m_sub, ahead);
  raise_quad_shifts(m_sub, gn, k, D, run);
  float l_sub[4];
  QuadExpScatter(s4, n, run.m4, l_sub, sc.av.data(), sc.gv_at, run.W0, run.W1, &ahead);
  for (int g = 0; g < 4; ++g) run.l4[g] += l_sub[g];
  if (nrv == 0) return;
  // rot[g] += sum_j p[g, i_j] * scale_j * z_j
  if (const ResidualArithmetic& a = arithmetic_of(cq); a.bf16)
    return QuadValueResiduals2BitBf16(row.v.codes.data(), codec.code_bytes(), r.slot_v0,
                                                            nrv, a.pairs, s4, sc.res_v.data(), sc.zvs.data(),
                                                            gn, D, run.rot, &ahead);
  if (fused_v)
    return QuadValueResiduals2Bit(row.v.codes.data(), codec.code_bytes(), r.slot_v0,
                                                        nrv, codec.levels().data(), s4, sc.res_v.data(),
                                                        sc.zvs.data(), gn, D, run.rot, &ahead);
  sc.zdot.resize(static_cast<size_t>(4 * nrv));
  for (int64_t g = 0; g < gn; ++g)
    for (int64_t j = 0; j < nrv; ++j) sc.zdot[g * nrv + j] = s4[sc.res_v[j] * 4 + g] * sc.zvs[j];
  core::accumulate_rows(sc.zdot.data(), nrv, sc.zv.data(), nrv, gn, D, run.rot, D);
}

// The streams of entries [e0, e1) (metadata, coefficients) and of their
// residual codes from slot_k / slot_v on (nk, nv of them, estimated).
LinesAhead lines_of_entries(const compress::CompressedRow& row, int64_t cb, int64_t e0, int64_t e1, int64_t slot_k,
                            int64_t nk, int64_t slot_v, int64_t nv) {
  LinesAhead out;
  if (e0 >= e1) return out;
  const int64_t n = e1 - e0;
  const size_t e = static_cast<size_t>(e0);
  compress::with_layout(row.layout, [&](auto L) {  // the layout's word and coefficients per entry
    const auto& words = L.words(row);
    const auto &ck = L.coefs(row.k), &cv = L.coefs(row.v);
    out.add(&words[e], static_cast<int64_t>(sizeof(words[0])) * n);
    out.add(&ck[e], static_cast<int64_t>(sizeof(ck[0])) * n);
    out.add(&cv[e], static_cast<int64_t>(sizeof(cv[0])) * n);
  });
  nk = std::min(nk, row.k.n_residual() - slot_k);
  nv = std::min(nv, row.v.n_residual() - slot_v);
  if (nk > 0) out.add(&row.k.codes[static_cast<size_t>(slot_k * cb)], nk * cb);
  if (nv > 0) out.add(&row.v.codes[static_cast<size_t>(slot_v * cb)], nv * cb);
  return out;
}

// Entries [r.e0, r.e1) of one row folded into every quad's running sums:
// shifts and sums (sc.ml), anchor weights (sc.wa / sc.wb, k of the row per
// quad), rot [nq, D] and, in a run over several segments, acc [nq, D].
// Returns the residual slots the range holds (keys, values).
std::pair<int64_t, int64_t> fold_entries(const CompressedQueries& cq, const compress::CompressedRow& row,
                                         const compress::ResidualCodec& codec, const EntryRange& r, float* acc,
                                         float* rot, EntryScratch& sc) {
  const int64_t nq = cq.nq, D = codec.dim(), k = row.n_anchor, quads = (nq + 3) / 4;
  const ResidualArithmetic& arith = arithmetic_of(cq);
  const bool fused_v = arith.bf16 || (codec.bits() == 2 && SupportsQuadValueResiduals(D));
  EntryRange sub = r;
  for (int64_t e = r.e0; e < r.e1; e += kSubTile) {
    sub.e0 = e;
    sub.e1 = std::min(r.e1, e + kSubTile);
    decode_entries(cq, row, sub, sc);
    const int64_t nrk = static_cast<int64_t>(sc.res_k.size()), nrv = static_cast<int64_t>(sc.res_v.size());
    // pre-RoPE keys coded as given are scored in fp32 (fuse_key_residuals)
    const bool keys_as_given = cq.rope && !row.key_rope.enabled;
    residual_scales(row.k, sub.slot_k0, nrk, keys_as_given ? 1.0f : arith.inv_lambda, sc.zks);
    residual_scales(row.v, sub.slot_v0, nrv, arith.inv_lambda, sc.zvs);
    sc.zk_ready = false;
    if (!fused_v) decode_residual_rows(row.v, codec, sub.slot_v0, nrv, sc.zv, sc);
    // the next sub-tile's lines (the next tile's first, up to r.ahead_end),
    // with half again this one's residual count
    const int64_t ahead_end = std::max(r.e1, r.ahead_end);
    LinesAhead ahead =
        lines_of_entries(row, codec.code_bytes(), sub.e1, std::min(ahead_end, sub.e1 + kSubTile),
                         sub.slot_k0 + nrk, nrk + nrk / 2 + 4, sub.slot_v0 + nrv, nrv + nrv / 2 + 4);
    for (int64_t qi = 0; qi < quads; ++qi) {
      const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
      const QuadRun run{&sc.ml[8 * qi],    &sc.ml[8 * qi + 4], &sc.wa[qi * 4 * k],
                        &sc.wb[qi * 4 * k], rot + q0 * D,       acc ? acc + q0 * D : nullptr};
      quad_sub_tile(cq, row, codec, sub, q0, gn, fused_v, run, ahead, sc);
    }
    sub.slot_k0 += nrk;
    sub.slot_v0 += nrv;
  }
  return {sub.slot_k0 - r.slot_k0, sub.slot_v0 - r.slot_v0};
}

// Each quad's shifts and sums start empty (sc.ml).
void start_quads(int64_t quads, EntryScratch& sc) {
  sc.ml.resize(static_cast<size_t>(8 * quads));  // per quad: four shifts, then four sums
  for (int64_t qi = 0; qi < quads; ++qi) {
    std::fill_n(&sc.ml[8 * qi], 4, kNegInf);
    std::fill_n(&sc.ml[8 * qi + 4], 4, 0.0f);
  }
}

// A row's anchors folded in as tokens of their own (gamma 1, own value) for
// the quad whose running sums `run` holds: T its interleaved scores [k, 4].
void fold_anchors(const float* T, int64_t k, int64_t gn, int64_t D, const QuadRun& run, EntryScratch& sc) {
  if (static_cast<int64_t>(sc.anchor_ids.size()) < k) {
    sc.anchor_ids.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) sc.anchor_ids[j] = static_cast<int32_t>(j);
    sc.anchor_ones.assign(static_cast<size_t>(k), 1.0f);
  }
  float* s4 = sc.s.data();
  std::copy_n(T, 4 * k, s4);
  float m_sub[4], l_sub[4];
  QuadMax(s4, k, m_sub);
  raise_quad_shifts(m_sub, gn, k, D, run);
  LinesAhead none;
  QuadExpScatter(s4, k, run.m4, l_sub, sc.anchor_ids.data(), sc.anchor_ones.data(), run.W0, run.W1, &none);
  for (int g = 0; g < 4; ++g) run.l4[g] += l_sub[g];
}

}  // namespace

// The quad kernel over entries [r.e0, r.e1) (kernels/entries.h).
void EntriesChunkQuads(const CompressedQueries& cq, const compress::CompressedRow& row,
                       const compress::ResidualCodec& codec, const EntryRange& r, PartialView out,
                       EntryScratch& sc) {
  const int64_t nq = cq.nq, D = codec.dim(), k = row.n_anchor, quads = (nq + 3) / 4;
  sc.s.resize(static_cast<size_t>(4 * kSubTile));
  sc.wa.assign(static_cast<size_t>(quads * 4 * k), 0.0f);
  sc.wb.assign(sc.wa.size(), 0.0f);
  start_quads(quads, sc);
  std::fill_n(out.acc, nq * D, 0.0f);
  std::fill_n(out.rot, nq * D, 0.0f);
  std::tie(sc.slots_k, sc.slots_v) = fold_entries(cq, row, codec, r, nullptr, out.rot, sc);
  for (int64_t qi = 0; qi < quads; ++qi) {
    const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
    std::copy_n(&sc.ml[8 * qi], gn, out.m + q0);
    std::copy_n(&sc.ml[8 * qi + 4], gn, out.l + q0);
    SumQuadWeights(&sc.wa[qi * 4 * k], &sc.wb[qi * 4 * k], k, gn, out.w + q0 * k);
  }
}

// The run kernel over whole segments of one row (attention_kernels.h).
void SegmentRunQuads(const SegmentPass* passes, int64_t n_pass, const compress::ResidualCodec& codec,
                     PartialView out, EntryScratch& sc) {
  const int64_t nq = passes[0].cq->nq, D = codec.dim(), quads = (nq + 3) / 4;
  int64_t k_max = 0;
  for (int64_t i = 0; i < n_pass; ++i) k_max = std::max(k_max, passes[i].row->n_anchor);
  sc.s.resize(static_cast<size_t>(4 * std::max(kSubTile, k_max)));
  sc.run_w.resize(static_cast<size_t>(4 * k_max));
  start_quads(quads, sc);
  std::fill_n(out.acc, nq * D, 0.0f);
  std::fill_n(out.rot, nq * D, 0.0f);
  for (int64_t i = 0; i < n_pass; ++i) {
    const SegmentPass& p = passes[i];
    const int64_t k = p.row->n_anchor;
    sc.wa.assign(static_cast<size_t>(quads * 4 * k), 0.0f);
    sc.wb.assign(sc.wa.size(), 0.0f);
    for (int64_t qi = 0; qi < quads; ++qi) {
      const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
      const QuadRun run{&sc.ml[8 * qi], &sc.ml[8 * qi + 4], &sc.wa[qi * 4 * k],
                        &sc.wb[qi * 4 * k], out.rot + q0 * D, out.acc + q0 * D};
      fold_anchors(p.cq->anchor_dot4 + q0 * k, k, gn, D, run, sc);
    }
    fold_entries(*p.cq, *p.row, codec, p.range, out.acc, out.rot, sc);
    // the segment's anchor values, weighted under the shifts its sums now hold
    for (int64_t qi = 0; qi < quads; ++qi) {
      const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
      SumQuadWeights(&sc.wa[qi * 4 * k], &sc.wb[qi * 4 * k], k, gn, sc.run_w.data());
      accumulate_rows_f16_queries(sc.run_w.data(), k, gn, k, p.row->anchor_v.data(), D, out.acc + q0 * D, D);
    }
  }
  for (int64_t qi = 0; qi < quads; ++qi) {
    const int64_t q0 = 4 * qi, gn = std::min<int64_t>(4, nq - q0);
    std::copy_n(&sc.ml[8 * qi], gn, out.m + q0);
    std::copy_n(&sc.ml[8 * qi + 4], gn, out.l + q0);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::kernels {

HWY_EXPORT(EntriesChunkQuads);
HWY_EXPORT(SegmentRunQuads);
HWY_EXPORT(SupportsQuadRope);
HWY_EXPORT(SupportsBf16Residuals);
HWY_EXPORT(SplitKeys2Bit);
HWY_EXPORT(SupportsSplitKeys2Bit);

void entries_chunk_quads(const CompressedQueries& cq, const compress::CompressedRow& row,
                         const compress::ResidualCodec& codec, const EntryRange& r, PartialView out,
                         EntryScratch& sc) {
  HWY_DYNAMIC_DISPATCH(EntriesChunkQuads)(cq, row, codec, r, out, sc);
}

void segment_run_quads(const SegmentPass* passes, int64_t n_pass, const compress::ResidualCodec& codec,
                       PartialView out, EntryWorkspace& workspace) {
  HWY_DYNAMIC_DISPATCH(SegmentRunQuads)(passes, n_pass, codec, out, workspace.scratch());
}

bool quad_rope_supported(int64_t D) { return HWY_DYNAMIC_DISPATCH(SupportsQuadRope)(D); }

ResidualArithmetic residual_arithmetic(const compress::ResidualCodec& codec, bool bf16) {
  ResidualArithmetic a;
  const std::span<const float> L = codec.levels();
  a.bf16 = bf16 && codec.bits() == 2 && HWY_DYNAMIC_DISPATCH(SupportsBf16Residuals)(codec.dim());
  if (!a.bf16) {
    std::copy(L.begin(), L.end(), a.levels);
    return a;
  }
  // lambda puts the largest level on q / 128, exact in bf16 (8 significant
  // bits), and q is chosen so the other levels round least.
  float top = 0.0f;
  for (float x : L) top = std::max(top, std::fabs(x));
  float best_lambda = 1.0f, best_err = std::numeric_limits<float>::infinity();
  for (int q = 128; q < 256; ++q) {
    const float lambda = static_cast<float>(q) / 128.0f / top;
    float err = 0.0f;
    for (float x : L)
      if (const float y = lambda * x; y != 0.0f) err = std::max(err, std::fabs(core::round_to_bf16(y) - y) / std::fabs(y));
    if (err < best_err) best_err = err, best_lambda = lambda;
  }
  for (int i = 0; i < 4; ++i) a.levels[i] = core::round_to_bf16(best_lambda * L[static_cast<size_t>(i)]);
  a.inv_lambda = 1.0f / best_lambda;
  for (uint32_t n = 0; n < 16; ++n)
    a.pairs[n] = (core::f32_bits(a.levels[n & 3]) >> 16) | (core::f32_bits(a.levels[n >> 2]) & 0xffff0000u);
  return a;
}

void split_key_residuals(const compress::CompressedSide& side, const compress::ResidualCodec& codec,
                         RopeStyle style, int64_t slot0, int64_t nr, bool simd, core::UninitVector<float>& z,
                         EntryScratch& sc, const float* row_scale) {
  const int64_t D = codec.dim(), cb = codec.code_bytes();
  z.resize(static_cast<size_t>(nr * D));
  const core::Rotation& rot = codec.rotation();
  if (simd && codec.bits() == 2 && rot.is_hadamard() && HWY_DYNAMIC_DISPATCH(SupportsSplitKeys2Bit)(D)) {
    sc.z.resize(static_cast<size_t>(D));  // as Rotation::inverse: norm * sign, then split
    const float norm = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t d = 0; d < D; ++d) sc.z[d] = norm * rot.signs()[d];
    sc.rope.ksigns.resize(static_cast<size_t>(D));
    core::rope_split(sc.z.data(), D, style, sc.rope.ksigns.data());
    return HWY_DYNAMIC_DISPATCH(SplitKeys2Bit)(side.codes.data(), cb, slot0, nr, codec.levels().data(),
                                               sc.rope.ksigns.data(), style == RopeStyle::kNeox, row_scale, D,
                                               z.data());
  }
  sc.codes.resize(static_cast<size_t>(D));
  sc.z.resize(static_cast<size_t>(D));
  for (int64_t j = 0; j < nr; ++j) {
    codec.decode_levels(&side.codes[static_cast<size_t>((slot0 + j) * cb)], sc.z.data(), sc.codes.data());
    if (row_scale)
      for (int64_t d = 0; d < D; ++d) sc.z[d] *= row_scale[j];
    rot.inverse(sc.z.data(), sc.z.data());
    core::rope_split(sc.z.data(), D, style, &z[static_cast<size_t>(j * D)]);
  }
}

}  // namespace anchorkv::kernels
#endif  // HWY_ONCE
