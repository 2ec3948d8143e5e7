#include "compress/compressor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "compress/anchors.h"
#include "compress/budget.h"
#include "core/buffer.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/rope.h"

namespace anchorkv::compress {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
constexpr int64_t kChunk = 256;  // tokens per task inside a row
}  // namespace

uint64_t row_seed(uint64_t seed, int64_t row) { return core::stream_seed(seed, static_cast<uint64_t>(row)); }

void check_segment(const SegmentInput& in, const AnchorKVConfig& config) {
  if (config.key_rope.enabled)
    if (std::string problem = core::rope_problem(config.key_rope, in.D); !problem.empty())
      core::fail(ErrorCode::kInvalidArgument, "anchorkv::compress", "key_rope: " + problem);
  if (config.key_rope.enabled && in.S > core::kMaxRopePosition - config.key_rope.position_offset)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::compress",
               "RoPE positions beyond " + std::to_string(core::kMaxRopePosition) + " (key_rope.position_offset + S)");
  const AnchorPlan plan = plan_anchors(in.S, config);
  const int64_t limit = own_anchor_limit(in, config.metadata);
  if (plan.k > limit && (plan.k < in.S || in.extends))
    core::fail(ErrorCode::kUnsupported, "anchorkv::compress",
               "segment of " + std::to_string(in.S) + " tokens needs " + std::to_string(plan.k) + " anchors; the " +
                   to_string(config.metadata) + " metadata layout holds at most " + std::to_string(limit) +
                   (config.metadata == MetadataLayout::kSeed ? std::string() : " (use the seed layout)"));
}

int64_t own_anchor_limit(const SegmentInput& in, MetadataLayout layout) {
  int64_t prior = 0;
  for (int64_t row = 0; row < in.rows(); ++row) prior = std::max(prior, in.n_prior(row));
  return max_anchors(layout) - prior;
}

std::vector<float> prior_anchors(const SegmentInput& in, int64_t row, bool values) {
  const int64_t n = in.n_prior(row);
  std::vector<float> out(static_cast<size_t>(n * in.D));
  if (n > 0) {
    const CompressedRow& p = in.extends[row];
    core::f16_to_f32_n((values ? p.anchor_v : p.anchor_k).data(), out.data(), n * in.D);
  }
  return out;
}

// ---------------------------------------------------------------- reference

std::vector<RowAnalysis> analyze_reference(const SegmentInput& in, const AnchorKVConfig& config) {
  const int64_t S = in.S, D = in.D;
  const AnchorPlan plan = plan_anchors(S, config);
  std::vector<RowAnalysis> out(static_cast<size_t>(in.rows()));
  for (int64_t row = 0; row < in.rows(); ++row) {
    const float* K = in.key_row(row);
    const float* V = in.value_row(row);
    const Observers o = in.observers(row, config.window);
    const Observation obs = observe_reference(o, K, V, S, D);
    const std::vector<float> scores = window_scores(obs, S, plan.w);
    RowAnalysis& a = out[row];
    a.anchors = select_anchors(plan, scores, row_seed(config.seed, row));
    const int64_t np = in.n_prior(row);
    const std::vector<float> pk = prior_anchors(in, row, false), pv = prior_anchors(in, row, true);
    a.k = assign_reference(K, S, D, a.anchors, pk.data(), np);
    a.v = assign_reference(V, S, D, a.anchors, pv.data(), np);
    const std::vector<float> tk = anchor_table(K, D, a.anchors, pk.data(), np);
    const std::vector<float> tv = anchor_table(V, D, a.anchors, pv.data(), np);
    a.utility = utilities_reference(o, K, V, S, D, obs, a.anchors, tk.data(), a.k.anchor.data(), a.k.coef.data(),
                                    tv.data(), a.v.anchor.data(), a.v.coef.data());
  }
  return out;
}

// ---------------------------------------------------------------- fast path

