#include "runtime/prefix_chain.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "cache/segment_chain.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace anchorkv::runtime {
namespace {

constexpr const char* kRootTag = "anchorkv prefix chain 1";

void put_u64(std::vector<uint8_t>& b, uint64_t x) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(x >> (8 * i)));
}

std::string hex(uint64_t x) {
  char s[20];
  std::snprintf(s, sizeof s, "%016" PRIx64, x);
  return s;
}

// The chain entries of a block file's metadata (nothing when absent or malformed).
std::optional<BlockInfo> stated_info(const PromptCacheMeta& meta) {
  auto entry = [&](const char* k) { return meta.entries.count(k) ? meta.entries.at(k) : std::string(); };
  const std::string key = entry("chain.key"), parent = entry("chain.parent"), first = entry("chain.first");
  auto parse_hex = [](const std::string& s, uint64_t& out) {
    if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
    out = std::strtoull(s.c_str(), nullptr, 16);
    return true;
  };
  BlockInfo info;
  if (!parse_hex(key, info.key) || !parse_hex(parent, info.parent)) return std::nullopt;
  if (first.empty() || first.size() > 18 || first.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  info.first = std::strtoll(first.c_str(), nullptr, 10);
  if (meta.tokens.empty()) return std::nullopt;
  info.tokens = meta.tokens;
  return info;
}

// "" when `info` is a block of `key`'s chains as its key says, else why not.
std::string inconsistency(const BlockInfo& info, const PromptCacheKey& key) {
  if (info.first == 0 && info.parent != chain_root(key))
    return "a first block whose parent is not the chain's root";
  if (chain_key(info.parent, info.tokens.data(), info.tokens.size()) != info.key)
    return "its key is not the hash of its parent and tokens";
  return "";
}

// Segment lengths every cache of `m` shares ({} when some cache is not cut into segments).
std::vector<int64_t> shared_segment_lengths(const model::LlamaModel& m) {
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < m.caches().size(); ++i) {
    std::vector<int64_t> l = internal::segment_lengths(*m.caches()[i]);
    if (l.empty() || (i > 0 && l != lengths)) return {};
    lengths = std::move(l);
  }
  return lengths;
}

std::vector<uint8_t> block_bytes(const PromptCacheKey& key, const model::LlamaModel& m,
                                 const std::vector<const KVCache*>& caches, const BlockInfo& info,
                                 std::vector<float> logits) {
  PromptCacheMeta meta{info.tokens, std::move(logits), key_entries(key, m)};
  meta.entries["chain.key"] = hex(info.key);
  meta.entries["chain.parent"] = hex(info.parent);
  meta.entries["chain.first"] = std::to_string(info.first);
  return serialize_caches(caches, meta);
}

}  // namespace

uint64_t chain_root(const PromptCacheKey& key) {
  std::string s = kRootTag;
  for (const std::string& part : {key.identity, key.spec, theta_string(key.theta)}) {
    s.push_back('\0');
    s += part;
  }
  return XXH64(s.data(), s.size(), 0);
}

uint64_t chain_key(uint64_t parent, const int32_t* tokens, size_t n) {
  std::vector<uint8_t> b;
  b.reserve(8 + 4 * n);
  put_u64(b, parent);
  for (size_t i = 0; i < n; ++i)
    for (int k = 0; k < 4; ++k)
      b.push_back(static_cast<uint8_t>(static_cast<uint32_t>(tokens[i]) >> (8 * k)));
  return XXH64(b.data(), b.size(), 0);
}

std::vector<uint64_t> chain_keys(uint64_t parent, const int32_t* tokens, const std::vector<size_t>& lengths) {
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  std::vector<uint8_t> b;
  put_u64(b, parent);
  XXH64_update(&state, b.data(), b.size());
  std::vector<uint64_t> out;
  size_t done = 0;
  for (size_t n : lengths) {
    if (n < done) {  // out of order: on its own
      out.push_back(chain_key(parent, tokens, n));
      continue;
    }
    b.clear();
    for (; done < n; ++done)
      for (int k = 0; k < 4; ++k)
        b.push_back(static_cast<uint8_t>(static_cast<uint32_t>(tokens[done]) >> (8 * k)));
    XXH64_update(&state, b.data(), b.size());
    out.push_back(XXH64_digest(&state));
  }
  return out;
}

