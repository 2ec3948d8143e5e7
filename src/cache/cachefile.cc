// The cache file (docs/cachefile.md): a checksummed header, a META section
// (token ids, logits, metadata), then one LAYR section per cache, each
// holding the cache's class, config, shape and stored state.
#include "anchorkv/cachefile.h"

#include <cstring>

#include "cache/core.h"
#include "cache/serial.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace anchorkv {
namespace {

// 2: AnchorKV configs end with u8 anchor_count; 3: segment rows carry their layout
// (tight metadata); 4: AnchorKV configs end with key_rope. Older files still load.
constexpr uint32_t kVersion = 7;
constexpr size_t kHeaderBytes = 32, kSectionHeaderBytes = 24;
constexpr uint64_t kMaxLayers = 1 << 16;
constexpr const char* kLoadOp = "anchorkv::load_caches";
constexpr const char* kSaveOp = "anchorkv::save_caches";

uint64_t hash(const uint8_t* p, size_t n) { return XXH64(p, n, 0); }

// False only in the fuzz build (CMake: ANCHORKV_BUILD_FUZZ), which must reach
// the structural checks behind the checksums.
bool checksum_ok(uint64_t stored, const uint8_t* p, size_t n) {
#ifdef ANCHORKV_FUZZING_SKIP_CHECKSUMS
  (void)stored, (void)p, (void)n;
  return true;
#else
  return stored == hash(p, n);
#endif
}

void put_section(cache::ByteWriter& file, const char (&tag)[5], const std::vector<uint8_t>& payload) {
  for (int i = 0; i < 4; ++i) file.put<char>(tag[i]);
  file.put<uint32_t>(0);
  file.put<uint64_t>(payload.size());
  file.put<uint64_t>(hash(payload.data(), payload.size()));
  file.bytes().insert(file.bytes().end(), payload.begin(), payload.end());
}

std::vector<uint8_t> meta_payload(const PromptCacheMeta& meta) {
  cache::ByteWriter w;
  w.array(meta.tokens);
  w.array(meta.logits);
  w.put<uint64_t>(meta.entries.size());
  for (const auto& [k, v] : meta.entries) {
    w.str(k);
    w.str(v);
  }
  return std::move(w.bytes());
}

std::vector<uint8_t> layer_payload(const KVCache& cache) {
  const auto locked = internal::CacheAccess::read(cache);
  const internal::CacheShape& s = locked.shape;
  cache::ByteWriter w;
  w.str(locked.store.api_name());
  locked.store.save_config(w);
  w.put<uint8_t>(s.known);
  for (int64_t x : {s.B, s.H, s.D, s.seen}) w.put<int64_t>(x);
  locked.store.save_state(w, s);
  return std::move(w.bytes());
}

// ---------------------------------------------------------------- reading

PromptCacheMeta read_meta(cache::ByteReader& r) {
  PromptCacheMeta m;
  m.tokens = r.array_any<int32_t>("tokens");
  m.logits = r.floats_any("logits");
  const uint64_t n = r.get<uint64_t>("entries");
  if (n > r.left() / 16) r.fail("entries", std::to_string(n) + " entries do not fit in the section");
  for (uint64_t i = 0; i < n; ++i) {
    std::string k = r.str("entries.key");
    std::string v = r.str("entries.value", uint64_t{1} << 24);
    if (!m.entries.empty() && k <= m.entries.rbegin()->first) r.fail("entries.key", "keys must ascend without repeats");
    m.entries.emplace(std::move(k), std::move(v));
  }
  r.expect_end("entries");
  return m;
}

std::unique_ptr<KVCache> cache_from_config(cache::ByteReader& r, const std::string& api_name) {
  using namespace internal;
  if (api_name == "anchorkv::FullKVCache") return full_cache_from_config(r);
  if (api_name == "anchorkv::AnchorKVCache") return anchorkv_cache_from_config(r);
  if (api_name == "anchorkv::QuantizedKVCache") return quantized_cache_from_config(r);
  if (api_name == "anchorkv::KIVICache") return kivi_cache_from_config(r);
  if (api_name == "anchorkv::TurboQuantCache") return turboquant_cache_from_config(r);
  if (api_name == "anchorkv::StreamingLLMCache") return streamingllm_cache_from_config(r);
  if (api_name == "anchorkv::SnapKVCache") return snapkv_cache_from_config(r);
  if (api_name == "anchorkv::H2OCache") return h2o_cache_from_config(r);
  if (api_name == "anchorkv::SlidingWindowKVCache") return window_cache_from_config(r);
  r.fail("class", "unknown cache class '" + api_name + "'");
}

internal::CacheShape read_shape(cache::ByteReader& r) {
  internal::CacheShape s;
  s.known = r.flag("shape.known");
  s.B = r.get<int64_t>("shape.B");
  s.H = r.get<int64_t>("shape.H");
  s.D = r.get<int64_t>("shape.D");
  s.seen = r.get<int64_t>("shape.seen");
  if (!s.known && (s.B | s.H | s.D | s.seen) != 0) r.fail("shape", "an empty cache with a shape");
  if (s.known && (s.B < 1 || s.H < 1 || s.D < 1 || s.B > (1 << 20) || s.H > (1 << 20) || s.B * s.H > (1 << 20) ||
                  s.D > (1 << 16) || s.seen < 0 || s.seen > (int64_t{1} << 40)))
    r.fail("shape", "B, H, D or the token count is out of range");
  return s;
}

std::unique_ptr<KVCache> read_layer(cache::ByteReader& r) {
  const std::string api_name = r.str("class", 256);
  std::unique_ptr<KVCache> cache = cache_from_config(r, api_name);
  const internal::CacheShape shape = read_shape(r);
  auto w = internal::CacheAccess::write(*cache);
  w.store.load_state(r, shape);
  r.expect_end("state");
  w.shape = shape;
  return cache;
}

struct SectionHeader {
  std::string tag;
  uint64_t length = 0, checksum = 0;
};

}  // namespace

