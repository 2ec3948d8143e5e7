// FullKVCache: exact fp16 rows, the reference every comparison uses.
#include <string>

#include "anchorkv/cache.h"
#include "cache/core.h"
#include "core/error.h"

namespace anchorkv {
namespace {

class FullStore final : public internal::CacheStore {
 public:
  std::string name() const override { return "full"; }
  const char* api_name() const override { return "anchorkv::FullKVCache"; }
  void store(const cache::StagedInput& in, const internal::CacheShape&) override { rows_.append(in); }
  KVPair fetch(const internal::CacheShape& s) const override { return rows_.to_pair(s.B, s.H, s.D); }
  int64_t nbytes(const internal::CacheShape& s) const override { return s.full_bytes(); }
  bool is_trimmable() const override { return true; }
  bool takes_prompt_in_calls() const override { return true; }
  bool holds_exact_run() const override { return true; }
  cache::AttentionSource attention_source(const internal::CacheShape& s) const override {
    cache::AttentionSource src{s.B, s.H, s.D, rows_.tokens};
    if (rows_.tokens > 0) src.dense_after.push_back(cache::dense_region(rows_, 0));
    return src;
  }

  void save_config(cache::ByteWriter&) const override {}
  void save_state(cache::ByteWriter& w, const internal::CacheShape&) const override { cache::save_rows(w, rows_); }
  void load_state(cache::ByteReader& r, const internal::CacheShape& s) override {
    rows_ = cache::load_rows(r, s.rows(), s.D, "rows");
    if (rows_.tokens != s.seen) r.fail("rows", "holds " + std::to_string(rows_.tokens) + " tokens, the cache saw " +
                                                   std::to_string(s.seen));
  }

  void trim(int64_t n, int64_t D) {
    for (auto* side : {&rows_.k, &rows_.v})
      for (auto& row : *side) row.resize(row.size() - static_cast<size_t>(n * D));
    rows_.tokens -= n;
  }

 private:
  cache::ExactRows rows_;
};

}  // namespace

FullKVCache::FullKVCache() : KVCache(std::make_unique<FullStore>()) {}

std::unique_ptr<KVCache> internal::full_cache_from_config(cache::ByteReader&) {
  return std::make_unique<FullKVCache>();
}

void FullKVCache::trim(int64_t n) {
  auto w = internal::CacheAccess::write<FullStore>(*this);
  if (n < 0 || n > w.shape.seen)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::FullKVCache::trim",
               "cannot trim " + std::to_string(n) + " of " + std::to_string(w.shape.seen) + " tokens");
  w.store.trim(n, w.shape.D);
  w.shape.seen -= n;
}

}  // namespace anchorkv
