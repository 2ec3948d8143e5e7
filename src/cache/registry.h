// Every cache the tools can build, by name: what it is, whether it evicts
// tokens and whether a byte budget (theta) sizes it. The CLI, the comparison
// harness and the evaluation tasks all read this one table.
#pragma once

#include <functional>
#include <memory>
#include <optional>
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
  // Observation queries a runtime hands it under ":obs" (KVCache::update with
  // queries): 0 it uses none, n the last n positions of each call, -1 every position.
  int64_t observation_window = 0;
  // An AnchorKV kind's metadata layout: CacheSpec::make builds its config
  // whole (anchor count, segments, key RoPE) and constructs the cache once.
  // Empty for every other kind.
  std::optional<MetadataLayout> anchorkv_layout;
  // The cache under a parameter modifier (turboquant:k4v3), which it parses,
  // throwing Error(kInvalidArgument) for a bad one; empty where it takes none.
  std::function<std::unique_ptr<KVCache>(const std::string& param)> make_param = {};
  std::string param_help = {};  // e.g. ":kXvY key and value bits, 1 to 4 in steps of 0.25"
  // Scores keys in a domain RoPE at each position would leave (TurboQuant's
  // rotation): its keys must be stored after RoPE.
  bool post_rope_only = false;
};

// In the order the tools list them.
const std::vector<CacheKind>& cache_kinds();
std::vector<std::string> cache_names();
// Throws Error(kInvalidArgument) naming the unknown cache and listing the known ones.
const CacheKind& find_cache_kind(const std::string& name);
std::unique_ptr<KVCache> make_cache(const std::string& name, double theta, int threads);

// "NAME" followed by modifiers, in any order:
//   :pre  keys stored before RoPE (the paper's setting; refused for caches that evict)
//   :obs  the runtime hands the cache the real queries of its observation
//         window (refused for caches that rank no token by attention)
//   :auto AnchorKV chooses its anchor count per layer (AnchorCount::kAuto)
//   :keyrope with :pre, AnchorKV codes key residuals after RoPE at their
//         positions (AnchorKVConfig::key_rope, set by the runtime, which knows the RoPE)
//   :segN AnchorKV streams: segments of N tokens (AnchorKVConfig::segment_tokens)
//   :recentN with :segN, N exact tokens behind the newest segment (recent_tokens)
//   :extN   with :segN, segments extend the one before up to N tokens (extend_tokens; 0: never)
//   :oneshot AnchorKV compresses the first prefill once and keeps later tokens
//         exact (the seed), where the runtime would stream (runtime/session.h)
//   :layersW0/W1/... a byte-budgeted cache's theta per layer: layer l takes
//         theta * W_l / mean(W), so the model's bytes stay theta's (one weight per layer)
//   :PARAM a kind's own parameter (CacheKind::make_param), e.g. turboquant:k2.5v2
// Throws Error(kInvalidArgument).
struct CacheSpec {
  const CacheKind* kind = nullptr;
  bool pre_rope = false;
  bool observe = false;
  bool auto_anchors = false;
  bool key_rope = false;
  bool oneshot = false;
  bool fp32_arithmetic = false;  // :fp32: AnchorKV attention in fp32 (residuals, pre-RoPE anchor scores), not bf16
  int64_t segment_tokens = 0;  // :segN, or 0
  int64_t recent_tokens = -1;  // :recentN, or -1 (unset)
  int64_t extend_tokens = -1;  // :extN, or -1 (unset)
  std::vector<double> layer_weights;  // :layersW0/W1/..., or empty (theta in every layer)
  std::string param;  // the kind's parameter modifier, or empty
  std::string spec;   // as written
  // The cache, built once from the whole spec: streaming when
  // segment_tokens > 0 and with key residuals coded after `key_rope` under
  // :keyrope (AnchorKV kinds only; a runtime passes its model's RoPE).
  std::unique_ptr<KVCache> make(double theta, int threads, const RopeOptions& key_rope = {}) const;
  bool anchorkv() const { return kind->anchorkv_layout.has_value(); }
  // Layer `layer`'s theta in a model of `layers` layers; throws
  // Error(kInvalidArgument) when :layers names another count.
  double layer_theta(double theta, int64_t layer, int64_t layers) const;
  // The queries a runtime passes with each update (CacheKind::observation_window, or 0).
  int64_t observation_window() const { return observe ? kind->observation_window : 0; }
};
// Every modifier with a line of help, for --help texts.
std::string cache_modifier_help();
CacheSpec parse_cache_spec(const std::string& spec);

}  // namespace anchorkv::cache
