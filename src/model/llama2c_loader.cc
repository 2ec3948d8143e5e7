// load_llama2c: a llama2.c checkpoint (a header of 7 int32, then f32 weights
// in llama2.c's order), and load_model, which picks the loader by extension.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/llama.h"

namespace anchorkv::model {
namespace {

constexpr const char* kLoad = "anchorkv::load_model";

// The header's config; throws naming the first field out of range.
LlamaConfig llama2c_config(const int32_t h[7], const std::string& path, bool* shared) {
  for (int i = 0; i < 7; ++i)
    if (h[i] == 0 || (i != 5 && h[i] < 0) || std::abs(static_cast<int64_t>(h[i])) > (int64_t{1} << 24))
      core::fail(ErrorCode::kCorruptFile, kLoad,
                 "'" + path + "': header field " + std::to_string(i) + " = " + std::to_string(h[i]) +
                     " is out of range");
  LlamaConfig c;
  c.architecture = "llama2.c";
  c.dim = h[0];
  c.hidden = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  *shared = h[5] > 0;
  c.vocab = std::abs(h[5]);
  c.context = h[6];
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0)
    core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': inconsistent head counts");
  c.head_dim = c.dim / c.n_heads;
  c.rms_eps = 1e-5;
  return c;
}

}  // namespace

LlamaWeights load_llama2c(const std::string& path) {
  const core::MappedFile file = core::MappedFile::open(path, kLoad);
  const auto size = static_cast<int64_t>(file.size());
  int32_t h[7];
  if (size < 28) core::fail(ErrorCode::kCorruptFile, kLoad, "'" + path + "': shorter than the llama2.c header");
  std::memcpy(h, file.data(), sizeof(h));
  LlamaWeights w;
  bool shared = false;
  LlamaConfig& c = w.config = llama2c_config(h, path, &shared);
  const int64_t D = c.dim, L = c.n_layers, kv = c.n_kv_heads * c.head_dim, Hd = c.hidden;
  const int64_t floats = c.vocab * D + L * D + L * D * D + 2 * L * kv * D + L * D * D + L * D +
                         3 * L * Hd * D + D + c.context * c.head_dim + (shared ? 0 : c.vocab * D);
  if (size < 28 + floats * 4)
    core::fail(ErrorCode::kCorruptFile, kLoad,
               "'" + path + "': " + std::to_string(size) + " bytes, the header implies " +
                   std::to_string(28 + floats * 4));
  int64_t at = 28;
  auto take = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), file.data() + at, static_cast<size_t>(n) * 4);
    at += n * 4;
    return v;
  };
  // Per-layer tensors are stored layer after layer for one weight at a time.
  auto split = [&](int64_t per) {
    std::vector<std::vector<float>> out(static_cast<size_t>(L));
    for (auto& layer : out) layer = take(per);
    return out;
  };
  w.embeddings = Weight::from_f32(take(c.vocab * D), c.vocab, D);
  auto att_norm = split(D), wq = split(D * D), wk = split(kv * D), wv = split(kv * D), wo = split(D * D),
       ffn_norm = split(D), w1 = split(Hd * D), w2 = split(D * Hd), w3 = split(Hd * D);
  w.final_norm = take(D);
  at += c.context * c.head_dim * 4;  // freq_cis_real and freq_cis_imag (RoPE is computed instead)
  if (!shared) w.output_weight = Weight::from_f32(take(c.vocab * D), c.vocab, D);
  for (int64_t l = 0; l < L; ++l) {
    LlamaLayer layer;
    layer.attn_norm = std::move(att_norm[l]);
    layer.ffn_norm = std::move(ffn_norm[l]);
    layer.wq = Weight::from_f32(std::move(wq[l]), D, D);
    layer.wk = Weight::from_f32(std::move(wk[l]), kv, D);
    layer.wv = Weight::from_f32(std::move(wv[l]), kv, D);
    layer.wo = Weight::from_f32(std::move(wo[l]), D, D);
    layer.w_gate = Weight::from_f32(std::move(w1[l]), Hd, D);
    layer.w_up = Weight::from_f32(std::move(w3[l]), Hd, D);
    layer.w_down = Weight::from_f32(std::move(w2[l]), D, Hd);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

LlamaWeights load_model(const std::string& path) {
  const bool gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  return gguf ? load_gguf(path) : load_llama2c(path);
}

}  // namespace anchorkv::model
