// Cache files (docs/cachefile.md): exact round trips for every cache kind,
// and clear errors for truncated, bit-flipped, oversized and newer files.
#include "anchorkv/cachefile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "anchorkv/anchorkv.h"
#include "cache/anchorkv_state.h"
#include "cache/registry.h"
#include "cache/segment_chain.h"
#include "cache/serial.h"
#include "compress/budget.h"
#include "compress/segment.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace anchorkv {
namespace {

using testing_util::bits_of;
using testing_util::random_kv;

void feed(KVCache& c, int64_t B, int64_t H, int64_t S, int64_t D, uint64_t seed) {
  const auto K = random_kv(B, H, S, D, seed), V = random_kv(B, H, S, D, seed + 1);
  c.update(TensorView::f32(K.data(), {B, H, S, D}), TensorView::f32(V.data(), {B, H, S, D}));
}

std::vector<float> attend_f32(const KVCache& c, int64_t B, int64_t Hq, int64_t D) {
  const auto q = random_kv(B, Hq, 1, D, 99);
  return attend(TensorView::f32(q.data(), {B, Hq, 1, D}), c).to_f32();
}

void expect_same(const KVCache& a, const KVCache& b, int64_t B, int64_t Hq, int64_t D) {
  EXPECT_EQ(a.name(), b.name());
  EXPECT_EQ(a.offset(), b.offset());
  EXPECT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(a.tokens_kept(), b.tokens_kept());
  EXPECT_EQ(a.tokens_total(), b.tokens_total());
  const KVPair x = a.fetch(), y = b.fetch();
  EXPECT_EQ(bits_of(x.keys), bits_of(y.keys));
  EXPECT_EQ(bits_of(x.values), bits_of(y.values));
  if (a.offset() > 0) {
    EXPECT_EQ(attend_f32(a, B, Hq, D), attend_f32(b, B, Hq, D));
  }
}

class EveryKind : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryKind, RoundTripIsExactAndStaysExactAfterMoreTokens) {
  const int64_t B = 1, H = 2, Hq = 4, S = 300, D = 32;
  auto c = cache::make_cache(GetParam(), 0.1, 1);
  feed(*c, B, H, S, D, 1);
  for (int i = 0; i < 3; ++i) feed(*c, B, H, 1, D, 10 + i);
  PromptCacheMeta meta;
  meta.tokens = {1, 2, 3};
  meta.logits = {0.5f, -1.0f};
  meta.entries = {{"model", "test"}, {"keys", "post"}};
  const std::vector<uint8_t> bytes = serialize_caches({c.get()}, meta);
  LoadedCaches loaded = load_caches_from_memory(bytes.data(), bytes.size());
  ASSERT_EQ(loaded.caches.size(), 1u);
  EXPECT_EQ(loaded.meta.tokens, meta.tokens);
  EXPECT_EQ(loaded.meta.logits, meta.logits);
  EXPECT_EQ(loaded.meta.entries, meta.entries);
  EXPECT_EQ(serialize_caches({loaded.caches[0].get()}, meta), bytes) << "save -> load -> save changes bytes";
  expect_same(*c, *loaded.caches[0], B, Hq, D);
  for (int i = 0; i < 5; ++i) {  // decode goes on identically from the loaded cache
    feed(*c, B, H, 1, D, 50 + i);
    feed(*loaded.caches[0], B, H, 1, D, 50 + i);
  }
  expect_same(*c, *loaded.caches[0], B, Hq, D);
}

INSTANTIATE_TEST_SUITE_P(CacheFile, EveryKind, ::testing::ValuesIn(cache::cache_names()));

TEST(CacheFile, EmptyHeadOnlyAndChunkedStatesRoundTrip) {
  AnchorKVConfig chunked;
  chunked.trigger = CompressTrigger::kFirstDecode;
  chunked.metadata = MetadataLayout::kCompact;
  chunked.anchor_count = AnchorCount::kAuto;  // saved since format 2
  chunked.theta = 0.3;
  AnchorKVCache empty, head_only, before_decode(chunked);
  FullKVCache shaped_empty;
  feed(head_only, 1, 2, 1, 16, 1);  // S == 1 before a prefill: exact head
  feed(before_decode, 1, 2, 64, 16, 2);
  feed(before_decode, 1, 2, 64, 16, 3);
  feed(shaped_empty, 1, 2, 0, 16, 4);
  const std::vector<const KVCache*> all = {&empty, &head_only, &before_decode, &shaped_empty};
  const auto bytes = serialize_caches(all);
  LoadedCaches l = load_caches_from_memory(bytes.data(), bytes.size());
  ASSERT_EQ(l.caches.size(), 4u);
  for (size_t i = 0; i < all.size(); ++i) expect_same(*all[i], *l.caches[i], 1, 2, 16);
  // The chunked cache compresses at its first decode step, loaded or not.
  feed(before_decode, 1, 2, 1, 16, 5);
  feed(*l.caches[2], 1, 2, 1, 16, 5);
  EXPECT_TRUE(dynamic_cast<AnchorKVCache&>(*l.caches[2]).is_compressed());
  EXPECT_EQ(dynamic_cast<AnchorKVCache&>(*l.caches[2]).config().anchor_count, AnchorCount::kAuto);
  expect_same(before_decode, *l.caches[2], 1, 2, 16);
}

