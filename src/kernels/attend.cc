// attend(): plans the chunks of every (batch, KV head) row, runs the kernels
// in parallel, merges the partials in a fixed order and finishes each query.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "anchorkv/attention.h"
#include "cache/anchorkv_state.h"
#include "cache/full_state.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "kernels/attention_kernels.h"
#include "kernels/rope.h"

namespace anchorkv {
namespace {
constexpr int64_t kMaxRopePosition = int64_t{1} << 24;

constexpr const char* kOp = "anchorkv::attend";
constexpr int64_t kTile = 512;       // tokens per kernel call (bounds scratch)
constexpr int64_t kMaxChunks = 16;   // chunks per region: bounds the partials
constexpr int64_t kMinChunk = 8192;  // tokens (or entries) per chunk at least
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One exact fp16 region of a row: [n, D] K/V at positions pos0..pos0+n-1.
struct DenseRegion {
  std::vector<const uint16_t*> k, v;  // per row
  int64_t n = 0, pos0 = 0;
};

struct Plan {
  int64_t B = 0, H = 0, D = 0, n_total = 0;
  std::vector<DenseRegion> dense;                   // in position order around the segment
  int dense_before_segment = 0;                     // how many of `dense` precede the segment
  const internal::AnchorKVState* anchor = nullptr;  // compressed segment, if any
  int64_t seg_pos0 = 0;
};

int64_t chunk_size(int64_t n) { return std::max<int64_t>(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks); }

struct Chunk {
  enum Kind { kDense, kAnchors, kEntries } kind;
  int region = 0;        // dense region index
  int64_t a = 0, b = 0;  // token / entry range
};

}  // namespace

Tensor attend(const TensorView& query, const KVCache& cache, const AttentionOptions& opt,
              AttentionStats* stats) {
  // ---------------------------------------------------------------- the cache's layout
  Plan plan;
  KVPair fetched;  // only for caches without a kernel of their own
  if (const auto* a = dynamic_cast<const AnchorKVCache*>(&cache)) {
    const internal::AnchorKVState& st = a->state();
    plan.B = st.B;
    plan.H = st.H;
    plan.D = st.D;
    plan.n_total = st.tokens_per_row();
    auto add_exact = [&](const cache::ExactRows& rows, int64_t pos0) {
      if (rows.tokens == 0) return;
      DenseRegion r;
      r.n = rows.tokens;
      r.pos0 = pos0;
      for (int64_t i = 0; i < st.rows(); ++i) {
        r.k.push_back(rows.k[i].data());
        r.v.push_back(rows.v[i].data());
      }
      plan.dense.push_back(std::move(r));
    };
    add_exact(st.head, 0);
    plan.dense_before_segment = static_cast<int>(plan.dense.size());
    if (st.compressed()) {
      plan.anchor = &st;
      plan.seg_pos0 = st.head.tokens;
    }
    add_exact(st.tail, st.head.tokens + st.segment_tokens);
  } else {
    const internal::FullState* fs = nullptr;
    if (const auto* f = dynamic_cast<const FullKVCache*>(&cache)) fs = &f->state();
    DenseRegion r;
    if (fs) {
      plan.B = fs->B;
      plan.H = fs->H;
      plan.D = fs->D;
      r.n = fs->rows.tokens;
      for (int64_t i = 0; i < fs->B * fs->H; ++i) {
        r.k.push_back(fs->rows.k[i].data());
        r.v.push_back(fs->rows.v[i].data());
      }
    } else {
      fetched = cache.fetch();
      const Shape4& s = fetched.keys.shape();
      plan.B = s[0];
      plan.H = s[1];
      plan.D = s[3];
      r.n = s[2];
      for (int64_t i = 0; i < s[0] * s[1]; ++i) {
        r.k.push_back(fetched.keys.data_as<uint16_t>() + i * s[2] * s[3]);
        r.v.push_back(fetched.values.data_as<uint16_t>() + i * s[2] * s[3]);
      }
    }
    plan.n_total = r.n;
    if (r.n > 0) plan.dense.push_back(std::move(r));
  }

  // ---------------------------------------------------------------- validate the query
  const Shape4& qs = query.shape;
  if (plan.n_total == 0 || plan.H == 0) core::fail(ErrorCode::kInvalidState, kOp, "the cache holds no token");
  for (int i = 0; i < 4; ++i)
    if (qs[i] < 0 || query.strides[i] < 0)
      core::fail(ErrorCode::kInvalidArgument, kOp, "query has a negative dimension or stride");
  if (qs[0] != plan.B || qs[3] != plan.D)
    core::fail(ErrorCode::kShapeMismatch, kOp,
               "query " + shape_string(qs) + " does not match the cache's B=" + std::to_string(plan.B) +
                   ", D=" + std::to_string(plan.D));
  if (qs[1] < 1 || qs[1] % plan.H != 0)
    core::fail(ErrorCode::kShapeMismatch, kOp,
               "query heads Hq=" + std::to_string(qs[1]) +
                   " must be a positive multiple of the cache's H=" + std::to_string(plan.H));
  if (qs[2] > plan.n_total)
    core::fail(ErrorCode::kShapeMismatch, kOp,
               "Sq=" + std::to_string(qs[2]) + " queries but the cache holds only " +
                   std::to_string(plan.n_total) + " positions (append the queries' K/V first)");
  if (query.numel() > 0 && query.data == nullptr)
    core::fail(ErrorCode::kInvalidArgument, kOp, "query has null data");
  if (opt.out_dtype != DType::kF32 && opt.out_dtype != DType::kF16)
    core::fail(ErrorCode::kInvalidArgument, kOp, "out_dtype must be f32 or f16");
  if (!(opt.scale >= 0.0f) || !std::isfinite(opt.scale))
    core::fail(ErrorCode::kInvalidArgument, kOp, "scale must be finite and >= 0");
  const RopeOptions* rope = opt.rope.enabled ? &opt.rope : nullptr;
  if (rope && cache.tokens_kept() < cache.tokens_total())
    core::fail(
        ErrorCode::kUnsupported, kOp,
        "RoPE inside attention needs every token's position; cache '" + cache.name() + "' evicts tokens");
  if (rope) {
    if (plan.D % 2 != 0) core::fail(ErrorCode::kInvalidArgument, kOp, "RoPE needs an even head dim D");
    if (!(rope->base > 1.0) || !std::isfinite(rope->base))
      core::fail(ErrorCode::kInvalidArgument, kOp, "rope.base must be finite and > 1");
    if (rope->style != RopeStyle::kNormal && rope->style != RopeStyle::kNeox)
      core::fail(ErrorCode::kInvalidArgument, kOp, "rope.style is unknown");
    if (rope->position_offset < 0)
      core::fail(ErrorCode::kInvalidArgument, kOp, "rope.position_offset must be >= 0");
    if (rope->position_offset > kMaxRopePosition - plan.n_total)
      core::fail(
          ErrorCode::kInvalidArgument, kOp,
          "RoPE positions beyond " + std::to_string(kMaxRopePosition) + " (position_offset + cache length)");
  }
  // cos/sin rows for every key position, shared across calls (kernels/rope.h).
  std::shared_ptr<const kernels::RopeTable> rtab;
  if (rope) rtab = kernels::shared_rope_table(rope->base, plan.D, plan.n_total + rope->position_offset);

  const int64_t B = plan.B, H = plan.H, D = plan.D, Hq = qs[1], Sq = qs[2], G = Hq / H, nq = G * Sq;
  const int64_t R = B * H;
  Tensor out(opt.out_dtype, qs);
  if (Sq == 0) return out;
  const float scale = opt.scale > 0 ? opt.scale : 1.0f / std::sqrt(static_cast<float>(D));

  // Workspaces are kept per calling thread and reused across calls: decode
  // calls attend once per token, and fresh pages cost more than the work.
  // (Named through references: the worker lambdas below must see the calling
  // thread's buffers, not their own thread_local instances.)
  struct Workspace {
    core::UninitVector<float> Q, pm, pl, pacc, pw, prot;
  };
  thread_local Workspace tls_workspace;
  Workspace& ws = tls_workspace;
  auto& Q = ws.Q;
  auto& pm = ws.pm;
  auto& pl = ws.pl;
  auto& pacc = ws.pacc;
  auto& pw = ws.pw;
  auto& prot = ws.prot;
  // Queries per row, scaled: [R, nq, D], g = (hq - h * G) * Sq + i.
  Q.resize(static_cast<size_t>(R * nq * D));
  std::vector<int64_t> qpos(static_cast<size_t>(nq));
  for (int64_t g = 0; g < nq; ++g) qpos[g] = plan.n_total - Sq + g % Sq;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t row = b * H + hq / G, g = (hq % G) * Sq + i;
        float* dst = &Q[static_cast<size_t>((row * nq + g) * D)];
        for (int64_t d = 0; d < D; ++d) {
          const float x = query.at(b, hq, i, d);
          if (!std::isfinite(x))
            core::fail(ErrorCode::kNonFinite, kOp,
                       "query holds a non-finite value at [" + std::to_string(b) + ", " + std::to_string(hq) +
                           ", " + std::to_string(i) + ", " + std::to_string(d) + "]");
          dst[d] = x * scale;
        }
        if (rope) kernels::rope_rotate_at(dst, D, *rope, qpos[g] + rope->position_offset);
      }

