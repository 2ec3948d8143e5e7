// load_gguf: a Llama-family model's weights and hyperparameters from GGUF,
// with the tensor names and keys llama.cpp's converter writes. Every tensor
// of the file must be one this runtime applies, and every `{arch}.` key one
// it applies or knows to be harmless: anything else could change the
// arithmetic, so the file is refused with its name rather than run
// differently (docs/gguf.md lists what is supported, key by key).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "model/qmatmul.h"
#include "model/rope_scaling.h"

namespace anchorkv::model {
namespace {

constexpr const char* kLoad = "anchorkv::load_model";

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s = "[ ";
  for (auto d : dims) s += std::to_string(d) + " ";
  return s + "]";
}

// The file's tensors, each taken at most once; what is left at the end is
// what the runtime would have ignored.
class Tensors {
 public:
  Tensors(const io::GgufFile& f, std::string path) : f_(f), path_(std::move(path)) {}

  const io::GgufTensor* optional(const std::string& name, const std::vector<int64_t>& dims) {
    const io::GgufTensor* t = f_.find_tensor(name);
    if (!t) return nullptr;
    used_.insert(name);
    if (t->dims != dims)
      core::fail(ErrorCode::kCorruptFile, kLoad,
                 "tensor '" + name + "' has dims " + dims_string(t->dims) + ", expected " + dims_string(dims));
    if (!io::can_dequantize(t->type))
      core::fail(ErrorCode::kUnsupported, kLoad,
                 "tensor '" + name + "' has type " + io::ggml_type_name(t->type) +
                     ", which this runtime cannot read");
    return t;
  }
  const io::GgufTensor& required(const std::string& name, const std::vector<int64_t>& dims) {
    if (const io::GgufTensor* t = optional(name, dims)) return *t;
    return f_.tensor(name);  // throws, naming the missing tensor
  }
  // Every tensor was taken: none would be silently ignored.
  void check_all_used(const std::string& arch) const {
    for (const io::GgufTensor& t : f_.tensors())
      if (!used_.count(t.name))
        core::fail(ErrorCode::kUnsupported, kLoad,
                   "'" + path_ + "': tensor '" + t.name + "' is not supported for architecture '" + arch +
                       "' (running without it would give other results)");
  }

