// Prompt prefixes as chains of blocks (the server's pool, serve/prefix_pool.h,
// and any store that shares it). A block covers one run of a prompt's tokens
// and holds its caches as cache-file bytes: for a streaming AnchorKV cache
// that holds nothing exact, one compressed segment of every layer (so every
// segment boundary is a restore point and prompts that share a beginning
// share its segments); for any other cache, the whole prompt in one block.
//
// Keys are xxHash64 (seed 0, fixed across processes and machines) chained
// from a root of (model identity, cache spec, theta): a block's key hashes its
// parent's key and its own token ids, so a key names one exact token sequence
// under one model and cache. Keys are never trusted alone: restoring checks
// every block's token ids against the prompt and recomputes its key.
// Format of a block: docs/cachefile.md ("Prefix blocks").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "runtime/block_info.h"
#include "runtime/prompt_cache.h"

namespace anchorkv::runtime {

// The key every chain of `key` starts from (a first block's parent).
uint64_t chain_root(const PromptCacheKey& key);
// The key of the block after `parent` covering tokens [first, first + n).
uint64_t chain_key(uint64_t parent, const int32_t* tokens, size_t n);
// chain_key(parent, tokens, n) for every n of `lengths` (ascending), in one
// pass over the longest.
std::vector<uint64_t> chain_keys(uint64_t parent, const int32_t* tokens, const std::vector<size_t>& lengths);

struct ChainEnd {
  uint64_t key = 0;    // the last block's key (unused when tokens == 0: the chain starts at chain_root)
  int64_t tokens = 0;  // positions the chain covers
};

struct ChainBlock {
  BlockInfo info;
  std::vector<uint8_t> file;
};

// The blocks that pool `m`'s caches, which have run `tokens`, after the chain
// ending at `from` (whose blocks `m` was restored from): one per segment past
// it when every cache is cut into segments there, else one block of all of
// `tokens` from the root. The last block holds `logits` (after the last token).
std::vector<ChainBlock> chain_blocks(const PromptCacheKey& key, const model::LlamaModel& m,
                                     const std::vector<int32_t>& tokens, ChainEnd from,
                                     const std::vector<float>& logits);

// The most bytes a block of this model can take, whatever its cache: fp32
// keys and values of every position of the context, their token ids and the
// logits, and room for the file's headers. A reader of an untrusted store
// refuses a value past it before reading it.
size_t max_block_bytes(const model::LlamaConfig& config);

// What block-file bytes say they are, when they were written for `key` and
// are consistent (their key recomputed); nothing otherwise.
std::optional<BlockInfo> block_info(const uint8_t* data, size_t size, const std::string& name,
                                    const PromptCacheKey& key);

// Restores `m` from a chain (first block first) for `prompt`, as restore_prompt
// does for one file: every block is checked (written for `key`, the key the
// pool holds it under recomputed from its parent and token ids, linked to the
// block before it, its tokens `prompt`'s at its positions) and the caches of all of
// them joined. kDamaged names the first bad block in `bad_block`.
struct ChainRestored {
  Restored restored;
  size_t bad_block = 0;
};
ChainRestored restore_chain(const std::vector<HeldBlock>& chain, const PromptCacheKey& key,
                            const std::vector<int32_t>& prompt, model::LlamaModel& m);

}  // namespace anchorkv::runtime
