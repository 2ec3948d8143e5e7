#include "compress/segment.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"
#include "core/rope.h"

namespace anchorkv::compress {

namespace {
constexpr int kTightSteps = 8;       // magnitude codes per octave
constexpr int kTightTopCode = 0x3F;  // bits 0..5
}  // namespace

int8_t tight_coef_exp(float max_abs) {
  if (!(max_abs > 0.0f) || !std::isfinite(max_abs)) return 0;
  const double e = std::ceil(kTightSteps * std::log2(static_cast<double>(max_abs)) - 0.5) - kTightTopCode;
  return static_cast<int8_t>(std::clamp(e, -128.0, 127.0));
}

uint8_t tight_coef_code(float gamma, int coef_exp) {
  if (!(std::fabs(gamma) > 0.0f)) return 0;  // zero (and NaN, which no assignment produces)
  const double m = std::nearbyint(kTightSteps * std::log2(std::fabs(static_cast<double>(gamma)))) - coef_exp;
  if (m < 0.5) return 0;  // below the smallest magnitude: nearer to 0 than to it
  return static_cast<uint8_t>((gamma < 0.0f ? 0x80 : 0) | static_cast<int>(std::min<double>(m, kTightTopCode)));
}

namespace {
// 2^(j / 8), j < 8: the fraction of a tight coefficient's magnitude.
const std::array<float, kTightSteps>& pow8() {
  static const auto p = [] {
    std::array<float, kTightSteps> t{};
    for (int j = 0; j < kTightSteps; ++j) t[static_cast<size_t>(j)] = static_cast<float>(std::exp2(j / double{kTightSteps}));
    return t;
  }();
  return p;
}
}  // namespace

float tight_coef(uint8_t code, int coef_exp) {
  // 2^((m + exp) / 8) as 2^(j / 8) for the fraction times an exact power of two.
  const int m = code & kTightTopCode;
  if (m == 0) return 0.0f;
  const int x = m + coef_exp;
  const float v = std::ldexp(pow8()[static_cast<size_t>(x & (kTightSteps - 1))], x >> 3);  // x >> 3 floors
  return (code & 0x80) != 0 ? -v : v;
}

void tight_coef_table(int coef_exp, float table[256]) {
  // Built per attention sub-tile: one ldexp per code was ~12% of a decode
  // call at 4096 tokens. Each magnitude is computed once (the sign bit and
  // the residual flag only mirror it) as the fraction times 2^octave built
  // from its bits, which rounds as ldexp does wherever 2^octave is a normal float.
  float mag[kTightTopCode + 1];
  mag[0] = 0.0f;
  for (int m = 1; m <= kTightTopCode; ++m) {
    const int x = m + coef_exp, octave = x >> 3;  // floors
    mag[m] = octave >= -126 && octave <= 127
                 ? pow8()[static_cast<size_t>(x & (kTightSteps - 1))] *
                       core::f32_from_bits(static_cast<uint32_t>(octave + 127) << 23)
                 : tight_coef(static_cast<uint8_t>(m), coef_exp);
  }
  for (int c = 0; c < 256; ++c) {
    const float v = mag[c & kTightTopCode];
    table[c] = (c & 0x80) != 0 && v != 0.0f ? -v : v;
  }
}

int64_t CompressedRow::buffer_bytes() const {
  const int64_t side_bytes = with_layout(layout, [](auto L) { return L.kSideBytes; });
  auto side = [&](const CompressedSide& s) {
    return static_cast<int64_t>(s.coef.size() * sizeof(float) + s.coef16.size() * sizeof(uint16_t) +
                                s.coef8.size() + s.codes.size() + s.scales.size() * sizeof(uint16_t)) +
           side_bytes;
  };
  return static_cast<int64_t>((anchor_k.size() + anchor_v.size()) * sizeof(uint16_t) + meta.size() * sizeof(uint64_t) +
                              meta32.size() * sizeof(uint32_t) + meta16.size() * sizeof(uint16_t) +
                              anchor_pos.size() * sizeof(int32_t)) +
         side(k) + side(v);
}

Meta CompressedRow::meta_at(int64_t e) const {
  if (!lists_positions()) return unpack_meta(meta[e]);
  Meta m = fields_at(e);
  // Anchor j has anchor_pos[j] - j non-anchor tokens before it (non-decreasing in j):
  // the anchors before entry e are those with anchor_pos[j] - j <= e.
  int64_t lo = 0, hi = n_anchor;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (anchor_pos[mid] - mid <= e)
      lo = mid + 1;
    else
      hi = mid;
  }
  m.anchors_before = static_cast<int32_t>(lo);
  return m;
}

