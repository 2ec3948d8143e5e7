#include "io/kvdump.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "anchorkv/status.h"
#include "eval/workload.h"

namespace anchorkv::io {
namespace {

KVDump sample() {
  KVDump d;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.head_dim = 3;
  d.n_tokens = 5;
  for (int l = 0; l < 2; ++l) {
    KVDumpLayer L;
    for (int i = 0; i < 4 * 3 * 5; ++i) L.q.push_back(static_cast<float>(l * 1000 + i));
    for (int i = 0; i < 2 * 3 * 5; ++i) {
      L.k_post.push_back(static_cast<float>(l * 1000 + 100 + i));
      L.k_pre.push_back(static_cast<float>(l * 1000 + 200 + i));
      L.v.push_back(static_cast<float>(l * 1000 + 300 + i));
    }
    d.layers.push_back(L);
  }
  return d;
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// parse_kvdump must refuse `b` with an error naming `needle` and the file.
void expect_corrupt(const std::vector<uint8_t>& b, const std::string& needle) {
  try {
    parse_kvdump(b.data(), b.size(), "x.akv");
    ADD_FAILURE() << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptFile);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(KVDump, RoundTripAndWorkload) {
  const auto path = (std::filesystem::temp_directory_path() / "anchorkv_test.akv").string();
  write_kvdump(path, sample());
  const KVDump d = read_kvdump(path);
  EXPECT_EQ(d.n_heads, 4u);
  EXPECT_EQ(d.n_tokens, 5u);
  ASSERT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(d.layers[1].k_pre[7], 1207.0f);
  EXPECT_EQ(d.layers[1].v.back(), 1329.0f);
  // Workload: keys/values of the first 3 positions, queries of the last 2, grouped by KV head.
  const eval::Workload w = eval::workload_from_dump(path, 1, 2);
  EXPECT_EQ(w.spec.S, 3);
  EXPECT_EQ(w.spec.H, 2);
  EXPECT_EQ(w.spec.n_queries, 4);  // 2 query heads per KV head x 2 positions
  EXPECT_EQ(w.K[0], 1100.0f);             // KV head 0, position 0
  EXPECT_EQ(w.K[3 * 3], 1100.0f + 15);    // KV head 1 starts at its position 0
  EXPECT_EQ(w.Q[0], 1000.0f + 3 * 3);     // query head 0, position 3
  EXPECT_EQ(w.Q[2 * 3], 1000.0f + 15 + 3 * 3);  // query head 1, position 3
  EXPECT_THROW(eval::workload_from_dump(path, 5, 2), Error);
  EXPECT_THROW(eval::workload_from_dump(path, 0, 4), Error);
  std::filesystem::remove(path);
}

TEST(KVDump, CorruptFilesAreNamedErrors) {
  const auto path = (std::filesystem::temp_directory_path() / "anchorkv_test2.akv").string();
  write_kvdump(path, sample());
  const auto good = bytes_of(path);
  std::filesystem::remove(path);
  const auto& expect = expect_corrupt;
  for (size_t n = 0; n < good.size(); n += 7) expect(std::vector<uint8_t>(good.begin(), good.begin() + n), "x.akv");
  auto b = good;
  b[0] = 'Z';
  expect(b, "bad magic");
  b = good;
  b[4] = 9;
  expect(b, "version 9");
  b = good;
  const uint32_t zero = 0;
  std::memcpy(&b[12], &zero, 4);  // n_heads
  expect(b, "zero dimension");
  b = good;
  const uint64_t huge = ~uint64_t{0};
  std::memcpy(&b[24], &huge, 8);  // n_tokens
  expect(b, "overflow");
  b = good;
  b.push_back(0);
  expect(b, "payload bytes");
  EXPECT_THROW(read_kvdump("/nonexistent.akv"), Error);
}

TEST(KVDump, Version2RecordsRopeAndFeedsPreRopeWorkloads) {
  const auto path = (std::filesystem::temp_directory_path() / "anchorkv_test3.akv").string();
  KVDump v2 = sample();
  v2.rope_base = 500000.0;
  v2.rope_style = 1;
  v2.head_dim = 3;
  write_kvdump(path, v2);
  const auto good = bytes_of(path);
  const KVDump d = read_kvdump(path);
  EXPECT_EQ(d.rope_base, 500000.0);
  EXPECT_EQ(d.rope_style, 1u);
  EXPECT_EQ(d.layers[1].k_pre[7], 1207.0f);
  // Pre-RoPE workload: unrotated keys to cache, rotated ones as the exact reference.
  const eval::Workload w = eval::workload_from_dump(path, 1, 2, nullptr, /*keys_pre_rope=*/true);
  EXPECT_TRUE(w.keys_pre_rope);
  EXPECT_TRUE(w.rope_neox);
  EXPECT_EQ(w.K[0], 1200.0f);
  EXPECT_EQ(w.K_exact[0], 1100.0f);
  std::filesystem::remove(path);
  // A version 1 file has no RoPE: a pre-RoPE workload is refused with the reason.
  write_kvdump(path, sample());
  try {
    eval::workload_from_dump(path, 1, 2, nullptr, true);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("version 1"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  // Corrupt RoPE fields are named.
  const auto& expect = expect_corrupt;
  auto b = good;
  const double bad_base = 0.5;
  std::memcpy(&b[48], &bad_base, 8);
  expect(b, "RoPE base");
  b = good;
  b[56] = 7;
  expect(b, "RoPE style 7");
  expect(std::vector<uint8_t>(good.begin(), good.begin() + 60), "64-byte");
  b = good;
  b[36] = 1;  // the reserved field after dtype
  expect(b, "reserved");
}

}  // namespace
}  // namespace anchorkv::io
