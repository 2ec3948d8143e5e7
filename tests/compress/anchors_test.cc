#include "compress/anchors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace anchorkv::compress {
namespace {

TEST(Anchors, RoundHalfEvenLikePython) {
  EXPECT_EQ(round_half_even(2.5), 2);
  EXPECT_EQ(round_half_even(3.5), 4);
  EXPECT_EQ(round_half_even(22.4), 22);
  EXPECT_EQ(round_half_even(0.5), 0);
}

TEST(Anchors, PlanFollowsSpec) {
  AnchorKVConfig c;
  auto p = plan_anchors(320, c);  // 320/128 = 2.5 -> 2, not 3
  EXPECT_EQ(p.k, 2);
  EXPECT_EQ(p.w, 2);
  EXPECT_EQ(p.r, 0);
  p = plan_anchors(8192, c);
  EXPECT_EQ(p.k, 64);
  EXPECT_EQ(p.w, 32);
  EXPECT_EQ(p.r, 32);
  EXPECT_EQ(p.n_scored, 22);  // round(0.7 * 32) = round(22.4)
  EXPECT_EQ(p.n_uniform, 10);
  p = plan_anchors(4096, c);
  EXPECT_EQ(p.k, 32);
  EXPECT_EQ(p.r, 0);
  p = plan_anchors(1, c);
  EXPECT_EQ(p.k, 1);
  EXPECT_EQ(p.w, 1);
  p = plan_anchors(10, c);  // S < window: k = max(1, round(10/128)) = 1
  EXPECT_EQ(p.k, 1);
  EXPECT_EQ(p.w, 1);

  AnchorKVConfig w0;
  w0.window = 0;
  p = plan_anchors(8192, w0);
  EXPECT_EQ(p.w, 0);
  EXPECT_EQ(p.n_scored, 0);
  EXPECT_EQ(p.n_uniform, 64);

  AnchorKVConfig r0, r1;
  r0.rho = 0;
  r1.rho = 1;
  EXPECT_EQ(plan_anchors(8192, r0).n_scored, 0);
  EXPECT_EQ(plan_anchors(8192, r0).n_uniform, 32);
  EXPECT_EQ(plan_anchors(8192, r1).n_scored, 32);
  EXPECT_EQ(plan_anchors(8192, r1).n_uniform, 0);

  AnchorKVConfig all;
  all.anchor_frac = 1.0;
  p = plan_anchors(100, all);
  EXPECT_EQ(p.k, 100);
  EXPECT_EQ(p.w, 32);
  EXPECT_EQ(p.n_scored + p.n_uniform, 68);
}

TEST(Anchors, ProxyQueries) {
  EXPECT_EQ(n_proxy_queries(100, 32), 32);
  EXPECT_EQ(n_proxy_queries(10, 32), 10);
  EXPECT_EQ(n_proxy_queries(100, 0), 100);  // seed slicing: all keys
}

TEST(Anchors, SelectionTakesWindowTopScoresThenSeededUniform) {
  AnchorKVConfig c;
  c.window = 4;
  c.anchor_frac = 10.0 / 100;  // k = 10, w = 4, r = 6, n_scored = round(4.2) = 4, uniform 2
  const auto p = plan_anchors(100, c);
  ASSERT_EQ(p.n_scored, 4);
  ASSERT_EQ(p.n_uniform, 2);
  std::vector<float> scores(100, 0.01f);
  scores[7] = 0.9f;
  scores[50] = 0.8f;
  scores[3] = 0.5f;
  scores[20] = 0.5f;  // tie with 3: 3 wins (lower position) ...
  scores[21] = 0.5f;  // ... and 20 beats 21
  const auto a = select_anchors(p, scores, 99);
  ASSERT_EQ(a.size(), 10u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()).size(), 10u);
  for (int32_t t : {96, 97, 98, 99, 7, 50, 3, 20}) EXPECT_TRUE(std::count(a.begin(), a.end(), t)) << t;
  EXPECT_EQ(std::count(a.begin(), a.end(), 21), 0);  // unless drawn uniformly
  // Same seed, same picks; another seed, (almost surely) other uniform picks.
  EXPECT_EQ(a, select_anchors(p, scores, 99));
  bool differs = false;
  for (uint64_t s = 100; s < 105; ++s) differs |= select_anchors(p, scores, s) != a;
  EXPECT_TRUE(differs);
}

TEST(Anchors, AllTokensWhenFracIsOne) {
  AnchorKVConfig c;
  c.anchor_frac = 1.0;
  const auto p = plan_anchors(50, c);
  const auto a = select_anchors(p, std::vector<float>(50, 0.0f), 1);
  ASSERT_EQ(a.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a[i], i);
}

}  // namespace
}  // namespace anchorkv::compress
