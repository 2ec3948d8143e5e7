#include "runtime/prompt_cache.h"

#include <charconv>
#include <chrono>
#include <filesystem>
#include <sstream>

#include "anchorkv/cachefile.h"
#include "anchorkv/status.h"
#include "core/atomic_file.h"
#include "core/mapped_file.h"
#include "io/gguf.h"
#include "runtime/session.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace anchorkv::runtime {
namespace {

using Clock = std::chrono::steady_clock;

void hash_value(XXH64_state_t* h, const io::GgufValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) {
    XXH64_update(h, s->data(), s->size());
  } else if (const auto* a = std::get_if<std::shared_ptr<io::GgufArray>>(&v)) {
    for (const auto& item : (*a)->items) hash_value(h, item);
  } else {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_arithmetic_v<T>) XXH64_update(h, &x, sizeof(x));
        },
        v);
  }
}

// Metadata (with the tokenizer's vocabulary and merges), tensor infos and the
// tensors' bytes: two files that differ in any weight (two fine-tunes of one
// shape) never share an identity.
uint64_t gguf_hash(const io::GgufFile& f) {
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  for (const auto& [key, value] : f.metadata()) {
    XXH64_update(h, key.data(), key.size());
    hash_value(h, value);
  }
  for (const io::GgufTensor& t : f.tensors()) {
    XXH64_update(h, t.name.data(), t.name.size());
    XXH64_update(h, &t.type, sizeof(t.type));
    XXH64_update(h, t.dims.data(), t.dims.size() * sizeof(int64_t));
    XXH64_update(h, t.data, static_cast<size_t>(t.n_bytes));
  }
  const uint64_t out = XXH64_digest(h);
  XXH64_freeState(h);
  return out;
}

std::string identity_string(const model::LlamaWeights& w, uint64_t h) {
  const auto& c = w.config;
  std::ostringstream os;
  os << (c.architecture.empty() ? "llama" : c.architecture) << " layers=" << c.n_layers << " dim=" << c.dim
     << " heads=" << c.n_heads << "/" << c.n_kv_heads << " head_dim=" << c.head_dim << " vocab=" << c.vocab
     << " rope_base=" << c.rope.base << " hash=" << std::hex << h;
  return os.str();
}

}  // namespace

// The shortest text that reads back as the same double: 0.05 stays "0.05",
// and two θ that differ in any bit differ here (an ostream's 6 significant
// digits made 0.05 and 0.0500001 one cache and one store namespace).
std::string theta_string(double theta) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, theta);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

std::string model_identity(const io::GgufFile& f, const model::LlamaWeights& w) {
  return identity_string(w, gguf_hash(f));
}

std::string model_identity(const std::string& model_path, const model::LlamaWeights& w) {
  const bool gguf = model_path.size() >= 5 && model_path.compare(model_path.size() - 5, 5, ".gguf") == 0;
  if (gguf) return model_identity(io::GgufFile::open(model_path), w);
  // llama2.c: the header is the config, the bytes are the weights.
  const core::MappedFile f = core::MappedFile::open(model_path, "anchorkv::model_identity");
  return identity_string(w, XXH64(f.data(), f.size(), 0));
}

Restored restore_prompt(const uint8_t* data, size_t size, const std::string& name, const PromptCacheKey& key,
                        const std::vector<int32_t>& prompt, model::LlamaModel& m) {
  Restored out;
  LoadedCaches l;
  try {
    l = load_caches_from_memory(data, size, name);
  } catch (const Error& e) {
    out.why_not = e.what();
    return out;
  }
  const std::vector<int32_t>& toks = l.meta.tokens;
  out.why_not = key_mismatch(l.meta.entries, key);
  if (out.why_not.empty() && toks.empty()) out.why_not = "it covers no tokens";
  if (out.why_not.empty() && !l.meta.logits.empty() && static_cast<int64_t>(l.meta.logits.size()) != m.config().vocab)
    out.why_not = "it holds " + std::to_string(l.meta.logits.size()) + " logits for a vocabulary of " +
                  std::to_string(m.config().vocab);
  if (!out.why_not.empty()) return out;
  if (toks.size() > prompt.size() || !std::equal(toks.begin(), toks.end(), prompt.begin())) {
    out.outcome = Restore::kNotPrefix;
    out.why_not = "its " + std::to_string(toks.size()) + " tokens are not a prefix of the prompt";
    return out;
  }
  if (toks.size() == prompt.size() && l.meta.logits.empty()) {
    out.outcome = Restore::kNoLogits;
    out.why_not = "it covers the whole prompt but holds no logits for the next token";
    return out;
  }
  try {
    m.restore(std::move(l.caches), static_cast<int64_t>(toks.size()));
  } catch (const Error& e) {
    out.why_not = e.what();
    return out;
  }
  out.outcome = Restore::kUsed;
  out.tokens = static_cast<int64_t>(toks.size());
  out.logits = std::move(l.meta.logits);
  return out;
}

