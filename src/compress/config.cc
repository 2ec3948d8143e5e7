#include <cmath>
#include <sstream>

#include "anchorkv/config.h"
#include "core/error.h"
#include "core/rope.h"

namespace anchorkv {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& why) {
  core::fail(ErrorCode::kInvalidConfig, "anchorkv::AnchorKVConfig", "invalid " + field + ": " + why);
}
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

void AnchorKVConfig::validate() const {
  if (!std::isfinite(theta) || theta < 0.0 || theta > 1.0)
    bad("theta (anchorkv_theta)", "must be in [0, 1], got " + num(theta));
  if (window < 0) bad("window (anchorkv_window)", "must be >= 0, got " + std::to_string(window));
  if (!std::isfinite(rho) || rho < 0.0 || rho > 1.0)
    bad("rho (anchorkv_rho)", "must be in [0, 1], got " + num(rho));
  if (!std::isfinite(anchor_frac) || anchor_frac <= 0.0 || anchor_frac > 1.0)
    bad("anchor_frac (anchorkv_anchor_frac)", "must be in (0, 1], got " + num(anchor_frac));
  if (residual_bits < 1 || residual_bits > 4)
    bad("residual_bits (anchorkv_residual_bits)", "must be 1, 2, 3 or 4, got " + std::to_string(residual_bits));
  if (allocation != ResidualAllocation::kPooledAcrossHeads && allocation != ResidualAllocation::kPerHead)
    bad("allocation", "unknown value");
  if (scale != ResidualScale::kAbsMax && scale != ResidualScale::kRms) bad("scale", "unknown value");
  if (trigger != CompressTrigger::kFirstPrefill && trigger != CompressTrigger::kFirstDecode)
    bad("trigger", "unknown value");
  if (metadata != MetadataLayout::kSeed && metadata != MetadataLayout::kCompact && metadata != MetadataLayout::kTight)
    bad("metadata", "unknown value");
  if (anchor_count != AnchorCount::kFixed && anchor_count != AnchorCount::kAuto) bad("anchor_count", "unknown value");
  if (segment_tokens < 0 || segment_tokens > (int64_t{1} << 24))
    bad("segment_tokens", "must be in [0, 16777216], got " + std::to_string(segment_tokens));
  if (recent_tokens < 0 || recent_tokens > (int64_t{1} << 24))
    bad("recent_tokens", "must be in [0, 16777216], got " + std::to_string(recent_tokens));
  if (extend_tokens < 0 || extend_tokens > (int64_t{1} << 24))
    bad("extend_tokens", "must be in [0, 16777216], got " + std::to_string(extend_tokens));
  if (threads < 0 || threads > 4096) bad("threads", "must be in [0, 4096], got " + std::to_string(threads));
  if (key_rope.enabled) {
    if (!std::isfinite(key_rope.base) || !(key_rope.base > 1.0))
      bad("key_rope.base", "must be finite and > 1, got " + num(key_rope.base));
    if (key_rope.style != RopeStyle::kNormal && key_rope.style != RopeStyle::kNeox) bad("key_rope.style", "unknown value");
    for (double f : key_rope.freq_scale)  // their count is checked against D when keys arrive
      if (!(f > 0.0) || !std::isfinite(f)) bad("key_rope.freq_scale", "values must be finite and > 0");
    if (key_rope.position_offset < 0 || key_rope.position_offset >= core::kMaxRopePosition)
      bad("key_rope.position_offset", "must be in [0, " + std::to_string(core::kMaxRopePosition) + "), got " +
                                          std::to_string(key_rope.position_offset));
  }
}

const char* to_string(ResidualAllocation v) {
  return v == ResidualAllocation::kPerHead ? "per_head" : "pooled";
}
const char* to_string(MetadataLayout v) {
  return v == MetadataLayout::kCompact ? "compact" : v == MetadataLayout::kTight ? "tight" : "seed";
}
const char* to_string(AnchorCount v) { return v == AnchorCount::kAuto ? "auto" : "fixed"; }
const char* to_string(ResidualScale v) { return v == ResidualScale::kAbsMax ? "absmax" : "rms"; }
const char* to_string(CompressTrigger v) {
  return v == CompressTrigger::kFirstDecode ? "first_decode" : "first_prefill";
}

std::string AnchorKVConfig::to_string() const {
  std::ostringstream os;
  os << "theta=" << theta << " window=" << window << " rho=" << rho << " anchor_frac=" << anchor_frac
     << " residual_bits=" << residual_bits << " seed=" << seed
     << " allocation=" << anchorkv::to_string(allocation) << " scale=" << anchorkv::to_string(scale)
     << " trigger=" << anchorkv::to_string(trigger) << " metadata=" << anchorkv::to_string(metadata)
     << " anchor_count=" << anchorkv::to_string(anchor_count) << " threads=" << threads;
  if (key_rope.enabled)
    os << " key_rope=" << (key_rope.style == RopeStyle::kNeox ? "neox" : "normal") << ":" << key_rope.base << "@"
       << key_rope.position_offset << (key_rope.freq_scale.empty() ? "" : "(scaled frequencies)");
  if (streaming())
    os << " segment_tokens=" << segment_tokens << " recent_tokens=" << recent_tokens
       << " extend_tokens=" << extend_tokens;
  return os.str();
}

}  // namespace anchorkv
