// `anchorkv dump-kv`: every layer's Q/K/V of a prompt as an .akv file.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "cache/registry.h"
#include "commands.h"
#include "core/error.h"
#include "inputs.h"
#include "io/kvdump.h"
#include "runtime/model_file.h"
#include "runtime/session.h"

namespace anchorkv::cli {
namespace {

struct DumpOptions {
  std::string model, text, out;
  std::vector<int32_t> tokens;
  int64_t ctx = 1024;
  int threads = 0;
};

// One prefill of the text with the full cache, capturing every layer's Q, K
// (before and after RoPE) and V into an .akv file (docs/kvdump.md).
void dump_kv(const DumpOptions& o) {
  const runtime::ModelFile mf = runtime::ModelFile::open(o.model);
  const model::LlamaWeights& w = mf.weights;
  std::vector<int32_t> toks = o.tokens;
  if (toks.empty()) {
    if (o.text.empty()) core::fail(ErrorCode::kInvalidArgument, "anchorkv dump-kv", "pass --text FILE or --tokens");
    toks = mf.tok("anchorkv dump-kv").encode(read_file(o.text), true);
  }
  if (static_cast<int64_t>(toks.size()) > o.ctx) toks.resize(static_cast<size_t>(o.ctx));
  const auto& c = w.config;
  if (!c.rope.freq_scale.empty())
    core::fail(ErrorCode::kUnsupported, "anchorkv dump-kv",
               "the model's RoPE scales its frequencies, which a K/V dump does not record");
  io::KVDump d;
  d.n_heads = static_cast<uint32_t>(c.n_heads);
  d.n_kv_heads = static_cast<uint32_t>(c.n_kv_heads);
  d.head_dim = static_cast<uint32_t>(c.head_dim);
  d.n_tokens = toks.size();
  d.rope_base = c.rope.base;
  d.rope_style = c.rope.style == RopeStyle::kNeox ? 1u : 0u;
  d.layers.resize(static_cast<size_t>(c.n_layers));
  model::LlamaModel m = runtime::make_model(w, "full", 0, o.threads);
  const int64_t T = static_cast<int64_t>(toks.size()), hd = c.head_dim;
  // [T, H, hd] token-major -> [H, T, hd]
  auto head_major = [&](const float* x, int64_t H) {
    std::vector<float> y(static_cast<size_t>(H * T * hd));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) std::copy_n(x + (t * H + h) * hd, hd, &y[(h * T + t) * hd]);
    return y;
  };
  m.set_observer(
      [&](int64_t l, int64_t, const float* q, const float* k_pre, const float* k_post, const float* v) {
        auto& L = d.layers[static_cast<size_t>(l)];
        L.q = head_major(q, c.n_heads);
        L.k_pre = head_major(k_pre, c.n_kv_heads);
        L.k_post = head_major(k_post, c.n_kv_heads);
        L.v = head_major(v, c.n_kv_heads);
      });
  m.forward(toks);
  io::write_kvdump(o.out, d);
  fmt::print("wrote {}: {} layers, {} tokens, {} query heads, {} KV heads, head dim {}\n", o.out, c.n_layers,
             T, c.n_heads, c.n_kv_heads, hd);
}

}  // namespace

void register_dump_kv(CLI::App& app) {
  auto dk = std::make_shared<DumpOptions>();
  CLI::App* dump = app.add_subcommand("dump-kv", "Write every layer's Q/K/V of a prompt to an .akv file");
  dump->add_option("--model,-m", dk->model, "model file")->required();
  dump->add_option("--text", dk->text, "text file (GGUF models)");
  dump->add_option("--tokens", dk->tokens, "token ids instead")->delimiter(',');
  dump->add_option("--ctx", dk->ctx, "tokens at most")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  dump->add_option("--out,-o", dk->out, "output .akv file")->required();
  dump->add_option("--threads", dk->threads, "threads (0 = all cores)");
  dump->callback([dk] { dump_kv(*dk); });

}

}  // namespace anchorkv::cli
