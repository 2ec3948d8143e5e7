#include "compress/assignment.h"

#include <algorithm>
#include <cmath>

#include "core/linalg.h"

namespace anchorkv::compress {

void choose_anchor(const float* dots, int64_t n_anchor, float token_norm, const float* anchor_norms,
                   const float* anchor_sq, int32_t* anchor_out, float* coef_out, bool simd) {
  const auto best = static_cast<int32_t>(
      simd ? core::abs_cosine_argmax(dots, n_anchor, token_norm, anchor_norms, kAssignEps)
           : core::abs_cosine_argmax_ref(dots, n_anchor, token_norm, anchor_norms, kAssignEps));
  *anchor_out = best;
  *coef_out = dots[best] / (anchor_sq[best] + kAssignEps);
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
    choose_anchor(dots.data(), n, norm, norms.data(), sq.data(), &out.anchor[t], &out.coef[t]);
  }
  return out;
}

}  // namespace anchorkv::compress