PromptCacheHit try_restore(const std::string& path, const std::string& identity, const std::string& spec, double theta,
                           const std::vector<int32_t>& prompt, model::LlamaModel& m) {
  PromptCacheHit hit;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    hit.why_not = "no file yet";
    return hit;
  }
  const auto t0 = Clock::now();
  core::MappedFile f;
  try {
    f = core::MappedFile::open(path, "anchorkv::load_caches");
  } catch (const Error& e) {
    hit.why_not = e.what();
    return hit;
  }
  Restored r = restore_prompt(f.data(), f.size(), path, {identity, spec, theta}, prompt, m);
  if (r.outcome != Restore::kUsed) {
    hit.why_not = std::move(r.why_not);
    return hit;
  }
  hit.used = true;
  hit.tokens = r.tokens;
  hit.logits = std::move(r.logits);
  hit.load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  hit.file_bytes = static_cast<int64_t>(f.size());
  return hit;
}

std::string key_mismatch(const std::map<std::string, std::string>& entries, const PromptCacheKey& key) {
  auto entry = [&](const char* k) { return entries.count(k) ? entries.at(k) : std::string(); };
  if (entry("model") != key.identity) return "written for another model (" + entry("model") + ")";
  if (entry("cache") != key.spec || entry("theta") != theta_string(key.theta))
    return "written with cache " + entry("cache") + " theta " + entry("theta");
  return "";
}

std::map<std::string, std::string> key_entries(const PromptCacheKey& key, const model::LlamaModel& m) {
  return {{"model", key.identity},
          {"cache", key.spec},
          {"theta", theta_string(key.theta)},
          {"keys", m.keys() == model::KeyRope::kPreRope ? "pre" : "post"}};
}

std::vector<uint8_t> prompt_file(const PromptCacheKey& key, const model::LlamaModel& m, std::vector<int32_t> tokens,
                                 std::vector<float> logits) {
  PromptCacheMeta meta{std::move(tokens), std::move(logits), key_entries(key, m)};
  std::vector<const KVCache*> caches;
  for (const auto& c : m.caches()) caches.push_back(c.get());
  return serialize_caches(caches, meta);
}

int64_t save_prompt(const std::string& path, const std::string& identity, const std::string& spec, double theta,
                    const std::vector<int32_t>& tokens, const std::vector<float>& logits, const model::LlamaModel& m) {
  const std::vector<uint8_t> bytes = prompt_file({identity, spec, theta}, m, tokens, logits);
  core::write_file_atomically(path, bytes, "anchorkv::save_caches", kCacheFileMagic);
  return static_cast<int64_t>(bytes.size());
}

CachedPrefill prefill_through(const std::string& path, const std::string& identity, const std::string& spec,
                              double theta, const std::vector<int32_t>& prompt, model::LlamaModel& m) {
  CachedPrefill out;
  out.hit = try_restore(path, identity, spec, theta, prompt, m);
  if (out.hit.used && out.hit.tokens == static_cast<int64_t>(prompt.size())) {
    out.logits = std::move(out.hit.logits);
    return out;
  }
  auto t0 = Clock::now();
  out.logits = prefill_prompt(m, std::vector<int32_t>(prompt.begin() + out.hit.tokens, prompt.end()));
  out.forward_s = std::chrono::duration<double>(Clock::now() - t0).count();
  out.prefilled = static_cast<int64_t>(prompt.size()) - out.hit.tokens;
  t0 = Clock::now();
  out.saved_bytes = save_prompt(path, identity, spec, theta, prompt, out.logits, m);
  out.save_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

std::string prompt_cache_path(const std::string& stem, const std::string& spec, double theta) {
  std::ostringstream os;
  os << stem << "-" << spec << "-" << theta_string(theta) << ".akvc";
  std::string p = os.str();
  for (size_t i = stem.size(); i < p.size(); ++i)
    if (p[i] == ':') p[i] = '_';
  return p;
}

}  // namespace anchorkv::runtime