namespace {

// The fast analysis of one anchor count against a segment's observation
// (observe below): anchors per row, then assignment and utilities per (row,
// chunk of kChunk tokens); work items never depend on the thread count, so
// neither do the results.
class FastAnalysis {
 public:
  FastAnalysis(const SegmentInput& in, const AnchorKVConfig& config, const SegmentObservation& obs)
      : in_(in), config_(config), obs_(obs), plan_(plan_anchors(in.S, config)), S_(in.S), D_(in.D),
        R_(in.rows()), m_(in.observers(0, config.window).m), n_chunks_((in.S + kChunk - 1) / kChunk),
        inv_sqrt_d_(1.0f / std::sqrt(static_cast<float>(in.D))), work_(static_cast<size_t>(R_)),
        out_(static_cast<size_t>(R_)) {}

  std::vector<RowAnalysis> run(CompressionStats* stats) {
    const int threads = config_.threads;
    auto t0 = Clock::now();
    core::parallel_for(R_, threads, [&](int64_t row) { anchors(row); });
    const double anchors_s = seconds_since(t0);
    t0 = Clock::now();
    core::parallel_for(R_ * n_chunks_, threads, [&](int64_t task) { assign_chunk(task / n_chunks_, task % n_chunks_); });
    if (stats) {
      stats->scores_s = obs_.seconds;
      stats->anchors_s = anchors_s;
      stats->assign_s = seconds_since(t0);
    }
    return std::move(out_);
  }

 private:
  struct RowWork {
    std::vector<int32_t> ordinal;                   // [S] anchor ordinal or -1
    std::vector<float> ak, av;                      // [k, D] anchors
    std::vector<float> k_norm, k_sq, v_norm, v_sq;  // [k]
  };
  // Per-thread scratch of one chunk, reused across tasks (fresh pages are costly).
  struct ChunkScratch {
    core::UninitVector<float> dots, r, qr, dist;
  };

  void anchors(int64_t row);
  void anchor_rows(int64_t row);
  void assign_chunk(int64_t row, int64_t c);
  void assign_side(const float* X, const float* anchor_rows, const float* norm, const float* sq,
                   const std::vector<int32_t>& ordinal, int64_t k, int64_t a, int64_t n, SideAssignment& side,
                   ChunkScratch& sc);
  void assign_keys(int64_t row, int64_t a, int64_t n, ChunkScratch& sc);
  void assign_values(int64_t row, int64_t a, int64_t n, ChunkScratch& sc);

  const SegmentInput& in_;
  const AnchorKVConfig& config_;
  const SegmentObservation& obs_;
  const AnchorPlan plan_;
  const int64_t S_, D_, R_, m_, n_chunks_;
  const float inv_sqrt_d_;
  std::vector<RowWork> work_;
  std::vector<RowAnalysis> out_;
};

// The observation's logits: the observers' scores of tokens [a, a + kChunk)
// of one row, into its alpha [S, m].
void proxy_logits(const SegmentInput& in, const AnchorKVConfig& config, int64_t row, int64_t c, int64_t m,
                  float* alpha) {
  const int64_t S = in.S, D = in.D, a = c * kChunk, b = std::min(S, a + kChunk);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  const float* K = in.key_row(row);
  const Observers o = in.observers(row, config.window);
  float* L = alpha + a * m;
  core::dot_matrix(K + a * D, b - a, D, o.rows, m, D, D, L, m);
  for (int64_t i = 0; i < (b - a) * m; ++i) L[i] *= inv_sqrt_d;
  if (!o.real()) return;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t t = a; t < b; ++t)  // real queries see positions up to their own
    for (int64_t w = 0; w < m; ++w)
      if (t >= o.visible(w, S)) L[(t - a) * m + w] = kNegInf;
}

// Then softmax over positions for each observer (column of A [S, m]).
void softmax_over_positions(int64_t S, int64_t m, float* A) {
  std::vector<float> mx(static_cast<size_t>(m), -std::numeric_limits<float>::infinity());
  std::vector<double> sum(static_cast<size_t>(m), 0.0);
  for (int64_t t = 0; t < S; ++t)
    for (int64_t w = 0; w < m; ++w) mx[w] = A[t * m + w] > mx[w] ? A[t * m + w] : mx[w];
  for (int64_t t = 0; t < S; ++t)
    for (int64_t w = 0; w < m; ++w) {
      float& x = A[t * m + w];
      x = std::exp(x - mx[w]);
      sum[w] += x;
    }
  std::vector<float> inv(static_cast<size_t>(m));
  for (int64_t w = 0; w < m; ++w) inv[w] = static_cast<float>(1.0 / sum[w]);
  for (int64_t t = 0; t < S; ++t)
    for (int64_t w = 0; w < m; ++w) A[t * m + w] *= inv[w];
}