  // ---------------------------------------------------------------- chunks
  std::vector<Chunk> chunks;
  auto add_dense = [&](int region) {
    const int64_t n = plan.dense[region].n, c = chunk_size(n);
    for (int64_t a = 0; a < n; a += c) chunks.push_back({Chunk::kDense, region, a, std::min(n, a + c)});
  };
  for (int r = 0; r < plan.dense_before_segment; ++r) add_dense(r);
  const internal::AnchorKVState* st = plan.anchor;
  int64_t k_max = 0;
  std::vector<int64_t> entry_starts;  // chunk starts over entries (same for all rows? no: per row n_other)
  if (st) {
    for (const auto& row : st->segment) k_max = std::max(k_max, row.n_anchor);
    chunks.push_back({Chunk::kAnchors, 0, 0, 0});
    // Entry chunks are planned from the longest row; shorter rows see empty ranges.
    int64_t n_other_max = 0;
    for (const auto& row : st->segment) n_other_max = std::max(n_other_max, row.n_other());
    const int64_t c = chunk_size(n_other_max);
    for (int64_t a = 0; a < n_other_max; a += c)
      chunks.push_back({Chunk::kEntries, 0, a, std::min(n_other_max, a + c)});
  }
  for (int r = plan.dense_before_segment; r < static_cast<int>(plan.dense.size()); ++r) add_dense(r);
  const int64_t C = static_cast<int64_t>(chunks.size());

