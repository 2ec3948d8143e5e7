#include "io/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "anchorkv/status.h"
#include "core/half.h"

namespace anchorkv::io {
namespace {

// Builds GGUF bytes for tests.
class Writer {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad(uint64_t a) {
    while (b.size() % a) b.push_back(0);
  }
  std::vector<uint8_t> b;
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  std::vector<uint8_t> data;
};

std::vector<uint8_t> make_file(const std::vector<Tensor>& tensors, uint32_t version = 3) {
  Writer w;
  w.put<uint32_t>(0x46554747u);
  w.put<uint32_t>(version);
  w.put<uint64_t>(tensors.size());
  w.put<uint64_t>(5);  // kv count
  w.str("general.architecture");
  w.put<uint32_t>(8);
  w.str("llama");
  w.str("general.alignment");
  w.put<uint32_t>(4);
  w.put<uint32_t>(32);
  w.str("llama.rope.freq_base");
  w.put<uint32_t>(6);
  w.put<float>(10000.0f);
  w.str("tokenizer.ggml.tokens");
  w.put<uint32_t>(9);
  w.put<uint32_t>(8);
  w.put<uint64_t>(3);
  w.str("<unk>");
  w.str("<s>");
  w.str("é");
  w.str("flag");
  w.put<uint32_t>(7);
  w.put<uint8_t>(1);
  uint64_t off = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors) {
    offsets.push_back(off);
    off += (t.data.size() + 31) / 32 * 32;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    w.str(tensors[i].name);
    w.put<uint32_t>(static_cast<uint32_t>(tensors[i].dims.size()));
    for (uint64_t d : tensors[i].dims) w.put<uint64_t>(d);
    w.put<uint32_t>(tensors[i].type);
    w.put<uint64_t>(offsets[i]);
  }
  w.pad(32);
  for (const auto& t : tensors) {
    w.b.insert(w.b.end(), t.data.begin(), t.data.end());
    w.pad(32);
  }
  return w.b;
}

std::vector<Tensor> sample_tensors() {
  Tensor f32{"w.f32", {4, 2}, 0, {}};
  for (int i = 0; i < 8; ++i) {
    const float v = 0.5f * static_cast<float>(i) - 1.0f;
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    f32.data.insert(f32.data.end(), p, p + 4);
  }
  Tensor q8{"w.q8", {32, 1}, 8, {}};
  const uint16_t d = core::float_to_half(0.5f);
  q8.data.push_back(static_cast<uint8_t>(d & 0xFF));
  q8.data.push_back(static_cast<uint8_t>(d >> 8));
  for (int i = 0; i < 32; ++i) q8.data.push_back(static_cast<uint8_t>(static_cast<int8_t>(i - 16)));
  Tensor q4{"w.q4", {32}, 2, {}};
  const uint16_t d4 = core::float_to_half(2.0f);
  q4.data.push_back(static_cast<uint8_t>(d4 & 0xFF));
  q4.data.push_back(static_cast<uint8_t>(d4 >> 8));
  for (int i = 0; i < 16; ++i) q4.data.push_back(static_cast<uint8_t>((i & 0xF) | ((15 - i) << 4)));
  return {f32, q8, q4};
}

TEST(Gguf, ParsesMetadataTensorsAndDequantizes) {
  const auto bytes = make_file(sample_tensors());
  const GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("general.alignment"), 32u);
  EXPECT_DOUBLE_EQ(f.get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(std::get<bool>(f.metadata().at("flag")), true);
  const auto& toks = f.get_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.items.size(), 3u);
  EXPECT_EQ(std::get<std::string>(toks.items[2]), "é");
  ASSERT_EQ(f.tensors().size(), 3u);
  const auto& t = f.tensor("w.f32");
  EXPECT_EQ(t.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t.n_elements, 8);
  std::vector<float> out(32);
  dequantize_row(t.type, t.data, 8, out.data());
  EXPECT_FLOAT_EQ(out[7], 2.5f);
  const auto& q8 = f.tensor("w.q8");
  EXPECT_EQ(q8.n_bytes, 34);
  dequantize_row(q8.type, q8.data, 32, out.data());
  EXPECT_FLOAT_EQ(out[0], -8.0f);
  EXPECT_FLOAT_EQ(out[31], 7.5f);
  const auto& q4 = f.tensor("w.q4");
  dequantize_row(q4.type, q4.data, 32, out.data());
  EXPECT_FLOAT_EQ(out[0], 2.0f * (0 - 8));
  EXPECT_FLOAT_EQ(out[16], 2.0f * (15 - 8));
  EXPECT_FLOAT_EQ(out[31], 2.0f * (0 - 8));
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_THROW(f.tensor("nope"), Error);
  EXPECT_THROW(f.get_string("general.alignment"), Error);  // wrong kind
  EXPECT_THROW(f.get_uint("missing.key"), Error);
  const auto v2 = make_file(sample_tensors(), 2);
  EXPECT_EQ(GgufFile::from_memory(v2.data(), v2.size()).version(), 2u);
}

