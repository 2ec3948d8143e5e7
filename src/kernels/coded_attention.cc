#include "kernels/coded_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/convert.h"
#include "core/half.h"
#include "core/linalg.h"

namespace anchorkv::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tokens per block of decoded levels: a block's levels ([32, D] f32, 16 KB at
// D = 128) stay in L1 between their decode and their use.
constexpr int64_t kBlock = 32;

// Levels (unscaled, rotated domain) of group g for tokens a .. a + n - 1: [n, dim(g)].
void decode_group(const compress::CodedSideView& side, int g, int64_t a, int64_t n, CodedScratch& s) {
  const compress::ResidualCodec& codec = side.coder->codec(g);
  const int64_t dg = codec.dim(), cb = codec.code_bytes();
  s.levels.resize(static_cast<size_t>(n * dg));
  s.bytes.resize(static_cast<size_t>(n * dg));
  codec.decode_levels_run(side.codes[g] + a * cb, n, s.levels.data(), s.bytes.data());
}

// Per query: m = max of its row of s [nq, n], s = exp(s - m), l = the sum.
void softmax_rows(float* s, int64_t nq, int64_t n, float* m, float* l) {
  for (int64_t g = 0; g < nq; ++g) {
    float* row = s + g * n;
    const float mx = *std::max_element(row, row + n);
    m[g] = mx;
    l[g] = 0;
    if (mx == kNegInf) {
      std::fill_n(row, n, 0.0f);
      continue;
    }
    for (int64_t i = 0; i < n; ++i) row[i] -= mx;
    core::exp_scores(row, n, row);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += row[i];
    l[g] = sum;
  }
}

void mask_scores(const int64_t* qpos, int64_t nq, int64_t n, int64_t pos_a, float* s) {
  for (int64_t g = 0; g < nq; ++g)
    for (int64_t i = std::max<int64_t>(0, qpos[g] - pos_a + 1); i < n; ++i) s[g * n + i] = kNegInf;
}

}  // namespace

void coded_chunk(const float* q, const int64_t* qpos, int64_t nq, const compress::CodedRowView& row, int64_t a,
                 int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& s) {
  const compress::TokenCoder& kc = *row.k.coder;
  const compress::TokenCoder& vc = *row.v.coder;
  // Queries in the keys' rotated domain, group by group: [nq, D].
  s.rq.resize(static_cast<size_t>(nq * D));
  s.x.resize(static_cast<size_t>(D));
  for (int64_t g = 0; g < nq; ++g)
    for (int grp = 0; grp < kc.groups(); ++grp) {
      const int64_t off = kc.offset(grp), dg = kc.group_dim(grp);
      for (int64_t j = 0; j < dg; ++j) s.x[j] = q[g * D + row.k.channels[off + j]];
      kc.codec(grp).rotation().forward(s.x.data(), &s.rq[g * D + off]);
    }
  // Scores: sum over key groups of scale_t * (R q) . levels_t, by blocks of tokens.
  s.s.assign(static_cast<size_t>(nq * n), 0.0f);
  s.dots.resize(static_cast<size_t>(nq * kBlock));
  s.scale.resize(static_cast<size_t>(n));
  for (int grp = 0; grp < kc.groups(); ++grp) {
    const int64_t off = kc.offset(grp), dg = kc.group_dim(grp);
    core::f16_to_f32_n(row.k.scales[grp] + a, s.scale.data(), n);
    for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
      const int64_t nb = std::min(kBlock, n - b0);
      decode_group(row.k, grp, a + b0, nb, s);
      core::dot_matrix(&s.rq[off], nq, D, s.levels.data(), nb, dg, dg, s.dots.data(), nb);
      for (int64_t g = 0; g < nq; ++g)
        for (int64_t i = 0; i < nb; ++i) s.s[g * n + b0 + i] += s.scale[b0 + i] * s.dots[g * nb + i];
    }
  }
  if (pos_a + n - 1 > *std::min_element(qpos, qpos + nq)) mask_scores(qpos, nq, n, pos_a, s.s.data());
  softmax_rows(s.s.data(), nq, n, out.m, out.l);
  // Values: per value group, sum_t p_t * scale_t * levels_t in its rotated domain.
  s.acc.assign(static_cast<size_t>(nq * D), 0.0f);
  s.w.resize(static_cast<size_t>(nq * n));
  for (int grp = 0; grp < vc.groups(); ++grp) {
    const int64_t off = vc.offset(grp), dg = vc.group_dim(grp);
    core::f16_to_f32_n(row.v.scales[grp] + a, s.scale.data(), n);
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t i = 0; i < n; ++i) s.w[g * n + i] = s.s[g * n + i] * s.scale[i];
    for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
      const int64_t nb = std::min(kBlock, n - b0);
      decode_group(row.v, grp, a + b0, nb, s);
      core::accumulate_rows(&s.w[b0], n, s.levels.data(), nb, nq, dg, &s.acc[off], D);
    }
  }
  // Each group's sum turned back (R^T) onto its channels.
  for (int64_t g = 0; g < nq; ++g)
    for (int grp = 0; grp < vc.groups(); ++grp) {
      const int64_t off = vc.offset(grp), dg = vc.group_dim(grp);
      vc.codec(grp).rotation().inverse(&s.acc[g * D + off], s.x.data());
      for (int64_t j = 0; j < dg; ++j) out.acc[g * D + row.v.channels[off + j]] = s.x[j];
    }
}

void coded_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const compress::CodedRowView& row,
                     int64_t a, int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& s) {
  // Each token decoded back to its channels (TokenCoder::decode), then dense attention.
  auto token = [&](const compress::CodedSideView& side, int64_t t, float* x) {
    const uint8_t* codes[2] = {nullptr, nullptr};
    uint16_t scales[2] = {0, 0};
    for (int g = 0; g < side.coder->groups(); ++g) {
      codes[g] = side.codes[g] + t * side.coder->code_bytes(g);
      scales[g] = side.scales[g][t];
    }
    s.dots.resize(static_cast<size_t>(2 * D));
    side.coder->decode(codes, scales, side.channels, x, s.dots.data());
  };
  s.x.resize(static_cast<size_t>(D));
  s.s.resize(static_cast<size_t>(nq * n));
  for (int64_t i = 0; i < n; ++i) {
    token(row.k, a + i, s.x.data());
    for (int64_t g = 0; g < nq; ++g) {
      float dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[g * D + d] * s.x[d];
      s.s[g * n + i] = pos_a + i <= qpos[g] ? dot : kNegInf;
    }
  }
  for (int64_t g = 0; g < nq; ++g) {
    float* r = &s.s[g * n];
    const float mx = *std::max_element(r, r + n);
    out.m[g] = mx;
    out.l[g] = 0;
    for (int64_t i = 0; i < n; ++i) {
      r[i] = mx == kNegInf ? 0.0f : std::exp(r[i] - mx);
      out.l[g] += r[i];
    }
  }
  std::fill_n(out.acc, nq * D, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    token(row.v, a + i, s.x.data());
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t d = 0; d < D; ++d) out.acc[g * D + d] += s.s[g * n + i] * s.x[d];
  }
}

}  // namespace anchorkv::kernels