  // ---------------------------------------------------------------- per-row compressed prep
  const bool masked_segment = st && (plan.n_total - Sq) < plan.seg_pos0 + st->segment_tokens - 1;
  const bool need_anchor_pos = masked_segment || rope != nullptr;
  struct RowPrep {
    std::vector<float> ak, av;            // [k, D] anchors f32
    std::vector<float> anchor_dot;        // [nq, k]
    std::vector<float> rq;                // [nq, D]
    std::vector<int32_t> anchor_pos;      // [k] when masked or with RoPE
    std::vector<float> cs;                // [nq, k, D] with RoPE (see CompressedQueries)
    std::vector<int64_t> slot_k, slot_v;  // residual slots before each entry chunk
  };
  std::vector<RowPrep> prep(static_cast<size_t>(st ? R : 0));
  if (st) {
    core::parallel_for(R, opt.threads, [&](int64_t r) {
      const compress::CompressedRow& row = st->segment[r];
      RowPrep& p = prep[r];
      const int64_t k = row.n_anchor;
      p.ak.resize(static_cast<size_t>(k * D));
      p.av.resize(static_cast<size_t>(k * D));
      core::f16_to_f32_n(row.anchor_k.data(), p.ak.data(), k * D);
      core::f16_to_f32_n(row.anchor_v.data(), p.av.data(), k * D);
      p.anchor_dot.resize(static_cast<size_t>(nq * k));
      const float* q = &Q[static_cast<size_t>(r * nq * D)];
      if (need_anchor_pos) p.anchor_pos = row.anchor_positions();
      std::vector<float> ak_rot;
      const float* ak_scores = p.ak.data();
      if (rope) {  // anchors rotated to their positions score like any key
        ak_rot = p.ak;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t pos = plan.seg_pos0 + p.anchor_pos[j] + rope->position_offset;
          kernels::rope_rotate(&ak_rot[j * D], D, rope->style, rtab->c(pos), rtab->s(pos));
        }
        ak_scores = ak_rot.data();
        const int64_t half = D / 2;
        p.cs.resize(static_cast<size_t>(nq * k * D));
        for (int64_t g = 0; g < nq; ++g)
          for (int64_t j = 0; j < k; ++j) {
            const float* qg = q + g * D;
            const float* a = &p.ak[j * D];
            float* out = &p.cs[(g * k + j) * D];
            for (int64_t i = 0; i < half; ++i) {
              const int64_t x = kernels::rope_x(rope->style, i, D), y = kernels::rope_y(rope->style, i, D);
              out[i] = qg[x] * a[x] + qg[y] * a[y];
              out[half + i] = qg[y] * a[x] - qg[x] * a[y];
            }
          }
      }
      if (opt.reference)
        core::dot_matrix_ref(q, nq, D, ak_scores, k, D, D, p.anchor_dot.data(), k);
      else
        core::dot_matrix(q, nq, D, ak_scores, k, D, D, p.anchor_dot.data(), k);
      p.rq.resize(static_cast<size_t>(nq * D));
      for (int64_t g = 0; g < nq; ++g) st->codec->rotation().forward(q + g * D, &p.rq[g * D]);
      int64_t sk = 0, sv = 0, e = 0;
      for (const Chunk& c : chunks) {
        if (c.kind != Chunk::kEntries) continue;
        const int64_t end = std::min(c.a, row.n_other());
        for (; e < end; ++e) {
          sk += row.res_k(e);
          sv += row.res_v(e);
        }
        p.slot_k.push_back(sk);
        p.slot_v.push_back(sv);
      }
    });
  }

  // ---------------------------------------------------------------- partials
  // Layout per (row, chunk, query): m, l, acc[D]; compressed chunks also w[k_max], rot[D].
  const size_t n_part = static_cast<size_t>(R * C * nq);
  const bool has_c = st != nullptr;
  pm.resize(n_part);
  pl.resize(n_part);
  pacc.resize(n_part * static_cast<size_t>(D));
  pw.resize(has_c ? n_part * static_cast<size_t>(k_max) : 0);
  prot.resize(has_c ? n_part * static_cast<size_t>(D) : 0);
  auto view = [&](int64_t r, int64_t c) {
    const size_t base = static_cast<size_t>((r * C + c) * nq);
    return kernels::PartialView{&pm[base], &pl[base], &pacc[base * D], has_c ? &pw[base * k_max] : nullptr,
                                has_c ? &prot[base * D] : nullptr};
  };

  core::parallel_for(R * C, opt.threads, [&](int64_t task) {
    const int64_t r = task / C, ci = task % C;
    const Chunk& c = chunks[static_cast<size_t>(ci)];
    kernels::PartialView out_view = view(r, ci);
    // Start empty, then fold tiles in order.
    std::fill_n(out_view.m, nq, kNegInf);
    std::fill_n(out_view.l, nq, 0.0f);
    std::fill_n(out_view.acc, nq * D, 0.0f);
    if (has_c) {
      std::fill_n(out_view.w, nq * k_max, 0.0f);
      std::fill_n(out_view.rot, nq * D, 0.0f);
    }
    thread_local core::UninitVector<float> scratch, tm, tl, tacc, tw, trot;
    const float* q = &Q[static_cast<size_t>(r * nq * D)];
    if (c.kind == Chunk::kAnchors) {
      const compress::CompressedRow& row = st->segment[r];
      const RowPrep& p = prep[r];
      kernels::CompressedQueries cq{q,           qpos.data(), nq,          p.anchor_dot.data(),
                                    p.rq.data(), rope,        p.cs.data(), rtab.get()};
      // Anchor weights land directly in this chunk's w ([nq, k] with stride k_max).
      tw.resize(static_cast<size_t>(nq * row.n_anchor));
      kernels::PartialView v{out_view.m, out_view.l, out_view.acc, tw.data(), out_view.rot};
      // anchor_pos holds segment-relative positions; the mask compares absolute ones.
      std::vector<int32_t> abs_pos;
      if (masked_segment) {
        abs_pos = p.anchor_pos;
        for (auto& x : abs_pos) x += static_cast<int32_t>(plan.seg_pos0);
      }
      kernels::anchors_chunk(cq, row.n_anchor, abs_pos.data(), masked_segment, v);
      for (int64_t g = 0; g < nq; ++g)
        std::copy_n(&tw[g * row.n_anchor], row.n_anchor, out_view.w + g * k_max);
      return;
    }
    tm.resize(static_cast<size_t>(nq));
    tl.resize(static_cast<size_t>(nq));
    tacc.resize(static_cast<size_t>(nq * D));
    if (c.kind == Chunk::kDense) {
      const DenseRegion& reg = plan.dense[c.region];
      scratch.resize(static_cast<size_t>(kTile * nq + kTile * D + 2 * D));
      for (int64_t a = c.a; a < c.b; a += kTile) {
        const int64_t n = std::min(c.b, a + kTile) - a;
        kernels::PartialView t{tm.data(), tl.data(), tacc.data(), nullptr, nullptr};
        if (rope)
          kernels::dense_chunk_rope(q, qpos.data(), nq, reg.k[r] + a * D, reg.v[r] + a * D, n, reg.pos0 + a,
                                    D, *rope, *rtab, t, scratch.data(), opt.reference);
        else
          (opt.reference ? kernels::dense_chunk_ref : kernels::dense_chunk)(
              q, qpos.data(), nq, reg.k[r] + a * D, reg.v[r] + a * D, n, reg.pos0 + a, D, t, scratch.data());
        for (int64_t g = 0; g < nq; ++g)
          kernels::merge_partial(
              out_view.m[g], out_view.l[g], out_view.acc + g * D, has_c ? out_view.w + g * k_max : nullptr,
              has_c ? out_view.rot + g * D : nullptr, tm[g], tl[g], &tacc[g * D], nullptr, nullptr, D, k_max);
      }
      return;
    }
    // Entries of the compressed segment.
    const compress::CompressedRow& row = st->segment[r];
    const RowPrep& p = prep[r];
    const int64_t e_end = std::min(c.b, row.n_other());
    if (c.a >= e_end) return;
    const int64_t k = row.n_anchor;
    kernels::CompressedQueries cq{q,           qpos.data(), nq,          p.anchor_dot.data(),
                                  p.rq.data(), rope,        p.cs.data(), rtab.get()};
    int64_t entry_chunk = 0;
    for (int64_t i = 0; i < ci; ++i) entry_chunk += chunks[static_cast<size_t>(i)].kind == Chunk::kEntries;
    int64_t sk = p.slot_k[entry_chunk], sv = p.slot_v[entry_chunk];
    scratch.resize(static_cast<size_t>(kTile * (nq + 3) + 2 * D + D));
    tw.resize(static_cast<size_t>(nq * k));
    trot.resize(static_cast<size_t>(nq * D));
    for (int64_t a = c.a; a < e_end; a += kTile) {
      const int64_t b = std::min(e_end, a + kTile);
      kernels::PartialView t{tm.data(), tl.data(), tacc.data(), tw.data(), trot.data()};
      kernels::entries_chunk(cq, row, *st->codec, a, b, sk, sv, plan.seg_pos0, masked_segment, t,
                             scratch.data(), opt.reference);
      for (int64_t e = a; e < b; ++e) {
        sk += row.res_k(e);
        sv += row.res_v(e);
      }
      for (int64_t g = 0; g < nq; ++g) {
        // w in the tile is [nq, k]; the chunk's is strided by k_max (same k per row).
        kernels::merge_partial(out_view.m[g], out_view.l[g], out_view.acc + g * D, out_view.w + g * k_max,
                               out_view.rot + g * D, tm[g], tl[g], &tacc[g * D], &tw[g * k], &trot[g * D], D,
                               k);
      }
    }
  });

  if (stats) {
    int64_t bytes =
        static_cast<int64_t>(Q.size() * 4 + qpos.size() * 8 + (pm.size() + pl.size() + pacc.size()) * 4 +
                             (pw.size() + prot.size()) * 4);
    for (const RowPrep& p : prep)
      bytes += static_cast<int64_t>(
          (p.ak.size() + p.av.size() + p.anchor_dot.size() + p.rq.size() + p.cs.size()) * 4 +
          p.anchor_pos.size() * 4 + (p.slot_k.size() + p.slot_v.size()) * 8);
    const int64_t threads = std::min<int64_t>(core::resolve_threads(opt.threads), R * C);
    // Per-thread scratch (largest use) + tile partials + finish buffers.
    bytes += threads * 4 * (kTile * (nq + 3) + 3 * D + nq * (2 + 2 * D + k_max) + 3 * D + k_max);
    if (fetched.keys.numel() > 0)
      bytes += static_cast<int64_t>(fetched.keys.nbytes() + fetched.values.nbytes());
    stats->workspace_bytes = bytes;
    stats->chunks_per_row = C;
    stats->compressed = st != nullptr;
  }

  // ---------------------------------------------------------------- merge and finish
  core::parallel_for(R, opt.threads, [&](int64_t r) {
    const int64_t b = r / H, h = r % H;
    const int64_t k = st ? st->segment[r].n_anchor : 0;
    std::vector<float> acc(static_cast<size_t>(D)), w(static_cast<size_t>(std::max<int64_t>(k_max, 1))),
        rot(static_cast<size_t>(D)), y(static_cast<size_t>(D));
    for (int64_t g = 0; g < nq; ++g) {
      float m = kNegInf, l = 0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(w.begin(), w.end(), 0.0f);
      std::fill(rot.begin(), rot.end(), 0.0f);
      for (int64_t c = 0; c < C; ++c) {
        const kernels::PartialView v = view(r, c);
        kernels::merge_partial(m, l, acc.data(), has_c ? w.data() : nullptr, has_c ? rot.data() : nullptr,
                               v.m[g], v.l[g], v.acc + g * D, has_c ? v.w + g * k_max : nullptr,
                               has_c ? v.rot + g * D : nullptr, D, k);
      }
      // y = (acc + sum_j w_j a^V_j + R^T rot) / l
      std::copy(acc.begin(), acc.end(), y.begin());
      if (has_c) {
        const RowPrep& p = prep[r];
        if (opt.reference) {
          for (int64_t j = 0; j < k; ++j)
            if (w[j] != 0.0f) core::axpy_ref(w[j], &p.av[j * D], y.data(), D);
        } else {
          core::accumulate_rows(w.data(), k, p.av.data(), k, 1, D, y.data(), D);
        }
        st->codec->rotation().inverse(rot.data(), rot.data());
        for (int64_t d = 0; d < D; ++d) y[d] += rot[d];
      }
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      const int64_t hq = h * G + g / Sq, i = g % Sq;
      const int64_t o = ((b * Hq + hq) * Sq + i) * D;
      if (opt.out_dtype == DType::kF32) {
        for (int64_t d = 0; d < D; ++d) out.data_as<float>()[o + d] = y[d] * inv;
      } else {
        for (int64_t d = 0; d < D; ++d) y[d] *= inv;
        core::f32_to_f16_n(y.data(), out.data_as<uint16_t>() + o, D);
      }
    }
  });
  return out;
}

}  // namespace anchorkv
