#include "compress/assignment.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/linalg.h"

namespace anchorkv::compress {

namespace {

float abs_cosine(float dot, float token_norm, float anchor_norm) {
  return std::fabs(dot) / (token_norm * anchor_norm + kAssignEps);
}

// Among the anchors whose cosine is within `tol` of the best, the one with
// the largest cosine in the reference's arithmetic (scalar sums in index
// order), lower ordinal on equality.
int64_t settle_near_tie(const AnchorCandidates& c, const float* x, const float* dots, float token_norm, float tol) {
  float best_sim = -1.0f;
  for (int64_t j = 0; j < c.n_anchor; ++j) best_sim = std::max(best_sim, abs_cosine(dots[j], token_norm, c.norms[j]));
  const float x_norm = std::sqrt(core::dot_ref(x, x, c.D));
  int64_t best = 0;
  float top = -1.0f;
  for (int64_t j = 0; j < c.n_anchor; ++j) {
    if (abs_cosine(dots[j], token_norm, c.norms[j]) < best_sim - tol) continue;
    const float* a = c.table + j * c.D;
    const float sim = abs_cosine(core::dot_ref(x, a, c.D), x_norm, std::sqrt(core::dot_ref(a, a, c.D)));
    if (sim > top) top = sim, best = j;
  }
  return best;
}

}  // namespace

void choose_anchor(const AnchorCandidates& c, const float* x, const float* dots, float token_norm,
                   int32_t* anchor_out, float* coef_out, bool simd) {
  const int64_t n = c.n_anchor;
  // Two summation orders of a length-D dot product differ by at most about
  // 2 D u |x| |a| (u = FLT_EPSILON / 2), so two cosines closer than twice
  // that may rank either way: such near-ties are settled in one arithmetic
  // both paths share, and the SIMD path picks the reference's anchor.
  const float tol = 4.0f * static_cast<float>(c.D) * FLT_EPSILON;
  int64_t best = 0;
  const int64_t near = simd ? core::abs_cosine_near_max(dots, n, token_norm, c.norms, kAssignEps, tol, &best)
                            : core::abs_cosine_near_max_ref(dots, n, token_norm, c.norms, kAssignEps, tol, &best);
  if (near > 1) best = settle_near_tie(c, x, dots, token_norm, tol);
  *anchor_out = static_cast<int32_t>(best);
  // gamma in one arithmetic for both paths: the residual x - gamma a is then
  // the same bits in both, and so are its codes (a gamma one ulp off moves a
  // residual across a quantization boundary now and then).
  *coef_out = core::dot_fixed_order(x, c.table + best * c.D, c.D) / (c.sq[best] + kAssignEps);
}

std::vector<float> anchor_table(const float* X, int64_t D, std::span<const int32_t> anchors,
                                const float* prior, int64_t n_prior) {
  std::vector<float> table(static_cast<size_t>((n_prior + static_cast<int64_t>(anchors.size())) * D));
  if (n_prior > 0) std::copy_n(prior, n_prior * D, table.begin());
  for (size_t j = 0; j < anchors.size(); ++j)
    std::copy_n(X + anchors[j] * D, D, table.begin() + (n_prior + static_cast<int64_t>(j)) * D);
  return table;
}

SideAssignment assign_reference(const float* X, int64_t S, int64_t D, std::span<const int32_t> anchors,
                                const float* prior, int64_t n_prior) {
  const std::vector<float> table = anchor_table(X, D, anchors, prior, n_prior);
  const int64_t n = n_prior + static_cast<int64_t>(anchors.size());
  std::vector<float> norms(static_cast<size_t>(n)), sq(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const float* a = &table[static_cast<size_t>(j * D)];
    sq[j] = core::dot_ref(a, a, D);
    norms[j] = std::sqrt(sq[j]);
  }
  SideAssignment out;
  out.anchor.assign(static_cast<size_t>(S), 0);
  out.coef.assign(static_cast<size_t>(S), 0.0f);
  std::vector<float> dots(static_cast<size_t>(n));
  size_t next_anchor = 0;
  for (int64_t t = 0; t < S; ++t) {
    if (next_anchor < anchors.size() && anchors[next_anchor] == t) {
      out.anchor[t] = static_cast<int32_t>(n_prior + static_cast<int64_t>(next_anchor++));
      out.coef[t] = 1.0f;
      continue;
    }
    const float* x = X + t * D;
    for (int64_t j = 0; j < n; ++j) dots[j] = core::dot_ref(x, &table[static_cast<size_t>(j * D)], D);
    const float norm = std::sqrt(core::dot_ref(x, x, D));
    choose_anchor({table.data(), D, n, norms.data(), sq.data()}, x, dots.data(), norm, &out.anchor[t], &out.coef[t]);
  }
  return out;
}

}  // namespace anchorkv::compress
