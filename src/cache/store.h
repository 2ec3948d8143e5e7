// The interface each kind of cache implements. KVCache (the public base)
// validates and stages every input, keeps the shape and token counts, and
// holds the lock; a store only keeps tokens and says what it keeps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "anchorkv/cache.h"
#include "cache/attention_source.h"
#include "cache/input.h"
#include "cache/serial.h"
#include "core/error.h"

namespace anchorkv::internal {

// Shape facts shared by every cache; `seen` counts positions per row.
struct CacheShape {
  bool known = false;  // set by the first call (even an empty one)
  int64_t B = 0, H = 0, D = 0;
  int64_t seen = 0;
  int64_t rows() const { return B * H; }
  int64_t full_bytes() const { return seen * rows() * D * 4; }  // fp16 K + V of every position seen
};

class CacheStore {
 public:
  virtual ~CacheStore() = default;
  // The name in results and registries ("anchorkv", "kivi2", ...).
  virtual std::string name() const = 0;
  // The public class, for error messages ("anchorkv::KIVICache").
  virtual const char* api_name() const = 0;
  // Keeps a validated call's tokens. `shape` already holds the call's B, H, D;
  // shape.seen counts the positions before the call. Strong guarantee: on a
  // throw the store is unchanged.
  virtual void store(const cache::StagedInput& in, const CacheShape& shape) = 0;
  // Dense fp16 K/V of what is kept, [B, H, kept, D].
  virtual KVPair fetch(const CacheShape& shape) const = 0;
  // Bytes of the buffers really held.
  virtual int64_t nbytes(const CacheShape& shape) const = 0;
  // Positions per row inside the softmax.
  virtual int64_t kept_per_row(const CacheShape& shape) const { return shape.seen; }
  virtual bool is_trimmable() const { return false; }
  // What a runtime asks of a cache instead of its type (cache/cache_traits.h):
  // whether a prompt given in several calls is held as it is in one call,
  // whether every position is held exactly in one dense run, the positions a
  // sliding window keeps (0: every position), and what the end of a prompt
  // does (a streaming store compresses what it still holds exactly).
  virtual bool takes_prompt_in_calls() const { return false; }
  virtual bool holds_exact_run() const { return false; }
  virtual int64_t sliding_window() const { return 0; }
  virtual void end_prompt(const CacheShape&) {}
  // What attention reads; the default is the dense fetch (no kernel of its own).
  virtual cache::AttentionSource attention_source(const CacheShape& shape) const {
    return cache::dense_source(fetch(shape));
  }

  // Persistence (docs/cachefile.md). save_config writes the parameters the
  // cache is rebuilt from; save_state everything it holds, as stored;
  // load_state fills a freshly built store, every count checked against
  // `shape` before anything is allocated.
  virtual void save_config(cache::ByteWriter&) const { unsupported(); }
  virtual void save_state(cache::ByteWriter&, const CacheShape&) const { unsupported(); }
  virtual void load_state(cache::ByteReader&, const CacheShape&) { unsupported(); }

 private:
  [[noreturn]] void unsupported() const {
    core::fail(ErrorCode::kUnsupported, "anchorkv::save_caches", std::string(api_name()) + " cannot be saved");
  }
};

// Empty caches rebuilt from a saved config, one per family (defined beside
// each family's store). Invalid parameters throw Error(kCorruptFile) through `r`.
std::unique_ptr<KVCache> full_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> anchorkv_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> quantized_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> kivi_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> turboquant_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> streamingllm_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> snapkv_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> h2o_cache_from_config(cache::ByteReader& r);
std::unique_ptr<KVCache> window_cache_from_config(cache::ByteReader& r);

// Runs `make` and turns an invalid-config error into a corrupt-file error on `field`.
template <class F>
auto rebuild(cache::ByteReader& r, const char* field, F&& make) {
  try {
    return make();
  } catch (const Error& e) {
    r.fail(field, e.what());
  }
}

}  // namespace anchorkv::internal