float CompressedRow::coef_k(int64_t e) const {
  return with_layout(layout, [&](auto L) { return L.coef(k, e); });
}
float CompressedRow::coef_v(int64_t e) const {
  return with_layout(layout, [&](auto L) { return L.coef(v, e); });
}

std::vector<int64_t> residual_slot_index(const CompressedRow& row) {
  const int64_t n = row.n_other();
  std::vector<int64_t> index;
  index.reserve(static_cast<size_t>(2 * ((n + kSlotIndexBlock - 1) / kSlotIndexBlock + 1)));
  int64_t nk = 0, nv = 0;
  for (int64_t e = 0; e < n; ++e) {
    if (e % kSlotIndexBlock == 0) index.insert(index.end(), {nk, nv});
    nk += row.res_k(e);
    nv += row.res_v(e);
  }
  index.insert(index.end(), {nk, nv});
  return index;
}

std::vector<int32_t> CompressedRow::anchor_positions() const {
  if (lists_positions()) return anchor_pos;
  // anchors_before does not decrease (checked on load): anchor j follows the
  // E_j entries whose anchors_before is at most j, so it sits at E_j + j.
  // E_j is found by galloping on from E_{j-1} (anchors lie ~n / k entries
  // apart), so the search reads the metadata near each anchor, in order;
  // decode calls this per row and step (a scan of every entry was ~5% of a
  // pre-RoPE decode at 131072).
  std::vector<int32_t> pos(static_cast<size_t>(n_anchor));
  const int64_t n = static_cast<int64_t>(meta.size());
  int64_t e = 0;
  for (int64_t j = 0; j < n_anchor; ++j) {
    const auto pred = [j](uint64_t w) { return unpack_meta(w).anchors_before <= j; };
    int64_t step = 1, hi = e;  // hi: the first probe at or past E_j (or n); probes double their distance
    while (hi < n && pred(meta[static_cast<size_t>(hi)])) hi = std::min(n, e + (step *= 2));
    e = std::partition_point(meta.begin() + e, meta.begin() + hi, pred) - meta.begin();
    pos[static_cast<size_t>(j)] = static_cast<int32_t>(e + j);
  }
  return pos;
}

namespace {

// Whether the buffers of every layout hold n entries in the row's own (the
// words of the row, or the coefficients of a side) and none in the others.
template <class Buffers>
bool sized_for_layout(MetadataLayout layout, int64_t n, Buffers&& buffers) {
  bool ok = true;
  const auto size = [&](auto L) {
    ok = ok && static_cast<int64_t>(buffers(L).size()) == (L.kKind == layout ? n : 0);
  };
  size(SeedLayout{});
  size(CompactLayout{});
  size(TightLayout{});
  return ok;
}

std::string check_side(const CompressedSide& s, int64_t n_flagged, int64_t code_bytes, const char* name) {
  if (static_cast<int64_t>(s.scales.size()) != n_flagged)
    return std::string(name) + ": " + std::to_string(s.scales.size()) + " residual scales for " +
           std::to_string(n_flagged) + " flagged tokens";
  if (static_cast<int64_t>(s.codes.size()) != n_flagged * code_bytes) return std::string(name) + " codes: wrong size";
  return "";
}

// Anchors before each entry (seed layout) must not decrease or exceed n_anchor;
// compact anchor positions must ascend inside the row.
std::string check_positions(const CompressedRow& row) {
  if (row.lists_positions()) {
    if (static_cast<int64_t>(row.anchor_pos.size()) != row.n_anchor) return "anchor_pos: wrong count";
    for (int64_t j = 0; j < row.n_anchor; ++j)
      if (row.anchor_pos[j] < 0 || row.anchor_pos[j] >= row.length || (j > 0 && row.anchor_pos[j] <= row.anchor_pos[j - 1]))
        return "anchor_pos: positions must ascend inside the row";
    return "";
  }
  if (!row.anchor_pos.empty() || !row.meta32.empty() || !row.meta16.empty()) return "compact buffers in a seed-layout row";
  int64_t before = 0;
  for (uint64_t w : row.meta) {
    const int64_t b = unpack_meta(w).anchors_before;
    if (b < before || b > row.n_anchor) return "meta: anchors_before must not decrease or exceed n_anchor";
    before = b;
  }
  return "";
}

}  // namespace