// And the observers' outputs y [m, D] = sum over t of A[t, w] V[t].
std::vector<float> observed_outputs(const float* A, const float* V, int64_t S, int64_t m, int64_t D) {
  std::vector<float> y(static_cast<size_t>(m * D), 0.0f);
  for (int64_t t = 0; t < S; ++t)
    for (int64_t w = 0; w < m; ++w) core::axpy(A[t * m + w], V + t * D, &y[w * D], D);
  return y;
}

// Anchors, per row: the plan's window anchors, scored and uniform ones.
void FastAnalysis::anchors(int64_t row) {
  const float* A = obs_.rows[static_cast<size_t>(row)].alpha.data();
  const int64_t S = S_, m = m_;
  std::vector<float> scores(static_cast<size_t>(S), 0.0f);
  if (plan_.w > 0) {  // as window_scores: the last w proxies, or every real query
    const int64_t first = in_.Q ? 0 : m - plan_.w;
    for (int64_t t = 0; t < S; ++t) {
      double s = 0;
      for (int64_t i = first; i < m; ++i) s += A[t * m + i];
      scores[t] = static_cast<float>(s / static_cast<double>(m - first));
    }
  }
  out_[row].anchors = select_anchors(plan_, scores, row_seed(config_.seed, row));
  anchor_rows(row);
  RowAnalysis& ra = out_[row];
  for (auto* v : {&ra.k.coef, &ra.v.coef, &ra.utility.key, &ra.utility.value}) v->resize(static_cast<size_t>(S));
  ra.k.anchor.resize(static_cast<size_t>(S));
  ra.v.anchor.resize(static_cast<size_t>(S));
}

// The anchor table's K and V rows (the prior anchors, then the row's own)
// and norms, and the own anchors' ordinals.
void FastAnalysis::anchor_rows(int64_t row) {
  RowWork& rw = work_[row];
  const auto& anchors = out_[row].anchors;
  const int64_t np = in_.n_prior(row), k = np + static_cast<int64_t>(anchors.size()), D = D_;
  rw.ordinal.assign(static_cast<size_t>(S_), -1);
  for (size_t j = 0; j < anchors.size(); ++j) rw.ordinal[anchors[j]] = static_cast<int32_t>(np + static_cast<int64_t>(j));
  rw.ak = anchor_table(in_.key_row(row), D, anchors, prior_anchors(in_, row, false).data(), np);
  rw.av = anchor_table(in_.value_row(row), D, anchors, prior_anchors(in_, row, true).data(), np);
  for (auto* v : {&rw.k_norm, &rw.k_sq, &rw.v_norm, &rw.v_sq}) v->resize(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    rw.k_sq[j] = core::dot_ref(&rw.ak[j * D], &rw.ak[j * D], D);  // as the reference (choose_anchor)
    rw.v_sq[j] = core::dot_ref(&rw.av[j * D], &rw.av[j * D], D);
    rw.k_norm[j] = std::sqrt(rw.k_sq[j]);
    rw.v_norm[j] = std::sqrt(rw.v_sq[j]);
  }
}

// Stage 3: assignment, projection and utilities, per (row, chunk).
void FastAnalysis::assign_chunk(int64_t row, int64_t c) {
  const int64_t a = c * kChunk, n = std::min(S_, a + kChunk) - a;
  const int64_t k = static_cast<int64_t>(work_[row].k_sq.size());  // the anchor table
  thread_local ChunkScratch sc;
  sc.dots.resize(static_cast<size_t>(n * k));
  sc.r.resize(static_cast<size_t>(n * D_));
  sc.qr.resize(static_cast<size_t>(n * m_));
  sc.dist.resize(static_cast<size_t>(n * m_));
  assign_keys(row, a, n, sc);
  assign_values(row, a, n, sc);
}

