#include "cache/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cctype>
#include <exception>

#include "anchorkv/baselines.h"
#include "core/error.h"

namespace anchorkv::cache {
namespace {

CacheKind anchorkv_kind(std::string name, std::string description, MetadataLayout layout) {
  auto make = [layout](double theta, int threads) -> std::unique_ptr<KVCache> {
    AnchorKVConfig cfg;
    cfg.theta = theta;
    cfg.threads = threads;
    cfg.metadata = layout;
    return std::make_unique<AnchorKVCache>(cfg);
  };
  return {std::move(name), std::move(description), false, true, make, AnchorKVConfig{}.window, layout};
}

template <class Cache, class... Args>
CacheKind fixed_kind(std::string name, std::string description, Args... args) {
  return {std::move(name), std::move(description), false, false,
          [=](double, int) { return std::make_unique<Cache>(args...); }, 0, {}};
}

template <class Cache>
CacheKind eviction_kind(std::string name, std::string description, int64_t observation_window) {
  return {std::move(name), std::move(description), true, true,
          [](double theta, int) { return std::make_unique<Cache>(theta); }, observation_window, {}};
}

// "kXvY": key and value bits (1 to 4 in steps of 0.25), e.g. k4v3, k2.5v2.
std::unique_ptr<KVCache> make_turboquant(const std::string& param) {
  auto bad = [&] {
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::parse_cache_spec",
               "turboquant:" + param + ": expected kXvY, key and value bits 1 to 4 in steps of 0.25 (e.g. k4v3)");
  };
  const size_t v = param.find('v');
  if (param.size() < 4 || param[0] != 'k' || v == std::string::npos) bad();
  auto number = [&](const std::string& text) {
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(text, &used);
    } catch (const std::exception&) {
      bad();
    }
    if (used != text.size() || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) bad();
    return x;
  };
  const double kb = number(param.substr(1, v - 1)), vb = number(param.substr(v + 1));
  try {
    return std::make_unique<TurboQuantCache>(kb, vb);
  } catch (const Error&) {
    bad();
  }
  return nullptr;
}

CacheKind turboquant_kind() {
  CacheKind k{"turboquant",
              "TurboQuant: rotated tokens, Lloyd-Max codes per coordinate, fp16 norm (4-bit keys and values; "
              ":kXvY sets the widths, e.g. turboquant:k2.5v2)",
              false,
              false,
              [](double, int) { return std::make_unique<TurboQuantCache>(4, 4); },
              0,
              {}};
  k.make_param = make_turboquant;
  k.param_help = "turboquant:kXvY key and value bits, 1 to 4 in steps of 0.25 (fractions give the largest "
                 "channels one bit more)";
  k.post_rope_only = true;
  return k;
}

std::vector<CacheKind> build_kinds() {
  std::vector<CacheKind> k;
  k.push_back({"full", "exact fp16 K/V (the reference)", false, false,
               [](double, int) { return std::make_unique<FullKVCache>(); }, 0, {}});
  k.push_back(anchorkv_kind("anchorkv", "AnchorKV, seed metadata layout (16 bytes per token)", MetadataLayout::kSeed));
  k.push_back(anchorkv_kind("anchorkv_compact", "AnchorKV, compact metadata (8 bytes per token + 4 per anchor)",
                            MetadataLayout::kCompact));
  k.push_back(anchorkv_kind("anchorkv_tight",
                            "AnchorKV, tight metadata (4 bytes per token + 4 per anchor; at most 256 anchors per "
                            "segment, 8-bit log-scale coefficients)",
                            MetadataLayout::kTight));
  k.push_back(fixed_kind<QuantizedKVCache>("quantized8", "8-bit group quantization of every token", 8));
  k.push_back(fixed_kind<QuantizedKVCache>("quantized4", "4-bit group quantization of every token", 4));
  k.push_back(fixed_kind<QuantizedKVCache>("quantized2", "2-bit group quantization of every token", 2));
  k.push_back(fixed_kind<KIVICache>("kivi4", "KIVI 4-bit (keys per channel, values per token, fp16 window)", 4));
  k.push_back(fixed_kind<KIVICache>("kivi2", "KIVI 2-bit", 2));
  k.push_back(turboquant_kind());
  k.push_back(eviction_kind<StreamingLLMCache>("streamingllm", "attention sinks + recent window (evicts)", 0));
  k.push_back(eviction_kind<SnapKVCache>("snapkv", "observation-window scoring at prefill (evicts)", 32));
  k.push_back(eviction_kind<H2OCache>("h2o", "heavy hitters + recent window (evicts)", -1));
  return k;
}

}  // namespace