std::string check_row(const CompressedRow& row, int64_t D, int64_t code_bytes) {
  if (row.length < 1 || row.n_anchor < 1 || row.n_anchor > row.length) return "n_anchor must be in [1, length]";
  const int64_t n_other = row.length - row.n_anchor;
  if (static_cast<int64_t>(row.anchor_k.size()) != row.n_anchor * D ||
      static_cast<int64_t>(row.anchor_v.size()) != row.n_anchor * D)
    return "anchors: wrong size";
  const MetadataLayout layout = row.layout;
  if (layout != MetadataLayout::kSeed && layout != MetadataLayout::kCompact && layout != MetadataLayout::kTight)
    return "unknown metadata layout";
  // (the tight layout's coefficients carry the residual flags the next loop reads)
  for (const CompressedSide* side : {&row.k, &row.v})
    if (!sized_for_layout(layout, n_other, [&](auto L) -> const auto& { return L.coefs(*side); }))
      return "coefficients: wrong count for the layout";
  if (!sized_for_layout(layout, n_other, [&](auto L) -> const auto& { return L.words(row); }))
    return "metadata: wrong count for the layout";
  if (std::string e = check_positions(row); !e.empty()) return e;
  if (const RopeOptions& r = row.key_rope; r.enabled) {
    if (std::string problem = core::rope_problem(r, D); !problem.empty()) return "key_rope: " + problem;
    if (r.position_offset < 0 || r.position_offset > core::kMaxRopePosition - row.length)
      return "key_rope: positions beyond " + std::to_string(core::kMaxRopePosition);
  }
  int64_t flagged_k = 0, flagged_v = 0;
  for (int64_t e = 0; e < n_other; ++e) {
    const Meta m = row.fields_at(e);
    if (m.anchor_k >= row.n_anchor || m.anchor_v >= row.n_anchor)
      return "metadata: anchor ordinal beyond n_anchor at entry " + std::to_string(e);
    flagged_k += m.res_k;
    flagged_v += m.res_v;
  }
  if (std::string e = check_side(row.k, flagged_k, code_bytes, "keys"); !e.empty()) return e;
  return check_side(row.v, flagged_v, code_bytes, "values");
}

namespace {

// Walks the row in position order, calling emit_anchor(p, j) or emit_token(p, e, meta, slot_k, slot_v).
template <class A, class T>
void walk(const CompressedRow& row, A&& emit_anchor, T&& emit_token) {
  int64_t p = 0, j = 0, slot_k = 0, slot_v = 0;
  for (int64_t e = 0; e < row.n_other(); ++e) {
    const Meta m = row.meta_at(e);
    while (j < m.anchors_before) emit_anchor(p++, j++);
    emit_token(p++, e, m, m.res_k ? slot_k++ : -1, m.res_v ? slot_v++ : -1);
  }
  while (j < row.n_anchor) emit_anchor(p++, j++);
}

// Rotates a key_rope row's key residual at token t back from its position.
struct KeyAngles {
  int64_t offset;
  core::PositionRotator rotator;
  static std::optional<KeyAngles> of(const CompressedRow& row, int64_t D) {
    const RopeOptions& r = row.key_rope;
    if (!r.enabled) return std::nullopt;
    return KeyAngles{r.position_offset, core::PositionRotator(r, D, r.position_offset, row.length)};
  }
  void unrotate(float* x, int64_t t) const { rotator.rotate(x, offset + t, /*inverse=*/true); }
};

// out = gamma * anchor (+ decoded residual). anchors: [n_anchor, D] f32.
// angles (key side of a key_rope row): the residual is rotated back from its
// position `pos` first.
void decode_side(const CompressedSide& side, float g, const float* anchors, int64_t D, const ResidualCodec& codec,
                 int32_t anchor, int64_t slot, float* out, float* tmp, uint8_t* scratch,
                 const KeyAngles* angles = nullptr, int64_t pos = 0) {
  const float* a = anchors + anchor * D;
  for (int64_t d = 0; d < D; ++d) out[d] = g * a[d];
  if (slot >= 0) {
    codec.decode(&side.codes[static_cast<size_t>(slot * codec.code_bytes())], side.scales[slot], tmp, scratch);
    if (angles) angles->unrotate(tmp, pos);
    for (int64_t d = 0; d < D; ++d) out[d] += tmp[d];
  }
}

}  // namespace

namespace {
template <class T>
void append_to(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}
void append_side(CompressedSide& to, const CompressedSide& from) {
  append_to(to.coef, from.coef);
  append_to(to.coef16, from.coef16);
  append_to(to.coef8, from.coef8);
  append_to(to.codes, from.codes);
  append_to(to.scales, from.scales);
}
}  // namespace