// Assigns tokens [a, a + n) of one side (K or V) to their anchors; sc.r gets
// the residuals (zero for anchors, which map to themselves with gamma 1).
void FastAnalysis::assign_side(const float* X, const float* anchor_rows, const float* norm, const float* sq,
                               const std::vector<int32_t>& ordinal, int64_t k, int64_t a, int64_t n,
                               SideAssignment& side, ChunkScratch& sc) {
  const int64_t D = D_;
  core::dot_matrix(X + a * D, n, D, anchor_rows, k, D, D, sc.dots.data(), k);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = a + i;
    float* ri = &sc.r[i * D];
    if (ordinal[t] >= 0) {
      side.anchor[t] = ordinal[t];
      side.coef[t] = 1.0f;
      std::fill_n(ri, D, 0.0f);
      continue;
    }
    const float x_norm = std::sqrt(core::dot(X + t * D, X + t * D, D));
    choose_anchor({anchor_rows, D, k, norm, sq}, X + t * D, &sc.dots[i * k], x_norm, &side.anchor[t], &side.coef[t],
                  true);
    residual(X + t * D, &anchor_rows[side.anchor[t] * D], side.coef[t], D, ri);
  }
}

void FastAnalysis::assign_keys(int64_t row, int64_t a, int64_t n, ChunkScratch& sc) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const RowWork& rw = work_[row];
  RowAnalysis& ra = out_[row];
  const int64_t k = static_cast<int64_t>(rw.k_sq.size()), D = D_, m = m_;
  const float* K = in_.key_row(row);
  assign_side(K, rw.ak.data(), rw.k_norm.data(), rw.k_sq.data(), rw.ordinal, k, a, n, ra.k, sc);
  core::dot_matrix(sc.r.data(), n, D, in_.observers(row, config_.window).rows, m, D, D, sc.qr.data(), m);
  for (auto& x : sc.qr) x *= inv_sqrt_d_;
  const SegmentObservation::Row& o = obs_.rows[static_cast<size_t>(row)];
  core::sq_dist_matrix(in_.value_row(row) + a * D, n, D, o.y.data(), m, D, D, sc.dist.data(), m);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = a + i;
    ra.utility.key[t] = rw.ordinal[t] >= 0
                            ? kNegInf
                            : static_cast<float>(key_utility(&o.alpha[t * m], &sc.qr[i * m], &sc.dist[i * m], m, 1));
  }
}

void FastAnalysis::assign_values(int64_t row, int64_t a, int64_t n, ChunkScratch& sc) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const RowWork& rw = work_[row];
  RowAnalysis& ra = out_[row];
  const int64_t k = static_cast<int64_t>(rw.k_sq.size()), D = D_, m = m_;
  assign_side(in_.value_row(row), rw.av.data(), rw.v_norm.data(), rw.v_sq.data(), rw.ordinal, k, a, n, ra.v, sc);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = a + i;
    const float* ri = &sc.r[i * D];
    ra.utility.value[t] = rw.ordinal[t] >= 0
                              ? kNegInf
                              : static_cast<float>(value_weight(&obs_.rows[static_cast<size_t>(row)].alpha[t * m], m, 1) *
                                                   core::dot(ri, ri, D));
  }
}

}  // namespace

SegmentObservation observe(const SegmentInput& in, const AnchorKVConfig& config) {
  const auto t0 = Clock::now();
  const int64_t S = in.S, R = in.rows(), m = in.observers(0, config.window).m, n_chunks = (S + kChunk - 1) / kChunk;
  SegmentObservation obs;
  obs.rows.resize(static_cast<size_t>(R));
  for (auto& r : obs.rows) r.alpha.resize(static_cast<size_t>(S * m));
  core::parallel_for(R * n_chunks, config.threads, [&](int64_t task) {
    const int64_t row = task / n_chunks;
    proxy_logits(in, config, row, task % n_chunks, m, obs.rows[static_cast<size_t>(row)].alpha.data());
  });
  core::parallel_for(R, config.threads, [&](int64_t row) {
    SegmentObservation::Row& r = obs.rows[static_cast<size_t>(row)];
    softmax_over_positions(S, m, r.alpha.data());
    r.y = observed_outputs(r.alpha.data(), in.value_row(row), S, m, in.D);
  });
  obs.seconds = seconds_since(t0);
  return obs;
}

