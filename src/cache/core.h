// What a KVCache holds behind its public face: the store, the shape
// bookkeeping every cache shares, and the reader/writer lock.
#pragma once

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "anchorkv/cache.h"
#include "cache/store.h"

namespace anchorkv::internal {

struct CacheCore {
  explicit CacheCore(std::unique_ptr<CacheStore> s) : store(std::move(s)) {}
  mutable std::shared_mutex mutex;
  std::unique_ptr<CacheStore> store;
  CacheShape shape;
};

// A store seen under the reader lock: valid while this object lives.
template <class Store>
struct ReadLocked {
  std::shared_lock<std::shared_mutex> lock;
  const Store& store;
  const CacheShape& shape;
};

// A store under the writer lock.
template <class Store>
struct WriteLocked {
  std::unique_lock<std::shared_mutex> lock;
  Store& store;
  CacheShape& shape;
};

struct CacheAccess {
  template <class Store = CacheStore>
  static ReadLocked<Store> read(const KVCache& c) {
    CacheCore& core = *c.core_;
    std::shared_lock lock(core.mutex);
    return {std::move(lock), static_cast<const Store&>(*core.store), core.shape};
  }
  template <class Store = CacheStore>
  static WriteLocked<Store> write(KVCache& c) {
    CacheCore& core = *c.core_;
    std::unique_lock lock(core.mutex);
    return {std::move(lock), static_cast<Store&>(*core.store), core.shape};
  }
};

}  // namespace anchorkv::internal