CompressedRow extend_row(const CompressedRow& prior, const CompressedRow& part) {
  const char* op = "anchorkv::compress::extend_row";
  if (prior.layout != part.layout) core::fail(ErrorCode::kInvalidArgument, op, "the rows have different layouts");
  if (prior.k.coef_exp != part.k.coef_exp || prior.v.coef_exp != part.v.coef_exp)
    core::fail(ErrorCode::kInvalidArgument, op, "the rows have different coefficient exponents");
  if (prior.key_rope.enabled != part.key_rope.enabled ||
      (part.key_rope.enabled && part.key_rope.position_offset != prior.key_rope.position_offset + prior.length))
    core::fail(ErrorCode::kInvalidArgument, op, "the part's key residuals are not coded at the positions that follow");
  CompressedRow out = prior;
  out.length += part.length;
  out.n_anchor += part.n_anchor;
  append_to(out.anchor_k, part.anchor_k);
  append_to(out.anchor_v, part.anchor_v);
  for (uint64_t w : part.meta) {  // seed words count the anchors before them
    Meta m = unpack_meta(w);
    m.anchors_before += static_cast<int32_t>(prior.n_anchor);
    out.meta.push_back(pack_meta(m));
  }
  append_to(out.meta32, part.meta32);
  append_to(out.meta16, part.meta16);
  for (int32_t p : part.anchor_pos) out.anchor_pos.push_back(p + static_cast<int32_t>(prior.length));
  append_side(out.k, part.k);
  append_side(out.v, part.v);
  return out;
}

void reconstruct_row(const CompressedRow& row, const ResidualCodec& codec, float* out_k, float* out_v) {
  const int64_t D = codec.dim();
  std::vector<float> tmp(static_cast<size_t>(D));
  std::vector<uint8_t> scratch(static_cast<size_t>(D));
  std::vector<float> ak(row.anchor_k.size()), av(row.anchor_v.size());
  core::f16_to_f32_n(row.anchor_k.data(), ak.data(), static_cast<int64_t>(ak.size()));
  core::f16_to_f32_n(row.anchor_v.data(), av.data(), static_cast<int64_t>(av.size()));
  const std::optional<KeyAngles> angles = KeyAngles::of(row, D);
  walk(
      row,
      [&](int64_t p, int64_t j) {
        std::copy_n(&ak[j * D], D, out_k + p * D);
        std::copy_n(&av[j * D], D, out_v + p * D);
      },
      [&](int64_t p, int64_t e, const Meta& m, int64_t sk, int64_t sv) {
        decode_side(row.k, row.coef_k(e), ak.data(), D, codec, m.anchor_k, sk, out_k + p * D, tmp.data(), scratch.data(),
                    angles ? &*angles : nullptr, p);
        decode_side(row.v, row.coef_v(e), av.data(), D, codec, m.anchor_v, sv, out_v + p * D, tmp.data(), scratch.data());
      });
}

void reconstruct_row_fp16(const CompressedRow& row, const ResidualCodec& codec, uint16_t* out_k,
                          uint16_t* out_v) {
  const int64_t D = codec.dim();
  std::vector<float> tmp(static_cast<size_t>(D)), x(static_cast<size_t>(D));
  std::vector<uint8_t> scratch(static_cast<size_t>(D));
  std::vector<float> ak(row.anchor_k.size()), av(row.anchor_v.size());
  core::f16_to_f32_n(row.anchor_k.data(), ak.data(), static_cast<int64_t>(ak.size()));
  core::f16_to_f32_n(row.anchor_v.data(), av.data(), static_cast<int64_t>(av.size()));
  const std::optional<KeyAngles> angles = KeyAngles::of(row, D);
  walk(
      row,
      [&](int64_t p, int64_t j) {
        std::copy_n(&row.anchor_k[j * D], D, out_k + p * D);
        std::copy_n(&row.anchor_v[j * D], D, out_v + p * D);
      },
      [&](int64_t p, int64_t e, const Meta& m, int64_t sk, int64_t sv) {
        decode_side(row.k, row.coef_k(e), ak.data(), D, codec, m.anchor_k, sk, x.data(), tmp.data(), scratch.data(),
                    angles ? &*angles : nullptr, p);
        core::f32_to_f16_n(x.data(), out_k + p * D, D);
        decode_side(row.v, row.coef_v(e), av.data(), D, codec, m.anchor_v, sv, x.data(), tmp.data(), scratch.data());
        core::f32_to_f16_n(x.data(), out_v + p * D, D);
      });
}

}  // namespace anchorkv::compress
