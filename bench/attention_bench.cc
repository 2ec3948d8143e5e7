// Decode attention (Sq = 1), B = 1, H = 8 KV heads, GQA 4 (32 query heads),
// D = 128, theta 0.05: dense fp16 attention vs attention on the compressed
// cache, registered side by side so one run gives the ratio.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "eval/workload.h"

namespace {

using namespace anchorkv;

struct Layer {
  eval::Workload w;
  FullKVCache dense;
  AnchorKVCache compressed;
};

Layer& layer(int64_t S) {
  static std::map<int64_t, std::unique_ptr<Layer>> cache;
  auto& l = cache[S];
  if (!l) {
    l = std::make_unique<Layer>();
    eval::SyntheticSpec spec;
    spec.S = S;
    spec.n_queries = 4;
    l->w = eval::make_synthetic(spec);
    l->dense.update_and_fetch(l->w.keys(), l->w.values());
    l->compressed.update_and_fetch(l->w.keys(), l->w.values());
  }
  return *l;
}

// The decode query and the cache (args: S, compressed) of a benchmark.
struct DecodeCall {
  TensorView q;
  const KVCache& cache;
  bool compressed;
};
DecodeCall decode_call(const benchmark::State& state) {
  const bool compressed = state.range(1) != 0;
  Layer& l = layer(state.range(0));
  return {TensorView::f32(l.w.Q.data(), {1, 32, 1, 128}),
          compressed ? static_cast<const KVCache&>(l.compressed) : l.dense, compressed};
}

void BM_DecodeAttention(benchmark::State& state) {
  const int64_t S = state.range(0);
  const auto [q, c, compressed] = decode_call(state);
  for (auto _ : state) benchmark::DoNotOptimize(attend(q, c).data());
  state.counters["token_heads_per_s"] =
      benchmark::Counter(static_cast<double>(8 * S), benchmark::Counter::kIsIterationInvariantRate);
  if (!compressed)
    state.counters["read_GBps"] = benchmark::Counter(static_cast<double>(8 * S * 128 * 4),
                                                     benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
  state.SetLabel(compressed ? "anchorkv (compressed)" : "dense fp16");
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{4096, 32768, 131072}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same with the layer evicted from every cache level before each call, as
// in a model's decode step (each layer's cache is read once per token, and a
// model's caches together exceed the last-level cache): a buffer larger than
// this machine's L3 is read between calls, outside the timing.
void BM_DecodeAttentionCold(benchmark::State& state) {
  const auto [q, c, compressed] = decode_call(state);
  static std::vector<int64_t> evict(size_t{1} << 27, 1);  // 1 GiB
  for (auto _ : state) {
    state.PauseTiming();
    int64_t sum = 0;
    for (size_t i = 0; i < evict.size(); i += 8) sum += evict[i];
    benchmark::DoNotOptimize(sum);
    state.ResumeTiming();
    benchmark::DoNotOptimize(attend(q, c).data());
  }
  state.SetLabel(compressed ? "anchorkv (compressed), cold" : "dense fp16, cold");
}
BENCHMARK(BM_DecodeAttentionCold)
    ->ArgsProduct({{32768, 131072}, {0, 1}})
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Keys stored before RoPE, RoPE applied inside attention (args: S, mode):
// 0 dense fp16, 1 compressed with key residuals coded as given, 2 compressed
// with key residuals coded at their positions (AnchorKVConfig::key_rope).
struct PreRopeLayer {
  eval::Workload w;
  AttentionOptions ao;
  FullKVCache dense;
  AnchorKVCache compressed, keyrope;
  explicit PreRopeLayer(const AnchorKVConfig& at_positions) : keyrope(at_positions) {}
};

PreRopeLayer& pre_rope_layer(int64_t S) {
  static std::map<int64_t, std::unique_ptr<PreRopeLayer>> cache;
  auto& l = cache[S];
  if (!l) {
    eval::SyntheticSpec spec;
    spec.S = S;
    spec.n_queries = 4;
    spec.rope = false;
    spec.query_position = S - 1;  // attend() places the query at the last cached position
    AttentionOptions ao;
    ao.rope.enabled = true;
    ao.rope.base = spec.rope_base;
    AnchorKVConfig at_positions;
    at_positions.key_rope = ao.rope;
    l = std::make_unique<PreRopeLayer>(at_positions);
    l->w = eval::make_synthetic(spec);
    l->ao = ao;
    for (KVCache* c : std::vector<KVCache*>{&l->dense, &l->compressed, &l->keyrope})
      c->update(l->w.keys(), l->w.values());
  }
  return *l;
}

void BM_DecodeAttentionPreRope(benchmark::State& state) {
  PreRopeLayer& l = pre_rope_layer(state.range(0));
  const int64_t mode = state.range(1);
  const KVCache& c = mode == 0   ? static_cast<const KVCache&>(l.dense)
                     : mode == 1 ? static_cast<const KVCache&>(l.compressed)
                                 : static_cast<const KVCache&>(l.keyrope);
  const TensorView q = TensorView::f32(l.w.Q.data(), {1, 32, 1, 128});
  for (auto _ : state) benchmark::DoNotOptimize(attend(q, c, l.ao).data());
  state.SetLabel(mode == 0   ? "dense fp16, RoPE in attention"
                 : mode == 1 ? "anchorkv, pre-RoPE"
                             : "anchorkv, :keyrope");
}
BENCHMARK(BM_DecodeAttentionPreRope)
    ->ArgsProduct({{32768, 131072}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The tight layout (4 bytes of metadata per token, docs/storage.md), whose
// budget buys about three times the seed layout's residuals (args: S, mode):
// 0 keys after RoPE, 1 before RoPE coded as given, 2 before RoPE coded at
// their positions (key_rope). The same query placement as the pre-RoPE case.
struct TightLayer {
  eval::Workload post, pre;
  AttentionOptions ao;
  AnchorKVCache post_rope, pre_rope, keyrope;
  TightLayer(const AnchorKVConfig& tight, const AnchorKVConfig& tight_at_positions)
      : post_rope(tight), pre_rope(tight), keyrope(tight_at_positions) {}
};

TightLayer& tight_layer(int64_t S) {
  static std::map<int64_t, std::unique_ptr<TightLayer>> cache;
  auto& l = cache[S];
  if (!l) {
    eval::SyntheticSpec spec;
    spec.S = S;
    spec.n_queries = 4;
    AnchorKVConfig tight;
    tight.metadata = MetadataLayout::kTight;
    AttentionOptions ao;
    ao.rope.enabled = true;
    ao.rope.base = spec.rope_base;
    AnchorKVConfig at_positions = tight;
    at_positions.key_rope = ao.rope;
    l = std::make_unique<TightLayer>(tight, at_positions);
    l->post = eval::make_synthetic(spec);
    spec.rope = false;
    spec.query_position = S - 1;
    l->pre = eval::make_synthetic(spec);
    l->ao = ao;
    l->post_rope.update(l->post.keys(), l->post.values());
    l->pre_rope.update(l->pre.keys(), l->pre.values());
    l->keyrope.update(l->pre.keys(), l->pre.values());
  }
  return *l;
}

void BM_DecodeAttentionTight(benchmark::State& state) {
  TightLayer& l = tight_layer(state.range(0));
  const int64_t mode = state.range(1);
  AttentionOptions ao = l.ao;
  ao.bf16_residuals = state.range(2) != 0;
  ao.bf16_scores = state.range(2) == 1;
  if (mode == 0) {
    const TensorView q = TensorView::f32(l.post.Q.data(), {1, 32, 1, 128});
    ao.rope.enabled = false;
    for (auto _ : state) benchmark::DoNotOptimize(attend(q, l.post_rope, ao).data());
  } else {
    const TensorView q = TensorView::f32(l.pre.Q.data(), {1, 32, 1, 128});
    const KVCache& c = mode == 1 ? l.pre_rope : l.keyrope;
    for (auto _ : state) benchmark::DoNotOptimize(attend(q, c, ao).data());
  }
  state.SetLabel(std::string(mode == 0 ? "tight, post-RoPE" : mode == 1 ? "tight, pre-RoPE" : "tight, :keyrope") +
                 (ao.bf16_residuals ? ", bf16 residuals" : ", fp32 residuals") +
                 (mode == 0 ? "" : ao.bf16_scores ? ", bf16 scores" : ", fp32 scores"));
}
// args: S, keys (0 post-RoPE, 1 pre-RoPE, 2 :keyrope), arithmetic: bf16 residuals and pre-RoPE
// scores (1), fp32 (0), bf16 residuals with fp32 scores (2)
BENCHMARK(BM_DecodeAttentionTight)
    ->ArgsProduct({{4096, 32768, 131072}, {0, 1, 2}, {1, 0, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();


// The same tight post-RoPE layer held as N streaming segments of S / N
// tokens (args: S, N, threads; N = 1 is one segment): what a long session's decode
// pays for many segments (#34's target: 32 within 10% of one).
AnchorKVCache& segmented_layer(int64_t S, int64_t n) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<AnchorKVCache>> cache;
  auto& c = cache[{S, n}];
  if (!c) {
    AnchorKVConfig cfg;
    cfg.metadata = MetadataLayout::kTight;
    cfg.segment_tokens = S / n;
    c = std::make_unique<AnchorKVCache>(cfg);
    const eval::Workload& w = tight_layer(S).post;
    for (int64_t at = 0; at < S; at += cfg.segment_tokens) {  // one call per segment (docs/spec.md §4.8)
      auto part = [&](const TensorView& x) {
        TensorView t = x;
        t.data = static_cast<const char*>(x.data) + at * x.strides[2] * static_cast<int64_t>(sizeof(float));
        t.shape[2] = std::min(cfg.segment_tokens, S - at);
        return t;
      };
      c->update(part(w.keys()), part(w.values()));
    }
  }
  return *c;
}

void BM_DecodeAttentionSegments(benchmark::State& state) {
  const int64_t S = state.range(0), n = state.range(1);
  const TensorView q = TensorView::f32(tight_layer(S).post.Q.data(), {1, 32, 1, 128});
  const KVCache& c = n == 1 ? static_cast<const KVCache&>(tight_layer(S).post_rope) : segmented_layer(S, n);
  AttentionOptions ao;
  ao.threads = static_cast<int>(state.range(2));
  for (auto _ : state) benchmark::DoNotOptimize(attend(q, c, ao).data());
  state.counters["anchors"] = static_cast<double>(static_cast<const AnchorKVCache&>(c).n_anchor_total());
  state.SetLabel(n == 1 ? "tight, one segment" : "tight, " + std::to_string(n) + " streaming segments");
}
BENCHMARK(BM_DecodeAttentionSegments)
    ->ArgsProduct({{32768}, {1, 32}, {1, 2}})
    ->Args({16384, 1, 1})
    ->Args({16384, 128, 1})  // a long generation's 128-token segments
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
