#include "cache/attention_source.h"

#include <utility>

#include "core/error.h"

namespace anchorkv::cache {

DenseRegion dense_region(const ExactRows& rows, int64_t pos0) {
  DenseRegion r;
  r.n = rows.tokens;
  r.pos0 = pos0;
  for (size_t i = 0; i < rows.k.size(); ++i) {
    r.k.push_back(rows.k[i].data());
    r.v.push_back(rows.v[i].data());
  }
  return r;
}

namespace {
template <class Pred>
bool any_region(const AttentionSource& src, Pred pred) {
  for (const auto* regions : {&src.dense_before, &src.dense_after})
    for (const DenseRegion& r : *regions)
      if (pred(r)) return true;
  return false;
}
}  // namespace

bool AttentionSource::holds_coded() const {
  return any_region(*this, [](const DenseRegion& r) { return r.is_coded(); });
}
bool AttentionSource::holds_affine() const {
  return any_region(*this, [](const DenseRegion& r) { return r.is_affine(); });
}

AttentionSource dense_source(KVPair fetched) {
  auto owned = std::make_shared<const KVPair>(std::move(fetched));
  const Shape4& s = owned->keys.shape();
  AttentionSource src;
  src.B = s[0];
  src.H = s[1];
  src.D = s[3];
  src.n_total = s[2];
  DenseRegion r;
  r.n = s[2];
  for (int64_t i = 0; i < s[0] * s[1]; ++i) {
    r.k.push_back(owned->keys.data_as<uint16_t>() + i * s[2] * s[3]);
    r.v.push_back(owned->values.data_as<uint16_t>() + i * s[2] * s[3]);
  }
  src.dense_after.push_back(std::move(r));
  src.owned.push_back(std::move(owned));
  return src;
}

void append_source(AttentionSource& into, AttentionSource&& next, const char* op) {
  if (next.n_total == 0) return;
  if (into.n_total == 0) {
    into = std::move(next);
    return;
  }
  if (into.B != next.B || into.H != next.H || into.D != next.D)
    core::fail(ErrorCode::kShapeMismatch, op, "the caches differ in B, H or D");
  if (!next.segments.empty())
    core::fail(ErrorCode::kUnsupported, op, "only the first cache may hold compressed segments");
  for (auto* regions : {&next.dense_before, &next.dense_after})
    for (DenseRegion& r : *regions) {
      r.pos0 += into.n_total;
      into.dense_after.push_back(std::move(r));
    }
  into.n_total += next.n_total;
  for (auto& o : next.owned) into.owned.push_back(std::move(o));
}

}  // namespace anchorkv::cache
