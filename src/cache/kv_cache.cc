// KVCache: the bookkeeping and locking every cache shares. Stores only keep
// tokens (cache/store.h).
#include <string>
#include <utility>

#include "anchorkv/cache.h"
#include "cache/cache_traits.h"
#include "cache/core.h"
#include "cache/input.h"

namespace anchorkv {

using internal::CacheAccess;

KVCache::KVCache(std::unique_ptr<internal::CacheStore> store)
    : core_(std::make_unique<internal::CacheCore>(std::move(store))) {}
KVCache::~KVCache() = default;
KVCache::KVCache(KVCache&&) noexcept = default;
KVCache& KVCache::operator=(KVCache&&) noexcept = default;

namespace {
// Validates, stages and stores one call under the caller's writer lock.
void store_call(internal::WriteLocked<internal::CacheStore>& w, const TensorView& keys,
                const TensorView& values, const TensorView* queries, const char* method) {
  internal::CacheShape& shape = w.shape;
  const std::string op = std::string(w.store.api_name()) + "::" + method;
  cache::StagedInput in = cache::stage_input(op, keys, values, shape.known, shape.B, shape.H, shape.D);
  if (queries) cache::stage_queries(op, *queries, in);
  internal::CacheShape next = shape;
  if (!next.known) next = {true, in.B(), in.H(), in.D(), 0};
  w.store.store(in, next);  // strong guarantee: nothing below runs on a throw
  next.seen += in.S();
  shape = next;
}
}  // namespace

KVPair KVCache::update_and_fetch(const TensorView& keys, const TensorView& values) {
  // One writer lock for both halves: the result is the state right after this call.
  auto w = CacheAccess::write(*this);
  store_call(w, keys, values, nullptr, "update_and_fetch");
  return w.store.fetch(w.shape);
}

KVPair KVCache::update_and_fetch(const TensorView& keys, const TensorView& values, const TensorView& queries) {
  auto w = CacheAccess::write(*this);
  store_call(w, keys, values, &queries, "update_and_fetch");
  return w.store.fetch(w.shape);
}

void KVCache::update(const TensorView& keys, const TensorView& values) {
  auto w = CacheAccess::write(*this);
  store_call(w, keys, values, nullptr, "update");
}

void KVCache::update(const TensorView& keys, const TensorView& values, const TensorView& queries) {
  auto w = CacheAccess::write(*this);
  store_call(w, keys, values, &queries, "update");
}

KVPair KVCache::fetch() const {
  auto r = CacheAccess::read(*this);
  return r.store.fetch(r.shape);
}

std::string KVCache::name() const { return CacheAccess::read(*this).store.name(); }
int64_t KVCache::offset() const { return CacheAccess::read(*this).shape.seen; }
KVCache::Shape KVCache::shape() const {
  const auto r = CacheAccess::read(*this);
  return r.shape.known ? Shape{r.shape.B, r.shape.H, r.shape.D} : Shape{};
}
bool KVCache::is_trimmable() const { return CacheAccess::read(*this).store.is_trimmable(); }

int64_t KVCache::nbytes() const {
  auto r = CacheAccess::read(*this);
  return r.store.nbytes(r.shape);
}

int64_t KVCache::full_seq_bytes() const {
  return CacheAccess::read(*this).shape.full_bytes();
}

int64_t KVCache::tokens_total() const {
  auto r = CacheAccess::read(*this);
  return r.shape.seen * r.shape.rows();
}

int64_t KVCache::tokens_kept() const {
  auto r = CacheAccess::read(*this);
  return r.store.kept_per_row(r.shape) * r.shape.rows();
}

double KVCache::compression_ratio() const {
  auto r = CacheAccess::read(*this);
  const int64_t stored = r.store.nbytes(r.shape);
  if (stored <= 0) return 1.0;
  return static_cast<double>(r.shape.full_bytes()) / static_cast<double>(stored);
}

}  // namespace anchorkv

namespace anchorkv::internal {

bool takes_prompt_in_calls(const KVCache& cache) {
  return CacheAccess::read(cache).store.takes_prompt_in_calls();
}

bool holds_exact_run(const KVCache& cache) { return CacheAccess::read(cache).store.holds_exact_run(); }

int64_t sliding_window(const KVCache& cache) { return CacheAccess::read(cache).store.sliding_window(); }

void end_prompt(KVCache& cache) {
  auto w = CacheAccess::write(cache);
  w.store.end_prompt(w.shape);
}

}  // namespace anchorkv::internal