// key_rope survives a file, including the segment's start after an exact head
// (its residuals were coded from cache position 1 on): same keys, same
// attention with the RoPE it was coded for, the same refusal of another.
TEST(CacheFile, KeyRopeCacheAfterAHeadRoundTrips) {
  AnchorKVConfig cfg;
  cfg.theta = 0.3;
  cfg.key_rope = {true, 10000.0, RopeStyle::kNormal, 11, {}};
  AnchorKVCache c(cfg);
  feed(c, 1, 2, 1, 32, 1);    // exact head
  feed(c, 1, 2, 200, 32, 2);  // compressed from cache position 1
  feed(c, 1, 2, 1, 32, 4);
  ASSERT_GT(c.n_residual_total(), 0);
  const auto bytes = serialize_caches({&c});
  LoadedCaches l = load_caches_from_memory(bytes.data(), bytes.size());
  ASSERT_EQ(l.caches.size(), 1u);
  const auto& back = dynamic_cast<const AnchorKVCache&>(*l.caches[0]);
  EXPECT_EQ(back.config().key_rope.position_offset, 11);
  EXPECT_EQ(bits_of(c.fetch().keys), bits_of(back.fetch().keys));
  const auto q = random_kv(1, 4, 1, 32, 5);
  const TensorView qv = TensorView::f32(q.data(), {1, 4, 1, 32});
  AttentionOptions o;
  o.rope = cfg.key_rope;
  EXPECT_EQ(attend(qv, c, o).to_f32(), attend(qv, back, o).to_f32());
  o.rope.position_offset = 12;
  EXPECT_THROW(attend(qv, back, o), Error);
}

