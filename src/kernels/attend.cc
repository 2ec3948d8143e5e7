// attend(): reads a cache through its attention source (cache/attention_source.h)
// under the cache's reader lock, checks the call (kernels/attend_checks.h), then
//   plan     scale (and rotate) the query, cut every region into chunks (small
//            segments with no query inside them into runs of whole segments)
//   prepare  per-row state of the compressed segment (anchor scores, rotated queries)
//   run      one online-softmax partial per (row, chunk), in parallel
//   merge    fold the partials of a row in chunk order and finish each query
// Chunks are merged in a fixed order, so results never depend on the thread count.
#include <string>
#include <vector>

#include "anchorkv/attention.h"
#include "cache/attention_source.h"
#include "cache/core.h"
#include "core/error.h"
#include "kernels/attend_call.h"
#include "kernels/attend_checks.h"

namespace anchorkv {

using kernels::attend_plan::AttendCall;
using kernels::attend_plan::kOp;

Tensor attend(const TensorView& query, const std::vector<const KVCache*>& caches, const AttentionOptions& opt,
              AttentionStats* stats) {
  // Every cache stays read-locked until the output is written (writers wait).
  std::vector<internal::ReadLocked<internal::CacheStore>> locked;
  cache::AttentionSource src;
  bool evicts = false;
  std::string evicting;
  for (const KVCache* c : caches) {
    if (!c) core::fail(ErrorCode::kInvalidArgument, kOp, "a null cache");
    locked.push_back(internal::CacheAccess::read(*c));
    const auto& l = locked.back();
    if (l.store.kept_per_row(l.shape) < l.shape.seen) {
      evicts = true;
      evicting = l.store.name();
    }
    cache::AttentionSource own = l.store.attention_source(l.shape);
    // RoPE inside attention rotates each key at its position: affine codes are
    // scored as stored, so such a call reads the cache's dense fetch instead.
    if (opt.rope.enabled && own.holds_affine()) own = cache::dense_source(l.store.fetch(l.shape));
    cache::append_source(src, std::move(own), kOp);
  }
  kernels::check_attend_call(query, src, opt, evicts, evicting);
  return AttendCall(query, src, opt).run(stats);
}

Tensor attend(const TensorView& query, const KVCache& cache, const AttentionOptions& opt,
              AttentionStats* stats) {
  return attend(query, std::vector<const KVCache*>{&cache}, opt, stats);
}

}  // namespace anchorkv
