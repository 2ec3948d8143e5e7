// Every cache the tools can build, by name: what it is, whether it evicts
// tokens and whether a byte budget (theta) sizes it. The CLI, the comparison
// harness and the evaluation tasks all read this one table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "anchorkv/cache.h"

namespace anchorkv::cache {

struct CacheKind {
  std::string name;
  std::string description;
  bool evicts = false;         // drops tokens: attention positions are lost (needs post-RoPE keys)
  bool byte_budgeted = false;  // sized by theta; otherwise its size is fixed by its format
  std::function<std::unique_ptr<KVCache>(double theta, int threads)> make;
};

// In the order the tools list them.
const std::vector<CacheKind>& cache_kinds();
std::vector<std::string> cache_names();
// Throws Error(kInvalidArgument) naming the unknown cache and listing the known ones.
const CacheKind& find_cache_kind(const std::string& name);
std::unique_ptr<KVCache> make_cache(const std::string& name, double theta, int threads);

// "NAME" or "NAME:pre" (keys stored before RoPE, the paper's setting; refused
// for caches that evict). Throws Error(kInvalidArgument).
struct CacheSpec {
  const CacheKind* kind = nullptr;
  bool pre_rope = false;
  std::string spec;  // as written
};
CacheSpec parse_cache_spec(const std::string& spec);

}  // namespace anchorkv::cache
