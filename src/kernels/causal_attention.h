// Causal self-attention of a prefill chunk over itself (the chunk that fills
// an empty cache), blocked the way flash attention is: query blocks x key
// blocks through the dot-product matrix kernel, an online softmax per query,
// blocks above the diagonal never computed (T^2 / 2 dot products per head,
// where the decode kernels score every query against every key and mask).
#pragma once

#include <cstdint>

namespace anchorkv::kernels {

// q [Hq, T, hd], k and v [Hk, T, hd] head-major f32 (keys as attention sees
// them, i.e. rotated); query i of head h attends keys 0..i of KV head
// h / (Hq / Hk), scores scaled by `scale`. out [Hq, T, hd]. K and V are
// rounded to fp16 first, as a cache stores them, so the result is that of
// attending over the cache the chunk then fills. Threads take (head, query
// block) tasks; every output is computed the same way whatever thread runs it.
void causal_attention(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hk, int64_t T,
                      int64_t hd, float scale, float* out, int threads);

// The same over N >= T keys per KV head, k and v [Hk, N, hd]: the first N - T
// are positions before the chunk (a sliding-window layer's ring), the last T
// the chunk's own. Query i sits at key N - T + i and attends keys
// (N - T + i - window, N - T + i] (window 0: from key 0).
void causal_attention(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hk, int64_t T, int64_t N,
                      int64_t hd, float scale, int64_t window, float* out, int threads);
// Its scalar twin: every score, then one softmax per query, in double.
void causal_attention_ref(const float* q, const float* k, const float* v, int64_t Hq, int64_t Hk, int64_t T,
                          int64_t N, int64_t hd, float scale, int64_t window, float* out);

}  // namespace anchorkv::kernels
