// What a runtime asks of any cache, through the cache's own store rather
// than its type: the model and the runtime hold caches as KVCache and never
// cast them.
#pragma once

#include <cstdint>

#include "anchorkv/cache.h"

namespace anchorkv::internal {

// Whether a prompt given in several calls is held as it is in one call (the
// full cache, a sliding window, streaming AnchorKV): a runtime may then
// prefill a long prompt in chunks.
bool takes_prompt_in_calls(const KVCache& cache);
// Whether every position is held exactly in one dense run (the full cache):
// a prefill chunk may attend over it with the blocked causal kernel.
bool holds_exact_run(const KVCache& cache);
// The positions a sliding-window cache keeps; 0 for a cache that keeps all.
int64_t sliding_window(const KVCache& cache);
// The end of a prompt: a streaming AnchorKV cache closes its exact tail into
// a segment; every other cache is left as it is. Strong guarantee.
void end_prompt(KVCache& cache);

}  // namespace anchorkv::internal