 private:
  const io::GgufFile& f_;
  std::string path_;
  std::set<std::string> used_;
};

// A vector (norm weights, biases) as f32.
std::vector<float> to_f32(const io::GgufTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  int64_t be = 0, bb = 0;
  io::ggml_block(t.type, &be, &bb);
  const int64_t row = t.dims[0], rows = t.n_elements / row, row_bytes = row / be * bb;
  for (int64_t r = 0; r < rows; ++r) io::dequantize_row(t.type, t.data + r * row_bytes, row, &out[r * row]);
  return out;
}

// Rows [r0, r0 + n) of a matrix GGUF stores with dims [cols, rows], kept in its type.
Weight weight_rows(const io::GgufTensor& t, int64_t r0, int64_t n) {
  Weight w;
  w.type = t.type;
  w.rows = n;
  w.cols = t.dims[0];
  const int64_t row_bytes = t.n_bytes / t.dims[1];
  const uint8_t* src = t.data + r0 * row_bytes;
  if (t.type == io::GgmlType::kF32) {
    w.f32.resize(static_cast<size_t>(n * w.cols));
    std::memcpy(w.f32.data(), src, static_cast<size_t>(n * row_bytes));
  } else if (rows16_supported(t.type)) {
    w.layout = QuantLayout::kRows16;
    w.blocks.resize(static_cast<size_t>(rows16_bytes(t.type, n, w.cols)));
    pack_rows16(t.type, src, n, w.cols, w.blocks.data());
  } else {
    w.blocks.assign(src, src + n * row_bytes);
  }
  return w;
}
Weight weight(const io::GgufTensor& t) { return weight_rows(t, 0, t.dims[1]); }

std::vector<float> slice(const std::vector<float>& v, int64_t at, int64_t n) {
  return {v.begin() + at, v.begin() + at + n};
}

// What differs between the supported architectures (llama.cpp's graphs of
// the same names).
struct Arch {
  RopeStyle rope_style = RopeStyle::kNeox;
  bool rope_freqs = false;      // rope_freqs.weight may scale the frequencies (Llama 3.1)
  bool ffn_and_o_bias = false;  // optional attn_output and FFN biases
  bool output_bias = false;     // optional output.bias
  bool qk_norm = false;         // per-head RMSNorm of Q and K before RoPE (attn_q_norm, attn_k_norm)
  bool post_norms = false;      // attn_post_norm and ffn_post_norm
  bool fused_gate_up = false;   // ffn_up holds gate then up rows: [dim, 2 hidden], no ffn_gate
  bool long_rope = false;       // rope_factors_long / rope_factors_short
  bool gemma = false;           // sqrt(dim) embedding scale, GeGLU, query scale, sliding windows
  std::set<std::string> keys;   // `{arch}.` keys of its own, beyond the common ones
};
const Arch* find_arch(const std::string& a) {
  static const Arch kLlama = [] {
    Arch x;
    x.rope_style = RopeStyle::kNormal;
    x.rope_freqs = x.ffn_and_o_bias = true;
    return x;
  }();
  static const Arch kQwen2 = [] {
    Arch x;
    x.output_bias = true;
    return x;
  }();
  static const Arch kQwen3 = [] {
    Arch x;
    x.qk_norm = true;
    return x;
  }();
  static const Arch kGemma3 = [] {
    Arch x;
    x.qk_norm = x.post_norms = x.gemma = true;
    x.keys = {"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa",
              "final_logit_softcapping"};
    return x;
  }();
  static const Arch kPhi3 = [] {
    Arch x;
    x.fused_gate_up = x.long_rope = true;
    x.keys = {"attention.sliding_window"};  // llama.cpp runs Phi-3 without its window; so does this
    return x;
  }();
  if (a == "llama" || a == "mistral") return &kLlama;
  if (a == "qwen2") return &kQwen2;
  if (a == "qwen3") return &kQwen3;
  if (a == "gemma3") return &kGemma3;
  if (a == "phi3") return &kPhi3;
  return nullptr;
}

// The `{arch}.` keys: those read here, and those known not to change the
// arithmetic. Any other is an error naming it.
void check_keys(const io::GgufFile& f, const std::string& a, const Arch& arch, const std::string& path) {
  static const std::set<std::string> kKnown = {
      "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
      "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
      "attention.layer_norm_rms_epsilon", "attention.causal", "rope.dimension_count", "rope.freq_base",
      "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear", "rope.scaling.original_context_length",
      "rope.scaling.attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
      "rope.scaling.finetuned", "expert_count", "expert_used_count"};
  const std::string prefix = a + ".";
  for (const auto& [key, value] : f.metadata()) {
    if (key.rfind(prefix, 0) != 0) continue;
    if (!kKnown.count(key.substr(prefix.size())) && !arch.keys.count(key.substr(prefix.size())))
      core::fail(ErrorCode::kUnsupported, kLoad,
                 "'" + path + "': key '" + key + "' is not supported (running without it could give other results)");
  }
  for (const char* k : {"expert_count", "expert_used_count"})
    if (f.has(prefix + k) && f.get_uint(prefix + k) != 0)
      core::fail(ErrorCode::kUnsupported, kLoad, "'" + path + "': mixture-of-experts models are not supported");
  if (f.has(prefix + "attention.causal") && !std::get<bool>(f.metadata().at(prefix + "attention.causal")))
    core::fail(ErrorCode::kUnsupported, kLoad, "'" + path + "': non-causal attention is not supported");
  if (f.has("general.type") && f.get_string("general.type") != "model")
    core::fail(ErrorCode::kUnsupported, kLoad,
               "'" + path + "': general.type '" + f.get_string("general.type") + "' is not a model");
  if (f.has("split.count") && f.get_uint("split.count") > 1)
    core::fail(ErrorCode::kUnsupported, kLoad, "'" + path + "': split GGUF files are not supported (merge them)");
}

RopeScaling read_rope_scaling(const io::GgufFile& f, const std::string& a, const LlamaConfig& c,
                              const std::string& path) {
  RopeScaling s;
  const std::string k = a + ".rope.scaling.";
  double factor = 0.0;
  if (f.has(k + "factor"))
    factor = f.get_float(k + "factor");
  else if (f.has(a + ".rope.scale_linear"))
    factor = f.get_float(a + ".rope.scale_linear");
  // llama.cpp's default type is linear: a factor without a type stretches positions.
  const std::string type = f.has(k + "type") ? f.get_string(k + "type") : "linear";
  if (type == "none")
    s.type = RopeScalingType::kNone;
  else if (type == "linear")
    s.type = factor != 0.0 ? RopeScalingType::kLinear : RopeScalingType::kNone;
  else if (type == "yarn")
    s.type = RopeScalingType::kYarn;
  else
    core::fail(ErrorCode::kUnsupported, kLoad, "'" + path + "': rope scaling '" + type + "' is not supported");
  if (!std::isfinite(factor) || factor < 0.0 || factor > 1e6)
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': rope.scaling.factor is out of range");
  s.factor = factor == 0.0 ? 1.0 : factor;
  s.original_context = f.has(k + "original_context_length")
                           ? static_cast<int64_t>(f.get_uint(k + "original_context_length"))
                           : c.context;
  if (f.has(k + "attn_factor")) s.attn_factor = f.get_float(k + "attn_factor");
  if (f.has(k + "yarn_beta_fast")) s.beta_fast = f.get_float(k + "yarn_beta_fast");
  if (f.has(k + "yarn_beta_slow")) s.beta_slow = f.get_float(k + "yarn_beta_slow");
  if (!(s.attn_factor > 0.0) || !std::isfinite(s.attn_factor) || !(s.beta_fast > 0.0) || !(s.beta_slow > 0.0) ||
      !std::isfinite(s.beta_fast) || !std::isfinite(s.beta_slow))
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': rope scaling factors must be finite and > 0");
  if (s.type == RopeScalingType::kYarn && s.original_context <= 0)
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': YaRN needs the original context length");
  return s;
}

void read_config(const io::GgufFile& f, const std::string& path, LlamaConfig& c) {
  const std::string a = c.architecture;
  c.dim = static_cast<int64_t>(f.get_uint(a + ".embedding_length"));
  c.n_layers = static_cast<int64_t>(f.get_uint(a + ".block_count"));
  c.n_heads = static_cast<int64_t>(f.get_uint(a + ".attention.head_count"));
  c.n_kv_heads = f.has(a + ".attention.head_count_kv")
                     ? static_cast<int64_t>(f.get_uint(a + ".attention.head_count_kv"))
                     : c.n_heads;
  c.hidden = static_cast<int64_t>(f.get_uint(a + ".feed_forward_length"));
  c.context = f.has(a + ".context_length") ? static_cast<int64_t>(f.get_uint(a + ".context_length")) : 0;
  c.rope.base = f.has(a + ".rope.freq_base") ? f.get_float(a + ".rope.freq_base") : 10000.0;
  c.rms_eps = f.get_float(a + ".attention.layer_norm_rms_epsilon");
  if (!(c.rms_eps > 0.0) || !std::isfinite(c.rms_eps))
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': RMS norm epsilon must be finite and > 0");
  if (!(c.rope.base > 1.0) || !std::isfinite(c.rope.base))
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': RoPE base must be finite and > 1");
  auto in_range = [&](const char* what, int64_t v, int64_t hi) {
    if (v <= 0 || v > hi)
      core::fail(
          ErrorCode::kCorruptFile, kLoad,
          "'" + path + "': " + what + " = " + std::to_string(v) + " is outside 1.." + std::to_string(hi));
  };
  in_range("embedding_length", c.dim, int64_t{1} << 24);
  in_range("block_count", c.n_layers, int64_t{1} << 16);
  in_range("attention.head_count", c.n_heads, int64_t{1} << 16);
  in_range("attention.head_count_kv", c.n_kv_heads, int64_t{1} << 16);
  in_range("feed_forward_length", c.hidden, int64_t{1} << 26);
  const bool explicit_head = f.has(a + ".attention.key_length");
  if ((!explicit_head && c.dim % c.n_heads != 0) || c.n_heads % c.n_kv_heads != 0)
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': inconsistent head counts or embedding length");
  c.head_dim = explicit_head ? static_cast<int64_t>(f.get_uint(a + ".attention.key_length")) : c.dim / c.n_heads;
  if (f.has(a + ".attention.value_length") &&
      static_cast<int64_t>(f.get_uint(a + ".attention.value_length")) != c.head_dim)
    core::fail(ErrorCode::kUnsupported, kLoad, "'" + path + "': key and value head sizes differ");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 4096)
    core::fail(ErrorCode::kCorruptFile, kLoad,
               "'" + path + "': head size " + std::to_string(c.head_dim) + " is invalid");
  if (f.has(a + ".rope.dimension_count") &&
      static_cast<int64_t>(f.get_uint(a + ".rope.dimension_count")) != c.head_dim)
    core::fail(ErrorCode::kUnsupported, kLoad, "'" + path + "': partial RoPE (rope.dimension_count != head size)");
}

