// Anchor selection (docs/spec.md §4.1).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "anchorkv/config.h"

namespace anchorkv::compress {

// Python's round(): half to even.
int64_t round_half_even(double x);

struct AnchorPlan {
  int64_t S = 0;
  int64_t k = 0;          // anchors in all: min(S, max(1, round(S * anchor_frac))); 0 when anchor_frac is 0
  int64_t w = 0;          // trailing window anchors: min(window, k)
  int64_t r = 0;          // k - w
  int64_t n_scored = 0;   // min(round(rho * r), S - w) when w > 0, else 0
  int64_t n_uniform = 0;  // r - n_scored
};

AnchorPlan plan_anchors(int64_t S, const AnchorKVConfig& config);

// Proxy queries used for scoring and utilities: the trailing m keys, with
// m = min(window, S), and m = S when window == 0 (the seed's slicing).
int64_t n_proxy_queries(int64_t S, int64_t window);

// scores[t]: mean observation-window attention of candidate t (only read when
// plan.w > 0). Top n_scored candidates by score (ties: lower position), then
// n_uniform drawn uniformly from the rest with Rng(row_seed). Sorted ascending.
std::vector<int32_t> select_anchors(const AnchorPlan& plan, std::span<const float> scores,
                                    uint64_t row_seed);

}  // namespace anchorkv::compress