std::vector<uint8_t> serialize_caches(const std::vector<const KVCache*>& caches, const PromptCacheMeta& meta) {
  if (caches.size() > kMaxLayers) core::fail(ErrorCode::kInvalidArgument, kSaveOp, "too many caches");
  cache::ByteWriter file;
  for (char c : kCacheFileMagic) file.put<char>(c);
  file.put<uint32_t>(kVersion);
  file.put<uint32_t>(static_cast<uint32_t>(1 + caches.size()));
  file.put<uint64_t>(0);
  file.put<uint64_t>(hash(file.bytes().data(), file.bytes().size()));
  put_section(file, "META", meta_payload(meta));
  for (const KVCache* c : caches) {
    if (!c) core::fail(ErrorCode::kInvalidArgument, kSaveOp, "a null cache");
    put_section(file, "LAYR", layer_payload(*c));
  }
  return std::move(file.bytes());
}

LoadedCaches load_caches_from_memory(const uint8_t* data, size_t size, const std::string& name) {
  const std::string file = "'" + name + "'";
  cache::ByteReader header(data, size, kLoadOp, file + ", header");
  if (size < kHeaderBytes || std::memcmp(data, kCacheFileMagic.data(), kCacheFileMagic.size()) != 0) header.fail("magic", "not an anchorkv cache file");
  for (int i = 0; i < 8; ++i) header.get<char>("magic");
  const uint32_t version = header.get<uint32_t>("version");
  const uint32_t n_sections = header.get<uint32_t>("sections");
  if (header.get<uint64_t>("reserved") != 0) header.fail("reserved", "must be 0");
  if (!checksum_ok(header.get<uint64_t>("checksum"), data, 24)) header.fail("checksum", "xxHash64 mismatch");
  if (version > kVersion)
    core::fail(ErrorCode::kUnsupported, kLoadOp,
               file + " was written by a newer version (format " + std::to_string(version) + "; this build reads " +
                   std::to_string(kVersion) + ")");
  if (version < 1) header.fail("version", "unknown format version " + std::to_string(version));
  if (n_sections < 1 || n_sections > 1 + kMaxLayers) header.fail("sections", "count out of range");

  LoadedCaches out;
  size_t at = kHeaderBytes;
  for (uint32_t i = 0; i < n_sections; ++i) {
    const std::string where = file + ", section " + std::to_string(i) + (i == 0 ? " (META)" : " (layer " + std::to_string(i - 1) + ")");
    cache::ByteReader sh(data + at, size - at, kLoadOp, where);
    SectionHeader h;
    for (int c = 0; c < 4; ++c) h.tag += sh.get<char>("tag");
    if (sh.get<uint32_t>("reserved") != 0) sh.fail("reserved", "must be 0");
    h.length = sh.get<uint64_t>("length");
    h.checksum = sh.get<uint64_t>("checksum");
    if (h.tag != (i == 0 ? "META" : "LAYR")) sh.fail("tag", "expected " + std::string(i == 0 ? "META" : "LAYR"));
    if (h.length > sh.left()) sh.fail("length", "the section runs past the end of the file");
    const uint8_t* payload = data + at + kSectionHeaderBytes;
    if (!checksum_ok(h.checksum, payload, static_cast<size_t>(h.length))) sh.fail("checksum", "xxHash64 mismatch");
    cache::ByteReader r(payload, static_cast<size_t>(h.length), kLoadOp, where);
    r.set_format_version(version);
    if (i == 0)
      out.meta = read_meta(r);
    else
      out.caches.push_back(read_layer(r));
    at += kSectionHeaderBytes + static_cast<size_t>(h.length);
  }
  if (at != size) header.fail("sections", std::to_string(size - at) + " bytes after the last section");
  return out;
}

LoadedCaches load_caches(const std::string& path) {
  const core::MappedFile f = core::MappedFile::open(path, kLoadOp);
  return load_caches_from_memory(f.data(), f.size(), path);
}

void save_caches(const std::string& path, const std::vector<const KVCache*>& caches, const PromptCacheMeta& meta) {
  core::write_file_atomically(path, serialize_caches(caches, meta), kSaveOp, kCacheFileMagic);
}

}  // namespace anchorkv