void expect_corrupt(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    GgufFile::from_memory(bytes.data(), bytes.size(), "test.gguf");
    ADD_FAILURE() << "accepted; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptFile) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos) << e.what();
  }
}

TEST(Gguf, EveryTruncationIsAClearError) {
  const auto bytes = make_file(sample_tensors());
  for (size_t n = 0; n < bytes.size(); ++n) {
    // The last tensor's padding is not data: cutting it off is still valid.
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
    try {
      GgufFile::from_memory(cut.data(), cut.size());
      EXPECT_GE(n, bytes.size() - 32 + 18) << "accepted a file cut at " << n;
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kCorruptFile) << n;
    }
  }
}

TEST(Gguf, MalformedFieldsAreNamed) {
  const auto good = make_file(sample_tensors());
  auto m = good;
  m[0] = 'X';
  expect_corrupt(m, "bad magic");
  m = good;
  m[4] = 1;
  expect_corrupt(m, "unsupported GGUF version 1");
  m = good;
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(&m[8], &huge, 8);
  expect_corrupt(m, "tensor count");
  m = good;
  std::memcpy(&m[16], &huge, 8);
  expect_corrupt(m, "metadata count");
  m = good;
  std::memcpy(&m[24], &huge, 8);  // length of the first key
  expect_corrupt(m, "truncated");
  // Unknown value type of the first kv (after 24 + 8 + 20 key bytes).
  m = good;
  const uint32_t bad_type = 99;
  std::memcpy(&m[24 + 8 + 20], &bad_type, 4);
  expect_corrupt(m, "unknown type 99");

  auto t = sample_tensors();
  t[0].dims = {4, 2, 1, 1, 1};
  expect_corrupt(make_file(t), "5 dims");
  t = sample_tensors();
  t[0].type = 77;
  expect_corrupt(make_file(t), "unknown ggml type 77");
  t = sample_tensors();
  t[1].dims = {30, 1};  // Q8_0 rows must be whole blocks
  expect_corrupt(make_file(t), "not a multiple");
  t = sample_tensors();
  t[0].dims = {uint64_t{1} << 39, uint64_t{1} << 39};
  expect_corrupt(make_file(t), "overflows");
  t = sample_tensors();
  t[2].name = "w.f32";
  expect_corrupt(make_file(t), "duplicate tensor name");
  t = sample_tensors();
  t[0].dims = {1024, 1024};  // claims far more data than the file holds
  expect_corrupt(make_file(t), "beyond the end of the file");
}

TEST(Gguf, SharedTinyModel) {
  const std::filesystem::path p = std::filesystem::path(ANCHORKV_SOURCE_DIR) / ".." / "shared" / "models" /
                                  "anchorkv-tiny.gguf";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << "shared model not present: " << p;
  const GgufFile f = GgufFile::open(p.string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 256u);
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").items.size(), 259u);
  EXPECT_EQ(f.tensors().size(), 39u);
  const auto& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{256, 259}));
  EXPECT_EQ(emb.type, GgmlType::kF32);
  std::vector<float> row(256);
  dequantize_row(emb.type, emb.data + 65 * 256 * 4, 256, row.data());
  double norm = 0;
  for (float x : row) {
    ASSERT_TRUE(std::isfinite(x));
    norm += x * x;
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_THROW(GgufFile::open("/nonexistent/anchorkv.gguf"), Error);
}

}  // namespace
}  // namespace anchorkv::io