const std::vector<CacheKind>& cache_kinds() {
  static const std::vector<CacheKind> kinds = build_kinds();
  return kinds;
}

std::vector<std::string> cache_names() {
  std::vector<std::string> names;
  for (const auto& k : cache_kinds()) names.push_back(k.name);
  return names;
}

const CacheKind& find_cache_kind(const std::string& name) {
  for (const auto& k : cache_kinds())
    if (k.name == name) return k;
  std::string known;
  for (const auto& n : cache_names()) known += (known.empty() ? "" : ", ") + n;
  core::fail(ErrorCode::kInvalidArgument, "anchorkv::make_cache", "unknown cache '" + name + "' (known: " + known + ")");
}

std::unique_ptr<KVCache> make_cache(const std::string& name, double theta, int threads) {
  return find_cache_kind(name).make(theta, threads);
}

std::unique_ptr<KVCache> CacheSpec::make(double theta, int threads, const RopeOptions& rope) const {
  if (!param.empty()) return kind->make_param(param);
  if (!anchorkv()) return kind->make(theta, threads);
  AnchorKVConfig cfg;
  cfg.theta = theta;
  cfg.threads = threads;
  cfg.metadata = *kind->anchorkv_layout;
  cfg.anchor_count = auto_anchors ? AnchorCount::kAuto : AnchorCount::kFixed;
  if (segment_tokens > 0) {
    cfg.segment_tokens = segment_tokens;
    cfg.recent_tokens = std::max<int64_t>(recent_tokens, 0);
    cfg.extend_tokens = std::max<int64_t>(extend_tokens, 0);
  }
  if (key_rope) cfg.key_rope = rope;  // cache position 0 is token position 0
  return std::make_unique<AnchorKVCache>(cfg);
}

namespace {
// "segN" / "recentN": N into *out; false when `mod` is not `prefix` and digits.
bool count_modifier(const std::string& mod, const std::string& prefix, int64_t* out, const std::string& spec) {
  if (mod.size() <= prefix.size() || mod.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string digits = mod.substr(prefix.size());
  auto digit = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
  if (digits.size() > 8 || !std::all_of(digits.begin(), digits.end(), digit))
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::parse_cache_spec",
               "cache '" + spec + "': ':" + mod + "' needs a token count of at most 8 digits, e.g. :" + prefix +
                   "256");
  *out = std::stoll(digits);
  if (*out == 0 && prefix == "seg")
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::parse_cache_spec",
               "cache '" + spec + "': :seg0 would not stream; the seed's behaviour is written :oneshot");
  return true;
}

// "layersW0/W1/...": the positive weights into *out; false when `mod` is not :layers.
bool layer_weights_modifier(const std::string& mod, std::vector<double>* out, const std::string& spec) {
  constexpr size_t kMaxLayers = 1024;
  if (mod.size() <= 6 || mod.compare(0, 6, "layers") != 0) return false;
  auto bad = [&] {
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::parse_cache_spec",
               "cache '" + spec + "': ':" + mod + "' needs one positive weight per layer, e.g. :layers1.3/0.9/0.9/0.9");
  };
  if (!out->empty()) core::fail(ErrorCode::kInvalidArgument, "anchorkv::parse_cache_spec", "cache '" + spec + "' repeats ':layers'");
  std::vector<double> w;
  for (size_t at = 6; at <= mod.size();) {
    const size_t slash = std::min(mod.find('/', at), mod.size());
    const std::string item = mod.substr(at, slash - at);
    char* end = nullptr;
    const double x = item.empty() || item.size() > 16 ? -1.0 : std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !std::isfinite(x) || x <= 0 || x > 1e6) bad();
    w.push_back(x);
    if (w.size() > kMaxLayers) bad();
    at = slash + 1;
  }
  *out = std::move(w);
  return true;
}

