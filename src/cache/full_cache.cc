#include <algorithm>
#include <string>

#include "anchorkv/cache.h"
#include "cache/full_state.h"
#include "cache/input.h"
#include "core/error.h"

namespace anchorkv {

double KVCache::compression_ratio() const {
  const int64_t stored = nbytes();
  if (stored <= 0) return 1.0;
  return static_cast<double>(full_seq_bytes()) / static_cast<double>(stored);
}

FullKVCache::FullKVCache() : impl_(std::make_unique<internal::FullState>()) {}
FullKVCache::~FullKVCache() = default;
FullKVCache::FullKVCache(FullKVCache&&) noexcept = default;
FullKVCache& FullKVCache::operator=(FullKVCache&&) noexcept = default;

void FullKVCache::append(const TensorView& keys, const TensorView& values, const char* method) {
  internal::FullState& s = *impl_;
  const cache::StagedInput in = cache::stage_input(std::string("anchorkv::FullKVCache::") + method, keys,
                                                   values, s.has_shape, s.B, s.H, s.D);
  s.rows.append(in);
  if (!s.has_shape) {
    s.has_shape = true;
    s.B = in.B();
    s.H = in.H();
    s.D = in.D();
  }
}

KVPair FullKVCache::fetch() const { return impl_->rows.to_pair(impl_->B, impl_->H, impl_->D); }

int64_t FullKVCache::offset() const { return impl_->rows.tokens; }

void FullKVCache::trim(int64_t n) {
  internal::FullState& s = *impl_;
  if (n < 0 || n > s.rows.tokens)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::FullKVCache::trim",
               "cannot trim " + std::to_string(n) + " of " + std::to_string(s.rows.tokens) + " tokens");
  for (auto* side : {&s.rows.k, &s.rows.v})
    for (auto& row : *side) row.resize(row.size() - static_cast<size_t>(n * s.D));
  s.rows.tokens -= n;
}

int64_t FullKVCache::nbytes() const { return impl_->rows.tokens * impl_->B * impl_->H * impl_->D * 4; }

const internal::FullState& FullKVCache::state() const { return *impl_; }

int64_t FullKVCache::tokens_total() const { return impl_->rows.tokens * impl_->B * impl_->H; }

}  // namespace anchorkv