std::vector<ChainBlock> chain_blocks(const PromptCacheKey& key, const model::LlamaModel& m,
                                     const std::vector<int32_t>& tokens, ChainEnd from,
                                     const std::vector<float>& logits) {
  const std::vector<int64_t> lengths = shared_segment_lengths(m);
  size_t next = 0;  // the first segment past `from`
  int64_t pos = 0, total = 0;
  for (int64_t l : lengths) total += l;
  bool cut = !lengths.empty() && total == static_cast<int64_t>(tokens.size());
  while (cut && pos < from.tokens && next < lengths.size()) pos += lengths[next++];
  cut = cut && pos == from.tokens && next < lengths.size();
  std::vector<ChainBlock> out;
  if (!cut) {  // one block of the whole prompt, from the root
    BlockInfo info{0, chain_root(key), 0, tokens};
    info.key = chain_key(info.parent, tokens.data(), tokens.size());
    std::vector<const KVCache*> caches;
    for (const auto& c : m.caches()) caches.push_back(c.get());
    std::vector<uint8_t> file = block_bytes(key, m, caches, info, logits);
    out.push_back({std::move(info), std::move(file)});
    return out;
  }
  uint64_t parent = from.tokens == 0 ? chain_root(key) : from.key;
  for (size_t s = next; s < lengths.size(); ++s) {
    const int64_t end = pos + lengths[s];
    BlockInfo info{chain_key(parent, tokens.data() + pos, static_cast<size_t>(lengths[s])), parent, pos,
                   std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + end)};
    std::vector<std::unique_ptr<KVCache>> own;
    std::vector<const KVCache*> caches;
    for (const auto& c : m.caches()) {
      own.push_back(internal::copy_segments(*c, s, s + 1));
      caches.push_back(own.back().get());
    }
    std::vector<uint8_t> file =
        block_bytes(key, m, caches, info, s + 1 == lengths.size() ? logits : std::vector<float>());
    parent = info.key;
    pos = end;
    out.push_back({std::move(info), std::move(file)});
  }
  return out;
}

size_t max_block_bytes(const model::LlamaConfig& c) {
  const auto context = static_cast<size_t>(c.context > 0 ? c.context : int64_t{1} << 17);
  const auto per_token = static_cast<size_t>(std::max<int64_t>(1, c.n_layers) * std::max<int64_t>(1, c.n_kv_heads) *
                                             std::max<int64_t>(1, c.head_dim)) * 2 * sizeof(float) + sizeof(int32_t);
  return context * per_token + static_cast<size_t>(std::max<int64_t>(0, c.vocab)) * sizeof(float) + (size_t{1} << 20);
}

std::optional<BlockInfo> block_info(const uint8_t* data, size_t size, const std::string& name,
                                    const PromptCacheKey& key) {
  try {
    const LoadedCaches l = load_caches_from_memory(data, size, name);
    if (!key_mismatch(l.meta.entries, key).empty()) return std::nullopt;
    std::optional<BlockInfo> info = stated_info(l.meta);
    if (info && inconsistency(*info, key).empty()) return info;
  } catch (const Error&) {
  }
  return std::nullopt;
}

ChainRestored restore_chain(const std::vector<HeldBlock>& chain, const PromptCacheKey& key,
                            const std::vector<int32_t>& prompt, model::LlamaModel& m) {
  ChainRestored out;
  Restored& r = out.restored;
  auto fail = [&](size_t block, std::string why, Restore outcome = Restore::kDamaged) {
    out.bad_block = block;
    r.outcome = outcome;
    r.why_not = "block " + std::to_string(block) + ": " + std::move(why);
    return out;
  };
  if (chain.empty()) return fail(0, "an empty chain");
  std::vector<std::unique_ptr<KVCache>> caches;
  std::vector<float> logits;
  uint64_t parent = chain_root(key);
  int64_t end = 0;
  for (size_t i = 0; i < chain.size(); ++i) {
    const HeldBlock& b = chain[i];
    LoadedCaches l;
    try {
      l = load_caches_from_memory(b.file->data(), b.file->size(), "prefix block");
    } catch (const Error& e) {
      return fail(i, e.what());
    }
    if (std::string why = key_mismatch(l.meta.entries, key); !why.empty()) return fail(i, why);
    const std::optional<BlockInfo> info = stated_info(l.meta);
    if (!info) return fail(i, "no chain entries");
    if (std::string why = inconsistency(*info, key); !why.empty()) return fail(i, why);
    if (info->key != b.info.key || info->tokens != b.info.tokens || info->first != end ||
        info->parent != parent)
      return fail(i, "not the block the chain links here");
    if (!info->matches(prompt))
      return fail(i, "its tokens are not the prompt's at its positions", Restore::kNotPrefix);
    for (const auto& c : l.caches)
      if (c->offset() != static_cast<int64_t>(info->tokens.size()))
        return fail(i, "its caches hold " + std::to_string(c->offset()) + " positions for " +
                           std::to_string(info->tokens.size()) + " tokens");
    try {
      if (i == 0) {
        caches = std::move(l.caches);
      } else {
        if (l.caches.size() != caches.size()) return fail(i, "another number of layers");
        for (size_t c = 0; c < caches.size(); ++c) internal::append_segments(*caches[c], *l.caches[c]);
      }
    } catch (const Error& e) {
      return fail(i, e.what());
    }
    parent = info->key;
    end = info->end();
    logits = std::move(l.meta.logits);
  }
  if (!logits.empty() && static_cast<int64_t>(logits.size()) != m.config().vocab)
    return fail(chain.size() - 1, "it holds " + std::to_string(logits.size()) +
                                      " logits for a vocabulary of " + std::to_string(m.config().vocab));
  if (end == static_cast<int64_t>(prompt.size()) && logits.empty())
    return fail(chain.size() - 1, "it covers the whole prompt but holds no logits for the next token",
                Restore::kNoLogits);
  try {
    m.restore(std::move(caches), end);
  } catch (const Error& e) {
    return fail(0, e.what());
  }
  r.outcome = Restore::kUsed;
  r.why_not.clear();
  r.tokens = end;
  r.logits = std::move(logits);
  return out;
}

}  // namespace anchorkv::runtime