// RoPE as this file's model turns it: base, pairing, scaled frequencies (the
// scaling keys and rope_freqs.weight), and the factor on the scores.
// Per-pair frequency divisors from a [head_dim / 2] f32 tensor, each finite and > 0.
std::vector<float> freq_factors(const io::GgufTensor& t, const std::string& path) {
  std::vector<float> v = to_f32(t);
  for (float x : v)
    if (!(x > 0.0f) || !std::isfinite(x))
      core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': tensor '" + t.name + "' must be finite and > 0");
  return v;
}

// RoPE as this file's model turns it: base, pairing, scaled frequencies (the
// scaling keys, rope_freqs.weight, Phi-3's long or short factors), and the
// factor on the scores.
void read_rope(const io::GgufFile& f, const std::string& path, const Arch& arch, Tensors& tensors, LlamaConfig& c) {
  RopeScaling s = read_rope_scaling(f, c.architecture, c, path);
  const std::vector<int64_t> pairs = {c.head_dim / 2};
  if (arch.rope_freqs)
    if (const io::GgufTensor* t = tensors.optional("rope_freqs.weight", pairs)) s.freq_factors = freq_factors(*t, path);
  if (arch.long_rope) {
    // llama.cpp's choice for a context the size the model was trained for:
    // the long factors when it exceeds the original context.
    const io::GgufTensor* lng = tensors.optional("rope_factors_long.weight", pairs);
    const io::GgufTensor* shrt = tensors.optional("rope_factors_short.weight", pairs);
    const io::GgufTensor* use = c.context > s.original_context ? lng : shrt;
    if (use) s.freq_factors = freq_factors(*use, path);
  }
  c.rope.enabled = true;
  c.rope.style = arch.rope_style;
  c.rope.freq_scale = rope_freq_scale(s, c.head_dim, c.rope.base);
  c.score_factor = rope_score_factor(s);
  c.rope_local = c.rope;  // local layers: their own base, unscaled (llama.cpp's *_swa hparams)
  c.rope_local.base = f.has(c.architecture + ".rope.freq_base_swa") ? f.get_float(c.architecture + ".rope.freq_base_swa")
                                                                  : 10000.0;
  c.rope_local.freq_scale.clear();
  if (!(c.rope_local.base > 1.0) || !std::isfinite(c.rope_local.base))
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': rope.freq_base_swa must be finite and > 1");
}

