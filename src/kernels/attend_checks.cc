#include "kernels/attend_checks.h"

#include <cmath>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/rope.h"

namespace anchorkv::kernels {
namespace {

constexpr const char* kOp = "anchorkv::attend";
using core::kMaxRopePosition;

void check_query(const TensorView& query, const cache::AttentionSource& src, const AttentionOptions& opt) {
  const Shape4& qs = query.shape;
  if (src.n_total == 0 || src.H == 0) core::fail(ErrorCode::kInvalidState, kOp, "the cache holds no token");
  for (int i = 0; i < 4; ++i)
    if (qs[i] < 0 || query.strides[i] < 0)
      core::fail(ErrorCode::kInvalidArgument, kOp, "query has a negative dimension or stride");
  if (qs[0] != src.B || qs[3] != src.D)
    core::fail(ErrorCode::kShapeMismatch, kOp,
               "query " + shape_string(qs) + " does not match the cache's B=" + std::to_string(src.B) +
                   ", D=" + std::to_string(src.D));
  if (qs[1] < 1 || qs[1] % src.H != 0)
    core::fail(ErrorCode::kShapeMismatch, kOp,
               "query heads Hq=" + std::to_string(qs[1]) +
                   " must be a positive multiple of the cache's H=" + std::to_string(src.H));
  if (qs[2] > src.n_total)
    core::fail(ErrorCode::kShapeMismatch, kOp,
               "Sq=" + std::to_string(qs[2]) + " queries but the cache holds only " +
                   std::to_string(src.n_total) + " positions (append the queries' K/V first)");
  if (query.numel() > 0 && query.data == nullptr)
    core::fail(ErrorCode::kInvalidArgument, kOp, "query has null data");
  if (opt.out_dtype != DType::kF32 && opt.out_dtype != DType::kF16)
    core::fail(ErrorCode::kInvalidArgument, kOp, "out_dtype must be f32 or f16");
  if (!(opt.scale >= 0.0f) || !std::isfinite(opt.scale))
    core::fail(ErrorCode::kInvalidArgument, kOp, "scale must be finite and >= 0");
}

void check_rope(const RopeOptions& rope, const cache::AttentionSource& src, bool evicts,
                const std::string& cache_name) {
  if (evicts)
    core::fail(
        ErrorCode::kUnsupported, kOp,
        "RoPE inside attention needs every token's position; cache '" + cache_name + "' evicts tokens");
  if (std::string problem = core::rope_problem(rope, src.D); !problem.empty())
    core::fail(ErrorCode::kInvalidArgument, kOp, problem);
  if (rope.position_offset < 0)
    core::fail(ErrorCode::kInvalidArgument, kOp, "rope.position_offset must be >= 0");
  if (rope.position_offset > kMaxRopePosition - src.n_total)
    core::fail(
        ErrorCode::kInvalidArgument, kOp,
        "RoPE positions beyond " + std::to_string(kMaxRopePosition) + " (position_offset + cache length)");
}

// Coded tokens (TurboQuant) are scored in their rotation's domain, which RoPE
// at each position would leave: they hold keys as given, after RoPE.
void check_no_coded(const cache::AttentionSource& src) {
  if (src.holds_coded())
    core::fail(ErrorCode::kUnsupported, kOp,
               "RoPE inside attention over coded tokens (TurboQuant keeps keys as given: store them after RoPE)");
}

void check_key_rope(const RopeOptions& rope, const cache::CompressedRegion& seg);

// A segment whose key residuals were coded after RoPE (AnchorKVConfig::key_rope)
// is scored with the query rotated to its position, so attention must apply
// the same RoPE at the same positions.
void check_key_rope(const RopeOptions& rope, const cache::AttentionSource& src) {
  for (const cache::CompressedRegion& seg : src.segments) check_key_rope(rope, seg);
}

void check_key_rope(const RopeOptions& rope, const cache::CompressedRegion& seg) {
  if (seg.rows->empty()) return;
  const RopeOptions& kr = seg.rows->front().key_rope;
  if (!kr.enabled) return;
  auto name = [](const RopeOptions& r) {
    std::ostringstream os;
    os << (r.style == RopeStyle::kNeox ? "neox" : "normal") << " base " << r.base
       << (r.freq_scale.empty() ? "" : " (scaled frequencies)") << " from position " << r.position_offset;
    return os.str();
  };
  RopeOptions at = rope;
  at.position_offset += seg.pos0;
  if (!rope.enabled || !core::same_angles(rope, kr) || rope.style != kr.style ||
      at.position_offset != kr.position_offset)
    core::fail(ErrorCode::kInvalidArgument, kOp,
               "the cache holds keys before RoPE with key residuals coded for RoPE " + name(kr) +
                   " (AnchorKVConfig::key_rope); options.rope must apply that RoPE, got " +
                   (rope.enabled ? name(at) : std::string("none")));
}

}  // namespace

void check_attend_call(const TensorView& query, const cache::AttentionSource& src, const AttentionOptions& opt,
                       bool evicts, const std::string& evicting) {
  check_query(query, src, opt);
  if (opt.rope.enabled) check_rope(opt.rope, src, evicts, evicting);
  if (opt.rope.enabled) check_no_coded(src);
  check_key_rope(opt.rope, src);
}

}  // namespace anchorkv::kernels