// :oneshot, :segN and :recentN: AnchorKV only, consistent with each other.
void check_streaming_modifiers(const CacheSpec& c, const std::string& spec) {
  constexpr const char* op = "anchorkv::parse_cache_spec";
  const bool any = c.oneshot || c.segment_tokens != 0 || c.recent_tokens >= 0 || c.extend_tokens >= 0;
  if (any && !c.anchorkv())
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': :oneshot, :segN, :recentN and :extN choose how AnchorKV compresses a session");
  if (c.oneshot && (c.segment_tokens != 0 || c.recent_tokens >= 0 || c.extend_tokens >= 0))
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': :oneshot does not stream, so it takes no :seg, :recent or :ext");
  if (c.recent_tokens >= 0 && c.segment_tokens == 0)
    core::fail(ErrorCode::kInvalidArgument, op, "cache '" + spec + "': :recentN needs :segN");
  if (c.extend_tokens >= 0 && c.segment_tokens == 0)
    core::fail(ErrorCode::kInvalidArgument, op, "cache '" + spec + "': :extN needs :segN");
}
}  // namespace

CacheSpec parse_cache_spec(const std::string& spec) {
  constexpr const char* op = "anchorkv::parse_cache_spec";
  CacheSpec c;
  c.spec = spec;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  c.kind = &find_cache_kind(name);
  for (size_t at = colon; at != std::string::npos;) {
    const size_t next = spec.find(':', at + 1);
    const std::string mod = spec.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    bool* flag = mod == "pre"       ? &c.pre_rope
                 : mod == "obs"     ? &c.observe
                 : mod == "auto"    ? &c.auto_anchors
                 : mod == "keyrope" ? &c.key_rope
                 : mod == "oneshot" ? &c.oneshot
                 : mod == "fp32"    ? &c.fp32_arithmetic
                                    : nullptr;
    int64_t count = 0;
    if (!flag && (count_modifier(mod, "seg", &count, spec) || count_modifier(mod, "recent", &count, spec) ||
                  count_modifier(mod, "ext", &count, spec))) {
      const bool seg = mod[0] == 's';
      const char* name = seg ? "seg" : mod[0] == 'r' ? "recent" : "ext";
      int64_t& field = seg ? c.segment_tokens : mod[0] == 'r' ? c.recent_tokens : c.extend_tokens;
      if (field != (seg ? 0 : -1))
        core::fail(ErrorCode::kInvalidArgument, op, "cache '" + spec + "' repeats ':" + name + "'");
      field = count;
      at = next;
      continue;
    }
    if (!flag && layer_weights_modifier(mod, &c.layer_weights, spec)) {
      at = next;
      continue;
    }
    if (!flag && c.kind->make_param) {  // the kind's own parameter, checked by building the cache once
      if (!c.param.empty()) core::fail(ErrorCode::kInvalidArgument, op, "cache '" + spec + "' has two parameters");
      c.kind->make_param(mod);
      c.param = mod;
      at = next;
      continue;
    }
    if (!flag)
      core::fail(ErrorCode::kInvalidArgument, op,
                 "cache '" + spec + "': unknown modifier ':" + mod +
                     "' (known: :pre, :obs, :auto, :keyrope, :fp32, :segN, :recentN, :oneshot, :layersW0/W1/...)");
    if (*flag) core::fail(ErrorCode::kInvalidArgument, op, "cache '" + spec + "' repeats ':" + mod + "'");
    *flag = true;
    at = next;
  }
  if (c.pre_rope && c.kind->evicts)
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': " + name + " evicts tokens and loses their positions, so it needs post-RoPE keys");
  if (c.pre_rope && c.kind->post_rope_only)
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': " + name + " scores keys in a rotated domain RoPE would leave, so it needs "
               "post-RoPE keys");
  if (c.observe && c.kind->observation_window == 0)
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': " + name + " ranks no token by attention, so it takes no observation queries");
  if (c.auto_anchors && !c.anchorkv())
    core::fail(ErrorCode::kInvalidArgument, op, "cache '" + spec + "': " + name + " has no anchor count to tune");
  if (c.key_rope && (!c.pre_rope || !c.anchorkv()))
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': :keyrope codes AnchorKV key residuals at their positions, so it needs an "
               "AnchorKV cache with :pre");
  if (c.fp32_arithmetic && !c.anchorkv())
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': :fp32 chooses how attention computes AnchorKV residuals, and " + name +
                   " has none");
  if (!c.layer_weights.empty() && !c.kind->byte_budgeted)
    core::fail(ErrorCode::kInvalidArgument, op,
               "cache '" + spec + "': " + name + " has no byte budget to share out with :layers");
  check_streaming_modifiers(c, spec);
  return c;
}