// Gemma 3: the embedding scale, GeGLU, the query scale, the logit soft-cap and
// which layers are local (every `pattern`-th layer is global; default 6).
void read_gemma(const io::GgufFile& f, const std::string& path, LlamaConfig& c) {
  const std::string a = c.architecture + ".";
  c.embedding_scale = std::sqrt(static_cast<double>(c.dim));
  c.ffn = LlamaConfig::Ffn::kGeGluTanh;
  // Queries scaled by 1/sqrt(head_dim), or 1/sqrt(dim / heads) for the 27B
  // model (62 layers), as llama.cpp does; the factor is relative to 1/sqrt(hd).
  const double query_scale = c.n_layers == 62 ? 1.0 / std::sqrt(static_cast<double>(c.dim / c.n_heads))
                                              : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  c.score_factor *= query_scale * std::sqrt(static_cast<double>(c.head_dim));
  if (f.has(a + "final_logit_softcapping")) c.final_softcap = f.get_float(a + "final_logit_softcapping");
  if (!std::isfinite(c.final_softcap) || c.final_softcap < 0)
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': final_logit_softcapping must be finite and >= 0");
  if (!f.has(a + "attention.sliding_window") || f.get_uint(a + "attention.sliding_window") == 0) return;
  c.sliding_window = static_cast<int64_t>(f.get_uint(a + "attention.sliding_window"));
  if (c.sliding_window > (int64_t{1} << 30))
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': attention.sliding_window is out of range");
  c.local_layers.assign(static_cast<size_t>(c.n_layers), 0);
  const std::string key = a + "attention.sliding_window_pattern";
  if (f.has(key) && std::holds_alternative<std::shared_ptr<io::GgufArray>>(f.metadata().at(key))) {
    const auto& items = f.get_array(key).items;  // one flag per layer: true for local
    if (static_cast<int64_t>(items.size()) != c.n_layers)
      core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': sliding_window_pattern needs one flag per layer");
    for (size_t l = 0; l < items.size(); ++l) {
      const auto* flag = std::get_if<bool>(&items[l]);
      const auto* num = std::get_if<uint64_t>(&items[l]);
      c.local_layers[l] = flag ? *flag : num ? *num != 0 : 0;
    }
    return;
  }
  const int64_t period = f.has(key) ? static_cast<int64_t>(f.get_uint(key)) : 6;
  for (int64_t l = 0; l < c.n_layers; ++l) c.local_layers[l] = period == 0 || l % period < period - 1;
}

