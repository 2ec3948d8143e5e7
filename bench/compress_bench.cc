// Compression of one layer (B = 1, H = 8, D = 128), S = 8192 and 32768:
// token-heads per second and the time of each stage, plus the assignment
// kernel against a plain dot-product loop on the same shapes.
#include <benchmark/benchmark.h>

#include <vector>

#include "compress/compressor.h"
#include "core/linalg.h"
#include "eval/workload.h"

namespace {

using namespace anchorkv;

const eval::Workload& workload(int64_t S) {
  static std::vector<std::pair<int64_t, eval::Workload>> cache;
  for (auto& [s, w] : cache)
    if (s == S) return w;
  eval::SyntheticSpec spec;
  spec.S = S;
  spec.n_queries = 1;
  cache.emplace_back(S, eval::make_synthetic(spec));
  // Round to fp16 as the cache does before compressing.
  for (auto& x : cache.back().second.K) x = fp16_to_f32(f32_to_fp16(x));
  for (auto& x : cache.back().second.V) x = fp16_to_f32(f32_to_fp16(x));
  return cache.back().second;
}

void BM_CompressLayer(benchmark::State& state) {
  const int64_t S = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const auto& w = workload(S);
  compress::SegmentInput in{1, 8, S, 128, w.K.data(), w.V.data()};
  AnchorKVConfig cfg;
  cfg.threads = threads;
  compress::ResidualCodec codec(128, cfg.residual_bits, cfg.scale, cfg.seed);
  CompressionStats st, sum;
  for (auto _ : state) {
    auto rows = compress::compress(in, cfg, codec, &st);
    benchmark::DoNotOptimize(rows.data());
    sum.scores_s += st.scores_s;
    sum.anchors_s += st.anchors_s;
    sum.assign_s += st.assign_s;
    sum.allocate_s += st.allocate_s;
    sum.encode_s += st.encode_s;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["token_heads_per_s"] =
      benchmark::Counter(static_cast<double>(8 * S), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["scores_ms"] = sum.scores_s / n * 1e3;
  state.counters["anchors_ms"] = sum.anchors_s / n * 1e3;
  state.counters["assign_util_ms"] = sum.assign_s / n * 1e3;
  state.counters["allocate_ms"] = sum.allocate_s / n * 1e3;
  state.counters["encode_ms"] = sum.encode_s / n * 1e3;
}
BENCHMARK(BM_CompressLayer)->Args({8192, 1})->Args({8192, 2})->Args({32768, 2})->Unit(benchmark::kMillisecond)
    ->UseRealTime()->MinTime(1.0);

// What a streaming decode's closing compresses in the background: 128
// tokens of one row (the runtime's default segment) extending a row of 896,
// tight metadata, anchor counts chosen per segment (:auto), observed by the
// last 32 positions' real queries of a 4-head group (:obs), one thread.
// tried: the anchor counts analysed, all against one observation (scores_ms).
void BM_CompressClosingSegment(benchmark::State& state) {
  constexpr int64_t kPrior = 896, kT = 128, D = 128;
  const auto& w = workload(kPrior + kT);
  AnchorKVConfig cfg;
  cfg.threads = 1;
  cfg.metadata = MetadataLayout::kTight;
  cfg.anchor_count = AnchorCount::kAuto;
  cfg.theta = 0.05;
  compress::ResidualCodec codec(D, cfg.residual_bits, cfg.scale, cfg.seed);
  // Row 0 of the workload's first head: [S, D] at the start of K and V.
  const compress::SegmentInput prior_in{1, 1, kPrior, D, w.K.data(), w.V.data()};
  const auto prior = compress::compress(prior_in, cfg, codec);
  std::vector<float> K(w.K.begin() + kPrior * D, w.K.begin() + (kPrior + kT) * D);
  std::vector<float> V(w.V.begin() + kPrior * D, w.V.begin() + (kPrior + kT) * D);
  compress::SegmentInput in{1, 1, kT, D, K.data(), V.data()};
  in.extends = prior.data();
  const int64_t G = 4, W = cfg.window;
  std::vector<float> Q(w.K.end() - G * W * D, w.K.end());  // any rows of the right scale
  in.Q = Q.data();
  in.G = G;
  in.W = W;
  in.queries_after = true;
  CompressionStats st, sum;
  for (auto _ : state) {
    auto rows = compress::compress(in, cfg, codec, &st);
    benchmark::DoNotOptimize(rows.data());
    sum.scores_s += st.scores_s;
  }
  state.counters["scores_ms"] = sum.scores_s / static_cast<double>(state.iterations()) * 1e3;
  state.counters["tried"] = static_cast<double>(st.anchor_counts_tried);
}
BENCHMARK(BM_CompressClosingSegment)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

// The assignment product: S tokens x k anchors x D, SIMD kernel vs scalar reference.
void BM_AssignmentProduct(benchmark::State& state) {
  const bool simd = state.range(0) != 0;
  const int64_t S = 8192, k = 64, D = 128;
  const auto& w = workload(8192);
  std::vector<float> out(static_cast<size_t>(S * k));
  for (auto _ : state) {
    if (simd)
      core::dot_matrix(w.K.data(), S, D, w.K.data() + (S - k) * D, k, D, D, out.data(), k);
    else
      core::dot_matrix_ref(w.K.data(), S, D, w.K.data() + (S - k) * D, k, D, D, out.data(), k);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * S * k * D, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  state.SetLabel(simd ? core::simd_target_name() : "scalar reference");
}
BENCHMARK(BM_AssignmentProduct)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();  // also runs the suites of attention_bench.cc and matmul_bench.cc