double CacheSpec::layer_theta(double theta, int64_t layer, int64_t layers) const {
  if (layer_weights.empty()) return theta;
  if (static_cast<int64_t>(layer_weights.size()) != layers)
    core::fail(ErrorCode::kInvalidArgument, "anchorkv::parse_cache_spec",
               "cache '" + spec + "': :layers gives " + std::to_string(layer_weights.size()) +
                   " weights for a model of " + std::to_string(layers) + " layers");
  double sum = 0;
  for (double w : layer_weights) sum += w;
  return theta * layer_weights[static_cast<size_t>(layer)] * static_cast<double>(layers) / sum;
}

std::string cache_modifier_help() {
  std::string obs;
  for (const auto& k : cache_kinds())
    if (k.observation_window != 0) obs += (obs.empty() ? "" : ", ") + k.name;
  std::string tuned;
  for (const auto& k : cache_kinds())
    if (k.anchorkv_layout) tuned += (tuned.empty() ? "" : ", ") + k.name;
  std::string params;
  for (const auto& k : cache_kinds())
    if (k.make_param) {
      params += "; ";
      params += k.param_help;
    }
  return "NAME:pre stores keys before RoPE (not for caches that evict); NAME:obs hands the cache the real "
         "queries of the prompt's last positions for scoring (" +
         obs + "); NAME:auto chooses the anchor count per layer within the byte budget (" + tuned +
         "); NAME:pre:keyrope (AnchorKV) codes key residuals after RoPE at their positions, so decode "
         "need not rotate them (faster; on the d128 model up to 3x the KL of :pre); AnchorKV:fp32 scores and sums "
         "residuals, and scores pre-RoPE anchors, in fp32 in attention instead of bf16 products (the default where "
         "the CPU has AVX-512 BF16; slower, docs/benchmarks.md); AnchorKV:segN:recentM "
         "streams, closing the exact tail's oldest N tokens into a compressed segment whenever it holds M + N "
         "and :extE lets each segment extend the one before it up to E tokens, its tokens taking that one's anchors too "
         "(the runtime streams by default: :seg128:recent32:ext1024, docs/spec.md 4.8; :ext0 keeps segments apart) "
         "and AnchorKV:oneshot compresses the first prefill "
         "only, keeping later tokens exact (the seed); NAME:layersW0/W1/... shares a byte-budgeted cache's theta "
         "out by layer (layer l takes theta * W_l / mean W; one weight per layer); modifiers combine, e.g. "
         "anchorkv_compact:pre:obs:auto" +
         params;
}

}  // namespace anchorkv::cache