// Q, K and V of a layer: three tensors, or one fused attn_qkv split by rows.
void read_qkv(Tensors& t, const std::string& p, const LlamaConfig& c, LlamaLayer& L) {
  const int64_t D = c.dim, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  if (const io::GgufTensor* qkv = t.optional(p + "attn_qkv.weight", {D, q + 2 * kv})) {
    L.wq = weight_rows(*qkv, 0, q);
    L.wk = weight_rows(*qkv, q, kv);
    L.wv = weight_rows(*qkv, q + kv, kv);
    if (const io::GgufTensor* b = t.optional(p + "attn_qkv.bias", {q + 2 * kv})) {
      const std::vector<float> all = to_f32(*b);
      L.bq = slice(all, 0, q);
      L.bk = slice(all, q, kv);
      L.bv = slice(all, q + kv, kv);
    }
    return;
  }
  L.wq = weight(t.required(p + "attn_q.weight", {D, q}));
  L.wk = weight(t.required(p + "attn_k.weight", {D, kv}));
  L.wv = weight(t.required(p + "attn_v.weight", {D, kv}));
  auto bias = [&](const char* name, int64_t n) {
    const io::GgufTensor* b = t.optional(p + name, {n});
    return b ? to_f32(*b) : std::vector<float>();
  };
  L.bq = bias("attn_q.bias", q);
  L.bk = bias("attn_k.bias", kv);
  L.bv = bias("attn_v.bias", kv);
}

