// Prompt caches for the runtime: a model's caches after a prompt, saved with
// what is needed to trust them later (the model's identity, how keys were
// stored, the cache spec) and reused when a later prompt starts with the same
// tokens. File format: docs/cachefile.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/llama.h"

namespace anchorkv::runtime {

// Architecture, dimensions and an xxHash64 of everything the file holds: a
// GGUF's metadata (the tokenizer with it), tensor infos and tensor bytes; a
// llama2.c checkpoint's bytes.
std::string model_identity(const std::string& model_path, const model::LlamaWeights& w);
std::string model_identity(const io::GgufFile& file, const model::LlamaWeights& w);

// What a prompt-cache file is written for and trusted for.
struct PromptCacheKey {
  std::string identity, spec;  // model_identity(), cache spec
  double theta = 0;
};
// The metadata entries a file written for `key` by `m` holds.
std::map<std::string, std::string> key_entries(const PromptCacheKey& key, const model::LlamaModel& m);
// theta as files record it: the shortest text that reads back as the same double.
std::string theta_string(double theta);
// "" when a file's metadata entries were written for `key`, else why not.
std::string key_mismatch(const std::map<std::string, std::string>& entries, const PromptCacheKey& key);
// `m`'s caches as a cache file covering `tokens` (with the logits after them).
std::vector<uint8_t> prompt_file(const PromptCacheKey& key, const model::LlamaModel& m, std::vector<int32_t> tokens,
                                 std::vector<float> logits);

// Restoring `m` from cache-file bytes for a prompt: used when the bytes were
// written for `key`, parse and validate, cover a prefix of `prompt` (when they
// cover all of it, with the logits of its next token) and fit the model's
// layers. Otherwise `m` is unchanged and the outcome says why: kDamaged for
// bytes no prompt can use (corrupt, foreign, inconsistent: a pool drops such
// an entry), kNotPrefix and kNoLogits for bytes that are fine but not for this
// prompt.
enum class Restore : uint8_t { kUsed, kDamaged, kNotPrefix, kNoLogits };
struct Restored {
  Restore outcome = Restore::kDamaged;
  std::string why_not;          // when not used
  int64_t tokens = 0;           // positions restored
  std::vector<float> logits;    // after the last restored token (empty or vocab values)
};
Restored restore_prompt(const uint8_t* data, size_t size, const std::string& name, const PromptCacheKey& key,
                        const std::vector<int32_t>& prompt, model::LlamaModel& m);

struct PromptCacheHit {
  bool used = false;        // the file's caches are now the model's
  std::string why_not;      // when not used: the reason, for the user
  int64_t tokens = 0;       // positions restored
  std::vector<float> logits;  // after the last restored token (may be empty)
  double load_s = 0;
  int64_t file_bytes = 0;
};

// Restores `m` from `path` when the file exists, was written for the same
// model, cache spec and theta, and its tokens are a prefix of `prompt`.
// A missing, foreign or damaged file is not an error: it is reported in
// why_not and `m` is unchanged.
PromptCacheHit try_restore(const std::string& path, const std::string& identity, const std::string& spec, double theta,
                           const std::vector<int32_t>& prompt, model::LlamaModel& m);

// Saves `m`'s caches, covering `tokens`, atomically. Returns the bytes written.
int64_t save_prompt(const std::string& path, const std::string& identity, const std::string& spec, double theta,
                    const std::vector<int32_t>& tokens, const std::vector<float>& logits, const model::LlamaModel& m);

// Prefill of `prompt` through a prompt cache file: restored when try_restore
// allows, only the rest run through the model, and the file (re)written
// whenever tokens were prefilled.
struct CachedPrefill {
  std::vector<float> logits;  // after the prompt's last token
  PromptCacheHit hit;
  double forward_s = 0;       // of the forward pass only
  int64_t prefilled = 0;      // tokens run through the model
  int64_t saved_bytes = 0;    // 0 when the file was not written
  double save_s = 0;
};
CachedPrefill prefill_through(const std::string& path, const std::string& identity, const std::string& spec,
                              double theta, const std::vector<int32_t>& prompt, model::LlamaModel& m);

// The file for one (spec, theta) under `stem`: "<stem>-<spec>-<theta>.akvc" (':' -> '_').
std::string prompt_cache_path(const std::string& stem, const std::string& spec, double theta);

}  // namespace anchorkv::runtime
