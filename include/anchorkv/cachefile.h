// Prompt caches on disk: every layer's cache of a model in one file, written
// as stored (compressed caches stay compressed), with the token ids it covers
// and free-form metadata. Format: docs/cachefile.md.
//
// save_caches writes atomically (a temporary file in the same folder, fsync,
// rename): a crash mid-save leaves the previous file intact, and it replaces
// only a cache file (a device, FIFO, folder or other file at the path is an
// error, kIo). load_caches opens regular files only, maps
// the file, checks every section's xxHash64 and every size, offset and count
// before allocating, and returns new caches equal bit for bit to the saved
// ones; on any error it throws anchorkv::Error (kCorruptFile, kUnsupported for
// a newer format version, kIo) naming the file, the section and the field.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "anchorkv/cache.h"

namespace anchorkv {

// The first bytes of every cache file.
inline constexpr std::string_view kCacheFileMagic = "AKVCACHE";

struct PromptCacheMeta {
  std::vector<int32_t> tokens;                  // token ids the caches cover, in order
  std::vector<float> logits;                    // optional: logits after the last token
  std::map<std::string, std::string> entries;  // free-form (model identity, key storage, ...)
};

struct LoadedCaches {
  std::vector<std::unique_ptr<KVCache>> caches;  // one per saved layer, of the saved class and config
  PromptCacheMeta meta;
};

// Every cache is read under its reader lock (one at a time).
void save_caches(const std::string& path, const std::vector<const KVCache*>& caches,
                 const PromptCacheMeta& meta = {});
LoadedCaches load_caches(const std::string& path);
// The same from bytes in memory (`name` appears in errors).
LoadedCaches load_caches_from_memory(const uint8_t* data, size_t size, const std::string& name = "<memory>");
// The file's bytes as save_caches writes them.
std::vector<uint8_t> serialize_caches(const std::vector<const KVCache*>& caches, const PromptCacheMeta& meta = {});

}  // namespace anchorkv