// The FFN's three matrices: gate and up apart, or fused in ffn_up (Phi-3).
void read_ffn(Tensors& t, const std::string& p, const Arch& arch, const LlamaConfig& c, LlamaLayer& L) {
  const int64_t D = c.dim, H = c.hidden;
  if (arch.fused_gate_up) {
    const io::GgufTensor& up = t.required(p + "ffn_up.weight", {D, 2 * H});
    L.w_gate = weight_rows(up, 0, H);
    L.w_up = weight_rows(up, H, H);
  } else {
    L.w_gate = weight(t.required(p + "ffn_gate.weight", {D, H}));
    L.w_up = weight(t.required(p + "ffn_up.weight", {D, H}));
  }
  L.w_down = weight(t.required(p + "ffn_down.weight", {H, D}));
}

LlamaLayer read_layer(Tensors& t, int64_t l, const Arch& arch, const LlamaConfig& c) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t D = c.dim, q = c.n_heads * c.head_dim;
  auto bias = [&](const char* name, int64_t n) {
    const io::GgufTensor* b = arch.ffn_and_o_bias ? t.optional(p + name, {n}) : nullptr;
    return b ? to_f32(*b) : std::vector<float>();
  };
  auto norm = [&](const char* name, int64_t n) { return to_f32(t.required(p + name, {n})); };
  LlamaLayer L;
  L.attn_norm = norm("attn_norm.weight", D);
  read_qkv(t, p, c, L);
  if (arch.qk_norm) {
    L.q_norm = norm("attn_q_norm.weight", c.head_dim);
    L.k_norm = norm("attn_k_norm.weight", c.head_dim);
  }
  L.wo = weight(t.required(p + "attn_output.weight", {q, D}));
  L.bo = bias("attn_output.bias", D);
  L.ffn_norm = norm("ffn_norm.weight", D);
  read_ffn(t, p, arch, c, L);
  L.b_gate = bias("ffn_gate.bias", c.hidden);
  L.b_up = bias("ffn_up.bias", c.hidden);
  L.b_down = bias("ffn_down.bias", D);
  if (arch.post_norms) {
    L.post_attn_norm = norm("post_attention_norm.weight", D);
    L.post_ffn_norm = norm("post_ffw_norm.weight", D);
  }
  return L;
}

}  // namespace

LlamaWeights load_gguf(const std::string& path) { return load_gguf(io::GgufFile::open(path), path); }

LlamaWeights load_gguf(const io::GgufFile& f, const std::string& path) {
  LlamaWeights w;
  LlamaConfig& c = w.config;
  c.architecture = f.get_string("general.architecture");
  const Arch* arch = find_arch(c.architecture);
  if (!arch)
    core::fail(ErrorCode::kUnsupported, kLoad,
               "architecture '" + c.architecture + "' is not supported (llama, mistral, qwen2, qwen3, gemma3, phi3 are)");
  check_keys(f, c.architecture, *arch, path);
  read_config(f, path, c);
  Tensors t(f, path);
  read_rope(f, path, *arch, t, c);
  if (arch->gemma) read_gemma(f, path, c);
  const auto& emb = f.tensor("token_embd.weight");
  c.vocab = emb.dims.size() == 2 ? emb.dims[1] : 0;
  if (f.has(c.architecture + ".vocab_size") &&
      static_cast<int64_t>(f.get_uint(c.architecture + ".vocab_size")) != c.vocab)
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': vocab_size disagrees with token_embd.weight");
  const int64_t D = c.dim;
  w.embeddings = weight(t.required("token_embd.weight", {D, c.vocab}));
  w.final_norm = to_f32(t.required("output_norm.weight", {D}));
  if (const io::GgufTensor* out = t.optional("output.weight", {D, c.vocab})) w.output_weight = weight(*out);
  if (arch->output_bias)
    if (const io::GgufTensor* b = t.optional("output.bias", {c.vocab})) w.output_bias = to_f32(*b);
  for (int64_t l = 0; l < c.n_layers; ++l) w.layers.push_back(read_layer(t, l, *arch, c));
  t.check_all_used(c.architecture);
  return w;
}

}  // namespace anchorkv::model
