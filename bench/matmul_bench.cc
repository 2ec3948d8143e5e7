// One-token (decode) matmuls on quantized weights, per type and layout: the
// file's rows (kGguf) against the 16-row groups (kRows16) where the CPU
// multiplies them. A layer's worth of 2816 x 1024 matrices, cycled, so the
// weights come from the last-level cache rather than from one core's L2;
// the counter is weight bytes (GGUF size) per second.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "io/gguf.h"
#include "model/qmatmul.h"

namespace {

using namespace anchorkv;

constexpr int64_t kRows = 2816, kCols = 1024, kMatrices = 16;

struct Matrices {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<model::QuantMatrix> W;
  int64_t gguf_bytes = 0;
};

// Random blocks with sane fp16 scales (every other bit pattern is a valid block).
std::vector<uint8_t> random_blocks(io::GgmlType type, std::mt19937& g) {
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  std::vector<uint8_t> bytes(static_cast<size_t>(kRows * kCols / be * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<uint8_t>(byte(g));
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  for (size_t b = 0; b < bytes.size(); b += static_cast<size_t>(bb)) {
    const size_t at = type == io::GgmlType::kQ6_K ? b + 208 : b;
    for (size_t h = 0; h < (type == io::GgmlType::kQ4_K || type == io::GgmlType::kQ5_K ? 2u : 1u); ++h) {
      const uint16_t v = core::float_to_half(scale(g));
      std::memcpy(&bytes[at + 2 * h], &v, 2);
    }
  }
  return bytes;
}

const Matrices& matrices(io::GgmlType type, bool rows16) {
  static std::vector<std::pair<std::pair<int, bool>, Matrices>> cache;
  for (auto& [key, m] : cache)
    if (key == std::make_pair(static_cast<int>(type), rows16)) return m;
  std::mt19937 g(7);
  Matrices m;
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  for (int64_t i = 0; i < kMatrices; ++i) {
    std::vector<uint8_t> gguf = random_blocks(type, g);
    m.gguf_bytes += static_cast<int64_t>(gguf.size());
    if (rows16) {
      std::vector<uint8_t> packed(static_cast<size_t>(model::rows16_bytes(type, kRows, kCols)));
      model::pack_rows16(type, gguf.data(), kRows, kCols, packed.data());
      gguf = std::move(packed);
    }
    m.bytes.push_back(std::move(gguf));
    m.W.push_back({type, m.bytes.back().data(), kRows, kCols, kCols / be * bb,
                   rows16 ? model::QuantLayout::kRows16 : model::QuantLayout::kGguf});
  }
  cache.emplace_back(std::make_pair(static_cast<int>(type), rows16), std::move(m));
  return cache.back().second;
}

// Args: GGML type number, kRows16 (0/1), threads.
void BM_DecodeMatmul(benchmark::State& state) {
  const auto type = static_cast<io::GgmlType>(state.range(0));
  const bool rows16 = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  if (rows16 && !model::rows16_supported(type)) {
    state.SkipWithError("no kRows16 kernel for this type on this CPU");
    return;
  }
  const Matrices& m = matrices(type, rows16);
  std::vector<float> x(kCols), y(kRows);
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : x) v = n(g);
  int64_t i = 0;
  for (auto _ : state) {
    model::matmul_int8(x.data(), 1, m.W[static_cast<size_t>(i++ % kMatrices)], y.data(), threads);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * (m.gguf_bytes / kMatrices));
  state.SetLabel(std::string(io::ggml_type_name(type)) + (rows16 ? " rows16" : " gguf"));
}

// One row to floats (Weight::row: embeddings, the f32 path of prefill on
// CPUs without AMX), in each layout. Args: GGML type number, kRows16 (0/1).
void BM_DequantizeRow(benchmark::State& state) {
  const auto type = static_cast<io::GgmlType>(state.range(0));
  const bool rows16 = state.range(1) != 0;
  if (rows16 && !model::rows16_supported(type)) {
    state.SkipWithError("no kRows16 kernel for this type on this CPU");
    return;
  }
  const model::QuantMatrix& W = matrices(type, rows16).W[0];
  std::vector<float> out(kCols);
  int64_t r = 0;
  for (auto _ : state) {
    if (rows16)
      model::dequantize_rows16_row(type, W.blocks, kCols, r, out.data());
    else
      io::dequantize_row(type, W.blocks + r * W.row_bytes, kCols, out.data());
    benchmark::DoNotOptimize(out.data());
    r = (r + 1) % kRows;
  }
  state.SetItemsProcessed(state.iterations() * kCols);
  state.SetLabel(std::string(io::ggml_type_name(type)) + (rows16 ? " rows16" : " gguf"));
}
BENCHMARK(BM_DequantizeRow)->ArgsProduct({{8, 2, 12, 13}, {0, 1}});

void Args(benchmark::internal::Benchmark* b) {
  for (io::GgmlType t : {io::GgmlType::kQ8_0, io::GgmlType::kQ4_0, io::GgmlType::kQ4_K, io::GgmlType::kQ5_K,
                         io::GgmlType::kQ6_K})
    for (int rows16 : {0, 1})
      for (int threads : {1, 2}) {
        if (rows16 && !model::rows16_supported(t)) continue;
        b->Args({static_cast<int64_t>(t), rows16, threads});
      }
}
BENCHMARK(BM_DecodeMatmul)->Apply(Args)->Unit(benchmark::kMicrosecond);

}  // namespace