std::vector<RowAnalysis> analyze(const SegmentInput& in, const AnchorKVConfig& config, const SegmentObservation& obs,
                                 CompressionStats* stats) {
  return FastAnalysis(in, config, obs).run(stats);
}

std::vector<RowAnalysis> analyze(const SegmentInput& in, const AnchorKVConfig& config, CompressionStats* stats) {
  return analyze(in, config, observe(in, config), stats);
}

// ---------------------------------------------------------------- shared

ResidualChoice allocate_residuals(const SegmentInput& in, const AnchorKVConfig& config,
                                  const std::vector<RowAnalysis>& analysis) {
  const int64_t S = in.S, D = in.D;
  const int64_t b_res = residual_bytes(D, config.residual_bits);
  ResidualChoice choice;
  choice.k.resize(static_cast<size_t>(in.rows()));
  choice.v.resize(static_cast<size_t>(in.rows()));
  const int64_t group = config.allocation == ResidualAllocation::kPooledAcrossHeads ? in.H : 1;
  for (int64_t first = 0; first < in.rows(); first += group) {
    int64_t full = 0, base = 0;
    std::vector<std::span<const float>> uk, uv;
    for (int64_t row = first; row < first + group; ++row) {
      const RowAnalysis& a = analysis[row];
      full += full_row_bytes(S, D);
      base += base_row_bytes(S, static_cast<int64_t>(a.anchors.size()), D, config.metadata);
      uk.emplace_back(a.utility.key);
      uv.emplace_back(a.utility.value);
    }
    const BudgetSplit n = split_budget(residual_budget(config.theta, full, base, b_res));
    auto ck = allocate_top(uk, n.keys);
    auto cv = allocate_top(uv, n.values);
    for (int64_t i = 0; i < group; ++i) {
      choice.k[first + i] = std::move(ck[i]);
      choice.v[first + i] = std::move(cv[i]);
    }
  }
  return choice;
}

namespace {
// Starts a row of layout L: its anchor positions where L lists them, each
// side's coefficient range where L needs one (the largest |gamma| of the
// row's tokens; anchors have gamma 1, harmless to include), room for the
// entries.
template <class L>
void begin_row(L, CompressedRow& out, const RowAnalysis& a, int64_t S, const CompressedRow* extends) {
  const auto n_other = static_cast<size_t>(S - static_cast<int64_t>(a.anchors.size()));
  out.layout = L::kKind;
  if (L::kListsPositions) out.anchor_pos = a.anchors;
  float max_k = 0.0f, max_v = 0.0f;
  for (int64_t t = 0; t < S; ++t) {
    max_k = std::max(max_k, std::fabs(a.k.coef[t]));
    max_v = std::max(max_v, std::fabs(a.v.coef[t]));
  }
  L::begin(out, max_k, max_v);
  if (extends) {  // one exponent per row and side: the extended row's (larger gammas clamp)
    out.k.coef_exp = extends->k.coef_exp;
    out.v.coef_exp = extends->v.coef_exp;
  }
  L::words(out).reserve(n_other);
  L::coefs(out.k).reserve(n_other);
  L::coefs(out.v).reserve(n_other);
}
}  // namespace

