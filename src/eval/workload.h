// Built-in synthetic K/V/Q workload shaped like one attention layer.
//
// Per (batch, head) row, with the project's Rng (seeded per row):
//  * tokens walk over `clusters` cluster centres (a Markov chain that stays on
//    its cluster with probability `stay`), giving clustered, locally coherent
//    keys and values (low-rank structure);
//  * keys  = centre + noise, times a per-token magnitude, plus a constant bias
//    on `outlier_channels` channels of size `outlier_scale` (the large-magnitude
//    key channels seen in real models), then RoPE at the token's position;
//  * the first `sinks` tokens point along a shared "sink" direction that every
//    query also carries, so they draw attention (attention sinks);
//  * values = their own cluster centres + noise, no channel outliers;
//  * queries: `n_queries` per row drawn from the same process at positions
//    S, S+1, ... (decode queries; or all at `query_position`). They are held
//    out: compression never sees them.
// With the same seed, rope = false gives exactly the pre-RoPE vectors of
// rope = true (RoPE draws no random numbers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anchorkv/tensor.h"

namespace anchorkv::eval {

struct SyntheticSpec {
  int64_t B = 1, H = 8, S = 8192, D = 128;
  int64_t n_queries = 32;  // held-out queries per row
  uint64_t seed = 1234;
  int64_t clusters = 64;
  double stay = 0.95;
  double noise = 0.35;      // noise std relative to the centres' std
  int64_t outlier_channels = 4;
  double outlier_scale = 6.0;
  int64_t sinks = 4;
  bool rope = true;
  double rope_base = 500000.0;  // Llama-3
  // Position of the held-out queries: -1 = decode positions S, S+1, ...;
  // otherwise every query sits at this position (e.g. S - 1, the last cached one).
  int64_t query_position = -1;
};

struct Workload {
  SyntheticSpec spec;
  std::vector<float> K, V;  // [B, H, S, D]
  std::vector<float> Q;     // [B, H, n_queries, D]
  // Pre-RoPE workloads (from a dump, keys_pre_rope): K is unrotated, the
  // queries are rotated, K_exact holds the rotated keys attention really uses,
  // and a cache's keys are rotated to their positions 0..S-1 before scoring.
  bool keys_pre_rope = false;
  std::vector<float> K_exact;
  double rope_base = 0;
  bool rope_neox = false;
  TensorView keys() const { return TensorView::f32(K.data(), {spec.B, spec.H, spec.S, spec.D}); }
  TensorView values() const { return TensorView::f32(V.data(), {spec.B, spec.H, spec.S, spec.D}); }
};

Workload make_synthetic(const SyntheticSpec& spec);

// A workload from one layer of a K/V dump (io/kvdump.h): the first
// n_tokens - held_out positions are the cache's keys (post-RoPE, as the seed
// stores them) and values; the queries of the last held_out positions, every
// query head of a KV head's group, are the held-out queries (post-RoPE too).
// layer < 0 takes the middle layer; *layer_used (if given) says which.
// keys_pre_rope: the cache gets the keys before RoPE instead (needs a version 2
// dump, which records RoPE base and style).
Workload workload_from_dump(const std::string& path, int64_t layer, int64_t held_out, int64_t* layer_used = nullptr,
                            bool keys_pre_rope = false);

// Apply RoPE (normal/adjacent pairing) in place to x[D] at position pos.
void apply_rope(float* x, int64_t D, int64_t pos, double base);

}  // namespace anchorkv::eval
