// A streaming AnchorKV cache's segments as links of a chain: a cache that
// holds nothing exact is cut into runs of whole segments, each saved on its
// own as a cache of those tokens alone, and caches are put back together
// by appending such runs in order. The server's prefix pool keeps prompts
// this way, so prompts that share a beginning share its segments.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "anchorkv/cache.h"

namespace anchorkv::internal {

// Tokens of each segment of `cache`, in order, when it is a streaming
// AnchorKVCache that holds nothing exact (no head, no tail, nothing closing);
// empty otherwise.
std::vector<int64_t> segment_lengths(const KVCache& cache);

// A new AnchorKVCache of `cache`'s config holding copies of its segments
// [first, last) as if they were all it ever held (positions from 0).
// `cache` must qualify for segment_lengths, and first < last <= its count.
std::unique_ptr<KVCache> copy_segments(const KVCache& cache, size_t first, size_t last);

// A restore point: none of the segments `cache` holds now will be extended
// (AnchorKVConfig::extend_tokens), so copies of them cut here and appended
// back (a pooled prefix) go on with the bits of `cache` itself. Caches of
// other kinds are left as they are.
void seal_segments(KVCache& cache);

// Whether `cache` has a segment compressing off the decode path now (a
// streaming AnchorKV cache between the step that filled it and the one that
// commits it); false for every other cache.
bool compressing_in_background(const KVCache& cache);

// Appends `more`'s segments after `cache`'s, at the positions that follow
// them. Both must qualify for segment_lengths (or `cache` be empty), with one
// config, B, H and D. Strong guarantee: on a throw `cache` is unchanged.
void append_segments(KVCache& cache, const KVCache& more);

}  // namespace anchorkv::internal