std::vector<CompressedRow> encode_rows(const SegmentInput& in, const ResidualCodec& codec,
                                       const std::vector<RowAnalysis>& analysis,
                                       const ResidualChoice& choice, int threads, MetadataLayout layout,
                                       const RopeOptions& key_rope) {
  const int64_t S = in.S, D = in.D;
  const int64_t cb = codec.code_bytes();
  std::optional<core::PositionRotator> to_position;
  if (key_rope.enabled) to_position.emplace(key_rope, D, key_rope.position_offset, S);
  std::vector<CompressedRow> rows(static_cast<size_t>(in.rows()));
  core::parallel_for(in.rows(), threads, [&](int64_t row) {
    const RowAnalysis& a = analysis[row];
    const float* K = in.key_row(row);
    const float* V = in.value_row(row);
    CompressedRow& out = rows[row];
    const int64_t k = static_cast<int64_t>(a.anchors.size()), np = in.n_prior(row);
    const std::vector<float> table_k = anchor_table(K, D, a.anchors, prior_anchors(in, row, false).data(), np);
    const std::vector<float> table_v = anchor_table(V, D, a.anchors, prior_anchors(in, row, true).data(), np);
    out.length = S;
    out.n_anchor = k;
    out.key_rope = key_rope;
    out.anchor_k.resize(static_cast<size_t>(k * D));
    out.anchor_v.resize(static_cast<size_t>(k * D));
    for (int64_t j = 0; j < k; ++j) {
      core::float_to_half_n(K + a.anchors[j] * D, &out.anchor_k[j * D], D);
      core::float_to_half_n(V + a.anchors[j] * D, &out.anchor_v[j * D], D);
    }
    with_layout(layout, [&](auto L) { begin_row(L, out, a, S, in.extends ? &in.extends[row] : nullptr); });
    const auto& rk = choice.k[row];
    const auto& rv = choice.v[row];
    out.k.codes.resize(rk.size() * static_cast<size_t>(cb));
    out.k.scales.resize(rk.size());
    out.v.codes.resize(rv.size() * static_cast<size_t>(cb));
    out.v.scales.resize(rv.size());
    std::vector<float> r(static_cast<size_t>(D)), scratch(static_cast<size_t>(2 * D));
    size_t ia = 0, ik = 0, iv = 0;
    for (int64_t t = 0; t < S; ++t) {
      if (ia < a.anchors.size() && a.anchors[ia] == t) {
        ++ia;
        continue;
      }
      Meta m;
      m.anchor_k = a.k.anchor[t];
      m.anchor_v = a.v.anchor[t];
      m.anchors_before = static_cast<int32_t>(ia);
      m.res_k = ik < rk.size() && rk[ik] == t;
      m.res_v = iv < rv.size() && rv[iv] == t;
      const auto [gk, gv] = with_layout(layout, [&](auto L) {
        L.append_fields(out, m);
        return std::pair{L.append_coef(out.k, a.k.coef[t], m.res_k), L.append_coef(out.v, a.v.coef[t], m.res_v)};
      });
      if (m.res_k) {
        residual(K + t * D, &table_k[static_cast<size_t>(m.anchor_k * D)], gk, D, r.data());
        if (to_position) to_position->rotate(r.data(), key_rope.position_offset + t);
        codec.encode(r.data(), &out.k.codes[ik * cb], &out.k.scales[ik], scratch.data());
        ++ik;
      }
      if (m.res_v) {
        residual(V + t * D, &table_v[static_cast<size_t>(m.anchor_v * D)], gv, D, r.data());
        codec.encode(r.data(), &out.v.codes[iv * cb], &out.v.scales[iv], scratch.data());
        ++iv;
      }
    }
  });
  return rows;
}

double residual_distortion(int bits) {
  static constexpr double kLloydMaxGaussian[] = {1.0, 0.3634, 0.1175, 0.03454, 0.009497};
  return kLloydMaxGaussian[std::clamp(bits, 0, 4)];
}

double estimated_error(const std::vector<RowAnalysis>& analysis, const ResidualChoice& choice, int bits) {
  const double eps = residual_distortion(bits);
  double err = 0;
  for (size_t r = 0; r < analysis.size(); ++r) {
    for (int side = 0; side < 2; ++side) {
      const std::vector<float>& u = side == 0 ? analysis[r].utility.key : analysis[r].utility.value;
      const std::vector<int32_t>& chosen = side == 0 ? choice.k[r] : choice.v[r];
      size_t next = 0;
      for (size_t t = 0; t < u.size(); ++t) {
        const bool has_residual = next < chosen.size() && chosen[next] == static_cast<int32_t>(t);
        next += has_residual;
        if (!std::isfinite(u[t])) continue;  // anchors: exact
        err += (has_residual ? eps : 1.0) * static_cast<double>(u[t]);
      }
    }
  }
  return err;
}

