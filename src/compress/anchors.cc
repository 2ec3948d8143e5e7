#include "compress/anchors.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compress/segment.h"
#include "core/rng.h"

namespace anchorkv::compress {

int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

AnchorPlan plan_anchors(int64_t S, const AnchorKVConfig& config) {
  AnchorPlan p;
  p.S = S;
  // At least one anchor, unless the fraction is 0: a segment that extends
  // another may take only that one's (anchor_fractions offers it).
  const int64_t least = config.anchor_frac > 0 ? 1 : 0;
  p.k = std::min<int64_t>(S, std::max<int64_t>(least, round_half_even(static_cast<double>(S) * config.anchor_frac)));
  // The tight layout's 8-bit ordinals hold 256 anchors (docs/spec.md §5): a
  // longer segment gets fewer anchors rather than an error.
  if (config.metadata == MetadataLayout::kTight) p.k = std::min(p.k, kMaxTightAnchors);
  p.w = std::min<int64_t>(config.window, p.k);
  p.r = p.k - p.w;
  const int64_t candidates = S - p.w;
  p.n_scored = p.w > 0 ? std::min<int64_t>(round_half_even(config.rho * static_cast<double>(p.r)), candidates) : 0;
  p.n_scored = std::min(p.n_scored, p.r);
  p.n_uniform = p.r - p.n_scored;
  return p;
}

int64_t n_proxy_queries(int64_t S, int64_t window) { return window == 0 ? S : std::min(window, S); }

std::vector<int32_t> select_anchors(const AnchorPlan& plan, std::span<const float> scores,
                                    uint64_t row_seed) {
  const int64_t S = plan.S;
  const int64_t n_cand = S - plan.w;
  std::vector<int32_t> anchors;
  anchors.reserve(static_cast<size_t>(plan.k));
  for (int64_t t = n_cand; t < S; ++t) anchors.push_back(static_cast<int32_t>(t));

  std::vector<int32_t> cand(static_cast<size_t>(n_cand));
  std::iota(cand.begin(), cand.end(), 0);
  if (plan.n_scored > 0) {
    auto better = [&](int32_t a, int32_t b) {
      const float sa = scores[a], sb = scores[b];
      if (sa != sb) return sa > sb;
      return a < b;
    };
    std::partial_sort(cand.begin(), cand.begin() + plan.n_scored, cand.end(), better);
    anchors.insert(anchors.end(), cand.begin(), cand.begin() + plan.n_scored);
    cand.erase(cand.begin(), cand.begin() + plan.n_scored);
    std::sort(cand.begin(), cand.end());  // the uniform draw sees the rest in position order
  }
  if (plan.n_uniform > 0) {
    core::Rng rng(row_seed);
    const auto picked = core::sample_without_replacement(std::move(cand), plan.n_uniform, rng);
    anchors.insert(anchors.end(), picked.begin(), picked.end());
  }
  std::sort(anchors.begin(), anchors.end());
  return anchors;
}

}  // namespace anchorkv::compress