TEST(CacheFile, SaveIsAtomicAndLoadReadsTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("akvc_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "prompt.akvc").string();
  AnchorKVCache a, b;
  feed(a, 1, 2, 200, 32, 1);
  feed(b, 1, 2, 100, 32, 2);
  save_caches(path, {&a});
  const auto first = std::filesystem::file_size(path);
  EXPECT_THROW(save_caches((dir / "missing" / "x.akvc").string(), {&b}), Error);
  save_caches(path, {&a, &b});  // replaces the file whole
  EXPECT_GT(std::filesystem::file_size(path), first);
  LoadedCaches l = load_caches(path);
  ASSERT_EQ(l.caches.size(), 2u);
  expect_same(b, *l.caches[1], 1, 2, 32);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1u) << "no temporary file is left behind";
  try {
    load_caches((dir / "nope.akvc").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
  std::filesystem::remove_all(dir);
}

// A small file with several kinds, to damage in every way.
std::vector<uint8_t> small_file() {
  AnchorKVCache seed_layout;
  AnchorKVConfig compact;
  compact.metadata = MetadataLayout::kCompact;
  compact.theta = 0.3;
  AnchorKVCache compact_cache(compact);
  AnchorKVConfig tight = compact;
  tight.metadata = MetadataLayout::kTight;
  tight.key_rope = {true, 500000.0, RopeStyle::kNeox, 3, {1.0, 0.5, 0.25, 0.125}};  // format 4 (freq_scale: 5)
  AnchorKVCache tight_cache(tight);
  AnchorKVConfig streaming = tight;  // format 6: two segments of 16 and an exact tail of 17
  streaming.segment_tokens = 16;
  streaming.recent_tokens = 4;
  AnchorKVCache streaming_cache(streaming);
  AnchorKVConfig extending = streaming;  // format 7: segments extending the one before, one sealed
  extending.segment_tokens = 8;
  extending.extend_tokens = 24;
  AnchorKVCache extending_cache(extending);
  KIVICache kivi(2, 8, 8);
  H2OCache h2o(0.3);
  TurboQuantCache turbo(2.5, 3);  // two channel groups for its keys
  for (KVCache* c :
       std::vector<KVCache*>{&seed_layout, &compact_cache, &tight_cache, &streaming_cache, &extending_cache, &kivi,
                             &h2o, &turbo}) {
    if (c == &extending_cache) {  // [0, 16) extended to 24 tokens and sealed, [24, 32), an exact tail
      feed(*c, 1, 1, 20, 8, 1);
      feed(*c, 1, 1, 8, 8, 3);
      internal::seal_segments(*c);
      feed(*c, 1, 1, 8, 8, 4);
    } else {
      feed(*c, 1, 1, 48, 8, 1);
    }
    feed(*c, 1, 1, 1, 8, 2);
  }
  const auto& ext = internal::unlocked_state(extending_cache);
  EXPECT_EQ(ext.segments.size(), 2u);
  EXPECT_TRUE(ext.segments.size() == 2 && ext.segments[0].tokens == 24 && ext.segments[0].sealed &&
              ext.segments[1].tokens == 8 && !ext.segments[1].sealed);
  PromptCacheMeta meta;
  meta.tokens = {5, 6};
  meta.entries = {{"model", "m"}};
  return serialize_caches(
      {&seed_layout, &compact_cache, &tight_cache, &streaming_cache, &extending_cache, &kivi, &h2o, &turbo}, meta);
}

ErrorCode load_error(const std::vector<uint8_t>& bytes) {
  try {
    load_caches_from_memory(bytes.data(), bytes.size(), "damaged.akvc");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("damaged.akvc"), std::string::npos) << e.what();
    return e.code();
  }
  return ErrorCode{};
}

// The fuzzer's seed corpus is small_file() as written once per format
// (seed_mixed.akvc: format 2; seed_mixed_v3.akvc: format 3, with a tight
// row; seed_mixed_v4.akvc: format 4, whose tight cache has key_rope;
// seed_mixed_v5.akvc: format 5, its key_rope with scaled frequencies, and a
// TurboQuant cache; seed_mixed_v6.akvc: format 6, a streaming cache of two
// segments; seed_mixed_v7.akvc: format 7, segments extending the one before
// them, one sealed); every
// one must keep loading. ANCHORKV_WRITE_CACHEFILE_SEEDS=DIR writes the
// current format's anew.
TEST(CacheFile, FuzzSeedsLoad) {
  const auto bytes = small_file();
  if (const char* dir = std::getenv("ANCHORKV_WRITE_CACHEFILE_SEEDS")) {
    std::ofstream(std::string(dir) + "/seed_mixed_v7.akvc", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  for (const char* name : {"seed_mixed.akvc", "seed_mixed_v3.akvc", "seed_mixed_v4.akvc", "seed_mixed_v5.akvc",
                           "seed_mixed_v6.akvc", "seed_mixed_v7.akvc"}) {
    const std::string seed = std::string(ANCHORKV_SOURCE_DIR) + "/fuzz/corpus/cachefile/" + name;
    std::ifstream f(seed, std::ios::binary);
    ASSERT_TRUE(f.good()) << seed;
    const std::vector<uint8_t> stored((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // (Not compared byte for byte: compression may round differently on another SIMD target.)
    EXPECT_EQ(load_error(stored), ErrorCode{}) << name << ": old files must keep loading (or the version must change)";
  }
}

TEST(CacheFile, TruncationAtEveryByteIsAnError) {
  const auto bytes = small_file();
  ASSERT_EQ(load_error(bytes), ErrorCode{});
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    ASSERT_EQ(load_error(cut), ErrorCode::kCorruptFile) << "truncated to " << n << " bytes";
  }
}

TEST(CacheFile, EverySingleBitFlipIsAnError) {
  const auto bytes = small_file();
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      auto flipped = bytes;
      flipped[i] ^= static_cast<uint8_t>(1u << bit);
      const ErrorCode e = load_error(flipped);
      ASSERT_TRUE(e == ErrorCode::kCorruptFile || e == ErrorCode::kUnsupported) << "byte " << i << " bit " << bit;
    }
}

// A file around hand-made section payloads, with valid checksums.
std::vector<uint8_t> file_with(const std::vector<std::vector<uint8_t>>& layers, uint32_t version = 1,
                               const std::vector<uint8_t>* meta = nullptr) {
  cache::ByteWriter f;
  for (char c : std::string("AKVCACHE")) f.put<char>(c);
  f.put<uint32_t>(version);
  f.put<uint32_t>(static_cast<uint32_t>(1 + layers.size()));
  f.put<uint64_t>(0);
  f.put<uint64_t>(XXH64(f.bytes().data(), f.bytes().size(), 0));
  auto section = [&](const char* tag, const std::vector<uint8_t>& p) {
    for (int i = 0; i < 4; ++i) f.put<char>(tag[i]);
    f.put<uint32_t>(0);
    f.put<uint64_t>(p.size());
    f.put<uint64_t>(XXH64(p.data(), p.size(), 0));
    f.bytes().insert(f.bytes().end(), p.begin(), p.end());
  };
  cache::ByteWriter empty_meta;
  empty_meta.put<uint64_t>(0);
  empty_meta.put<uint64_t>(0);
  empty_meta.put<uint64_t>(0);
  section("META", meta ? *meta : empty_meta.bytes());
  for (const auto& l : layers) section("LAYR", l);
  return f.bytes();
}

std::vector<uint8_t> full_layer(int64_t B, int64_t H, int64_t D, int64_t seen, uint64_t tokens, uint64_t rows,
                                uint64_t row_len, uint16_t value = 0x3C00) {
  cache::ByteWriter w;
  w.str("anchorkv::FullKVCache");
  w.put<uint8_t>(1);
  for (int64_t x : {B, H, D, seen}) w.put<int64_t>(x);
  w.put<uint64_t>(tokens);
  w.put<uint64_t>(rows);
  for (uint64_t r = 0; r < rows; ++r)
    for (int side = 0; side < 2; ++side) {
      w.put<uint64_t>(row_len);
      for (uint64_t i = 0; i < std::min<uint64_t>(row_len, 64); ++i) w.put<uint16_t>(i == 3 ? value : 0x3C00);
    }
  return w.bytes();
}

TEST(CacheFile, HandMadeLayerLoadsAndBadCountsAreErrors) {
  EXPECT_EQ(load_error(file_with({full_layer(1, 1, 4, 2, 2, 1, 8)})), ErrorCode{}) << "the hand-made file is valid";
  // Counts and lengths far beyond the file, and shapes whose products overflow.
  EXPECT_EQ(load_error(file_with({full_layer(1, 1, 4, 2, 2, 1, uint64_t{1} << 61)})), ErrorCode::kCorruptFile);
  EXPECT_EQ(load_error(file_with({full_layer(1, 1, 4, uint64_t{1} << 62, uint64_t{1} << 62, 1, 8)})),
            ErrorCode::kCorruptFile);
  EXPECT_EQ(load_error(file_with({full_layer(int64_t{1} << 40, int64_t{1} << 40, 4, 2, 2, 1, 8)})),
            ErrorCode::kCorruptFile);
  EXPECT_EQ(load_error(file_with({full_layer(1, 1, -4, 2, 2, 1, 8)})), ErrorCode::kCorruptFile);
  EXPECT_EQ(load_error(file_with({full_layer(1, 2, 4, 2, 2, 1, 8)})), ErrorCode::kCorruptFile) << "rows != B*H";
  EXPECT_EQ(load_error(file_with({full_layer(1, 1, 4, 3, 2, 1, 8)})), ErrorCode::kCorruptFile) << "tokens != seen";
  cache::ByteWriter meta;
  meta.put<uint64_t>(uint64_t{1} << 60);  // 2^60 token ids
  EXPECT_EQ(load_error(file_with({}, 1, &meta.bytes())), ErrorCode::kCorruptFile);
  cache::ByteWriter unknown;
  unknown.str("anchorkv::NoSuchCache");
  EXPECT_EQ(load_error(file_with({unknown.bytes()})), ErrorCode::kCorruptFile);
}

// A checksum-valid file with a non-finite stored value would make every
// attention over it NaN: refused at load, as are non-finite logits.
TEST(CacheFile, NonFiniteStoredValuesAreErrors) {
  EXPECT_EQ(load_error(file_with({full_layer(1, 1, 4, 2, 2, 1, 8, 0x3800)})), ErrorCode{});
  for (uint16_t bad : {uint16_t{0x7C00}, uint16_t{0xFC00}, uint16_t{0x7E00}})  // +inf, -inf, NaN
    EXPECT_EQ(load_error(file_with({full_layer(1, 1, 4, 2, 2, 1, 8, bad)})), ErrorCode::kCorruptFile) << bad;
  cache::ByteWriter meta;
  meta.put<uint64_t>(0);                // no tokens
  meta.array(std::vector<float>{1.0f, NAN});  // logits
  meta.put<uint64_t>(0);
  EXPECT_EQ(load_error(file_with({}, 1, &meta.bytes())), ErrorCode::kCorruptFile);
}

TEST(CacheFile, NewerVersionAndOtherFilesAreClearErrors) {
  EXPECT_EQ(load_error(file_with({}, 1000)), ErrorCode::kUnsupported);  // far past the current version
  EXPECT_EQ(load_error(file_with({}, 0)), ErrorCode::kCorruptFile);
  const std::vector<uint8_t> gguf = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  EXPECT_EQ(load_error(gguf), ErrorCode::kCorruptFile);
}

// A config that the cache's own constructor rejects is a corrupt file.
TEST(CacheFile, InvalidSavedConfigIsAnError) {
  AnchorKVCache c;
  feed(c, 1, 1, 64, 8, 1);
  auto bytes = serialize_caches({&c});
  LoadedCaches ok = load_caches_from_memory(bytes.data(), bytes.size());
  // theta is the first config field after the class name: make it 2.0 and fix the checksum.
  const std::string cls = "anchorkv::AnchorKVCache";
  const size_t layer = 32 + 24 + 24 + 24;  // header, META header, empty META payload, LAYR header
  const size_t theta_at = layer + 8 + cls.size();
  const double two = 2.0;
  std::memcpy(&bytes[theta_at], &two, 8);
  const uint64_t sum = XXH64(&bytes[layer], bytes.size() - layer, 0);
  std::memcpy(&bytes[layer - 8], &sum, 8);
  EXPECT_EQ(load_error(bytes), ErrorCode::kCorruptFile);
}

}  // namespace
}  // namespace anchorkv

namespace anchorkv {
namespace {

// What a loader must refuse in a compressed row, each defect alone (the
// checksum cannot catch a file crafted with valid checksums).
TEST(CacheFile, CheckRowRefusesEveryInconsistency) {
  for (MetadataLayout layout : {MetadataLayout::kSeed, MetadataLayout::kCompact, MetadataLayout::kTight}) {
    AnchorKVConfig cfg;
    cfg.metadata = layout;
    cfg.theta = 0.3;
    AnchorKVCache c(cfg);
    feed(c, 1, 1, 256, 16, 3);
    const compress::CompressedRow good = internal::unlocked_state(c).segments.front().rows[0];
    const int64_t D = 16, cb = compress::residual_bytes(D, cfg.residual_bits) - 2;
    ASSERT_EQ(compress::check_row(good, D, cb), "");
    ASSERT_GT(good.k.n_residual(), 0);
    std::vector<std::function<void(compress::CompressedRow&)>> defects = {
        [](auto& r) { r.n_anchor = r.length + 1; },
        [](auto& r) { r.anchor_k.pop_back(); },
        [](auto& r) { r.k.scales.pop_back(); },
        [](auto& r) { r.v.codes.push_back(0); },
        [&](auto& r) {  // an anchor ordinal past the anchors
          compress::Meta m = r.meta_at(3);
          m.anchor_k = static_cast<int32_t>(r.n_anchor);
          if (r.layout == MetadataLayout::kTight)
            r.meta16[3] = compress::pack_meta16(m);
          else if (r.lists_positions())
            r.meta32[3] = compress::pack_meta32(m);
          else
            r.meta[3] = compress::pack_meta(m);
        },
        [](auto& r) {  // coefficients of another layout's size
          if (r.layout == MetadataLayout::kTight)
            r.k.coef8.pop_back();
          else if (r.lists_positions())
            r.v.coef16.push_back(0);
          else
            r.k.coef.pop_back();
        },
        [](auto& r) {  // the buffers of another layout
          r.layout = r.layout == MetadataLayout::kCompact ? MetadataLayout::kTight : MetadataLayout::kCompact;
        },
        [&](auto& r) {  // positions out of order
          if (r.lists_positions()) {
            r.anchor_pos[1] = r.anchor_pos[0];
          } else {
            compress::Meta m = compress::unpack_meta(r.meta[0]);
            m.anchors_before = static_cast<int32_t>(r.n_anchor + 1);
            r.meta[0] = compress::pack_meta(m);
          }
        },
    };
    for (size_t i = 0; i < defects.size(); ++i) {
      compress::CompressedRow bad = good;
      defects[i](bad);
      EXPECT_NE(compress::check_row(bad, D, cb), "") << "defect " << i << " in layout " << to_string(layout);
    }
  }
}

}  // namespace
}  // namespace anchorkv