std::vector<double> anchor_fractions(const SegmentInput& in, const AnchorKVConfig& config) {
  std::vector<double> out = {config.anchor_frac};
  if (config.anchor_count != AnchorCount::kAuto) return out;
  const int64_t k0 = plan_anchors(in.S, config).k;
  const double allowed = config.theta * static_cast<double>(full_row_bytes(in.S, in.D));
  // A segment that extends another, whose own anchors and metadata would
  // take more than half of theta's bytes (a short one), may take none: its
  // tokens take the earlier anchors and the bytes go to residuals.
  // (Measured: docs/results.md, "Whole sessions".)
  if (in.extends && static_cast<double>(base_row_bytes(in.S, k0, in.D, config.metadata)) > allowed / 2)
    out.insert(out.begin(), 0.0);
  for (int i = 1; i <= kMaxAnchorDoublings; ++i) {
    const int64_t k = k0 << i;
    if (k > in.S / 2 || k > own_anchor_limit(in, config.metadata)) break;
    if (static_cast<double>(base_row_bytes(in.S, k, in.D, config.metadata)) > allowed) break;
    out.push_back(static_cast<double>(k) / static_cast<double>(in.S));
  }
  return out;
}

namespace {
// The analysis (and the config it was made with) of the anchor fraction with
// the least estimated error; `analyze_with` is the fast or the reference analysis.
template <class Analyze>
std::vector<RowAnalysis> analyze_best(const SegmentInput& in, AnchorKVConfig& config, Analyze analyze_with) {
  const std::vector<double> fractions = anchor_fractions(in, config);
  std::vector<RowAnalysis> best;
  double best_err = 0;
  AnchorKVConfig best_config = config;
  for (double f : fractions) {
    AnchorKVConfig c = config;
    c.anchor_frac = f;
    std::vector<RowAnalysis> a = analyze_with(c);
    if (fractions.size() == 1) return a;
    const double err = estimated_error(a, allocate_residuals(in, c, a), c.residual_bits);
    if (best.empty() || err < best_err) {
      best = std::move(a);
      best_err = err;
      best_config = c;
    }
  }
  config = best_config;
  return best;
}
}  // namespace

std::vector<CompressedRow> compress_reference(const SegmentInput& in, const AnchorKVConfig& config,
                                              const ResidualCodec& codec) {
  check_segment(in, config);
  AnchorKVConfig c = config;
  const auto analysis = analyze_best(in, c, [&](const AnchorKVConfig& x) { return analyze_reference(in, x); });
  const auto choice = allocate_residuals(in, c, analysis);
  return encode_rows(in, codec, analysis, choice, 1, c.metadata, c.key_rope);
}

std::vector<CompressedRow> compress(const SegmentInput& in, const AnchorKVConfig& config,
                                    const ResidualCodec& codec, CompressionStats* stats) {
  check_segment(in, config);
  const auto start = Clock::now();
  if (stats) *stats = {};
  AnchorKVConfig c = config;
  int64_t tried = 0;
  const SegmentObservation obs = observe(in, c);  // one for every anchor count tried
  if (stats) stats->scores_s = obs.seconds;
  const auto analysis = analyze_best(in, c, [&](const AnchorKVConfig& x) {
    CompressionStats one;
    auto a = analyze(in, x, obs, &one);
    ++tried;
    if (stats) {
      stats->anchors_s += one.anchors_s;
      stats->assign_s += one.assign_s;
    }
    return a;
  });
  auto t0 = Clock::now();
  const auto choice = allocate_residuals(in, c, analysis);
  const double allocate_s = seconds_since(t0);
  t0 = Clock::now();
  auto rows = encode_rows(in, codec, analysis, choice, config.threads, config.metadata, config.key_rope);
  if (stats) {
    stats->allocate_s = allocate_s;
    stats->encode_s = seconds_since(t0);
    stats->total_s = seconds_since(start);
    stats->rows = in.rows();
    stats->tokens = in.S;
    stats->anchor_counts_tried = tried;
  }
  return rows;
}

}  // namespace anchorkv::compress
