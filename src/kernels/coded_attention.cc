#include "kernels/coded_attention.h"

#include <algorithm>
#include <array>
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

// Plain attention over tokens a .. a + n - 1 rebuilt one at a time by
// key(t, x) and value(t, x) into x [D]: the scalar twins' common body.
template <class Key, class Value>
void dense_ref(const float* q, const int64_t* qpos, int64_t nq, int64_t a, int64_t n, int64_t pos_a, int64_t D,
               PartialView out, CodedScratch& s, Key key, Value value) {
  s.x.resize(static_cast<size_t>(D));
  s.s.resize(static_cast<size_t>(nq * n));
  for (int64_t i = 0; i < n; ++i) {
    key(a + i, s.x.data());
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
    value(a + i, s.x.data());
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t d = 0; d < D; ++d) out.acc[g * D + d] += s.s[g * n + i] * s.x[d];
  }
}

// ---------------------------------------------------------------- affine codes

// The integers 0 .. 255 as floats: decode_codes' levels for affine codes.
const float* code_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i);
    return t;
  }();
  return table.data();
}

// The integer codes of tokens t0 .. t0 + nb - 1 as floats: [nb, D] (one stream: affine_attention_supported).
void decode_ints(const cache::AffineSideView& side, int64_t t0, int64_t nb, int64_t D, std::vector<float>& out) {
  out.resize(static_cast<size_t>(nb * D));
  core::decode_codes(side.codes + t0 * side.token_bytes, side.bits, code_values(), nb * D, out.data());
}

// Tokens t0 .. t0 + nb - 1 rebuilt from codes with a (scale, zero) per token
// and channel group: s.levels [nb, D].
void decode_token_scaled(const cache::AffineSideView& side, int64_t t0, int64_t nb, int64_t D, CodedScratch& s) {
  const int64_t cg = std::min(side.channel_group, D), groups = (D + cg - 1) / cg;
  s.scale.resize(static_cast<size_t>(nb * groups * 2));
  core::f16_to_f32_n(side.params + t0 * groups * 2, s.scale.data(), nb * groups * 2);
  s.levels.resize(static_cast<size_t>(nb * D));
  core::decode_affine(side.codes + t0 * side.token_bytes, side.bits, s.scale.data(), nb, D, cg, s.levels.data());
}

// Keys with a (scale, zero) per token and channel group, into s.s [nq, n]:
// rebuilt a block at a time in L1 (as cheap as decoding the bare codes).
void score_token_scaled(const float* q, int64_t nq, const cache::AffineSideView& k, int64_t a, int64_t n, int64_t D,
                        CodedScratch& s) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, n - b0);
    decode_token_scaled(k, a + b0, nb, D, s);
    core::dot_matrix(q, nq, D, s.levels.data(), nb, D, D, &s.s[b0], n);
  }
}

// The queries scaled by token t's group's per-channel scales (s.rq [nq, D])
// and their dots with its zeros (s.bias [nq]).
void fold_channel_scales(const float* q, int64_t nq, const cache::AffineSideView& k, int64_t t, int64_t D,
                         CodedScratch& s) {
  const uint16_t* p = k.params_of(t, 0, D);
  s.scale.resize(static_cast<size_t>(2 * D));
  core::f16_to_f32_n(p, s.scale.data(), 2 * D);  // (scale, zero) per channel
  s.rq.resize(static_cast<size_t>(nq * D));
  s.bias.resize(static_cast<size_t>(nq));
  const float* pair = s.scale.data();
  for (int64_t g = 0; g < nq; ++g) {
    float* rq = &s.rq[g * D];
    float bias = 0;
    for (int64_t d = 0; d < D; ++d) {
      rq[d] = q[g * D + d] * pair[2 * d];
      bias += q[g * D + d] * pair[2 * d + 1];
    }
    s.bias[g] = bias;
  }
}

// Keys with a (scale, zero) per channel and group of tokens (KIVI), into s.s:
//   q . k_t = (q * scale) . c_t + q . zero, the query scaled once per group.
void score_channel_scaled(const float* q, int64_t nq, const cache::AffineSideView& k, int64_t a, int64_t n,
                          int64_t D, CodedScratch& s) {
  const int64_t tg = k.token_group;
  for (int64_t b0 = 0; b0 < n;) {
    const int64_t t = a + b0, nb = std::min({kBlock, n - b0, (t / tg + 1) * tg - t});
    if (b0 == 0 || t % tg == 0) fold_channel_scales(q, nq, k, t, D, s);
    decode_ints(k, t, nb, D, s.levels);
    core::dot_matrix(s.rq.data(), nq, D, s.levels.data(), nb, D, D, s.dots.data(), nb);
    for (int64_t g = 0; g < nq; ++g)
      for (int64_t i = 0; i < nb; ++i) s.s[g * n + b0 + i] = s.dots[g * nb + i] + s.bias[g];
    b0 += nb;
  }
}

// Values, probabilities s.s [nq, n] -> acc [nq, D]: a block of tokens rebuilt,
// then summed with the probabilities.
void accumulate_values(int64_t nq, const cache::AffineSideView& v, int64_t a, int64_t n, int64_t D,
                       CodedScratch& s, float* acc) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, n - b0);
    if (v.token_group == 0) {
      decode_token_scaled(v, a + b0, nb, D, s);
    } else {  // a pair per channel and group of tokens (no cache stores values so)
      s.levels.resize(static_cast<size_t>(nb * D));
      for (int64_t i = 0; i < nb; ++i)
        for (int64_t d = 0; d < D; ++d) s.levels[i * D + d] = v.value(a + b0 + i, d, D);
    }
    core::accumulate_rows(&s.s[b0], n, s.levels.data(), nb, nq, D, acc, D);
  }
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
  dense_ref(
      q, qpos, nq, a, n, pos_a, D, out, s, [&](int64_t t, float* x) { token(row.k, t, x); },
      [&](int64_t t, float* x) { token(row.v, t, x); });
}

void affine_chunk(const float* q, const int64_t* qpos, int64_t nq, const cache::AffineRowView& row, int64_t a,
                  int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& s) {
  s.s.assign(static_cast<size_t>(nq * n), 0.0f);
  s.dots.resize(static_cast<size_t>(nq * kBlock));
  if (row.k.token_group > 0)
    score_channel_scaled(q, nq, row.k, a, n, D, s);
  else
    score_token_scaled(q, nq, row.k, a, n, D, s);
  if (pos_a + n - 1 > *std::min_element(qpos, qpos + nq)) mask_scores(qpos, nq, n, pos_a, s.s.data());
  softmax_rows(s.s.data(), nq, n, out.m, out.l);
  std::fill_n(out.acc, nq * D, 0.0f);
  accumulate_values(nq, row.v, a, n, D, s, out.acc);
}

void affine_chunk_ref(const float* q, const int64_t* qpos, int64_t nq, const cache::AffineRowView& row,
                      int64_t a, int64_t n, int64_t pos_a, int64_t D, PartialView out, CodedScratch& s) {
  auto token = [D](const cache::AffineSideView& side, int64_t t, float* x) {
    for (int64_t d = 0; d < D; ++d) x[d] = side.value(t, d, D);
  };
  dense_ref(
      q, qpos, nq, a, n, pos_a, D, out, s, [&](int64_t t, float* x) { token(row.k, t, x); },
      [&](int64_t t, float* x) { token(row.v, t, x); });
}

}  // namespace anchorkv::kernels
