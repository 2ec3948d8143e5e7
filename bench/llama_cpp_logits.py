"""anchorkv's logits against llama.cpp's on the same GGUF files and tokens (a benchmark-side check;
no build or test of the project depends on it).

llama.cpp comes from the npm package node-llama-cpp@3.21.1, as in bench/llama_cpp_compare.py: this
script compiles a 60-line program against its prebuilt libllama that prints the logits of every
position (f32, flash attention off, one sequence), runs `anchorkv logits` on the same tokens, and
reports the largest difference relative to the largest logit, and top-1 agreement.

    /usr/bin/python3 bench/llama_cpp_logits.py --peer-dir /path/to/scratch -m model.gguf --tokens 1,2,3
    /usr/bin/python3 bench/llama_cpp_logits.py --peer-dir /path/to/scratch --variants /tmp/variants

--variants DIR writes the synthetic files of python/tests/test_model_files.py (RoPE scaling, biases,
fused QKV, Qwen3, Gemma 3 with sliding-window layers, Phi-3 with long RoPE) into DIR and checks each.
"""

import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llama_cpp_compare  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "llama.h"
#include "ggml-backend.h"

int main(int argc, char** argv) {
  if (argc < 3) { std::fprintf(stderr, "usage: model.gguf t0,t1,...\n"); return 2; }
  std::vector<llama_token> toks;
  for (std::string s = argv[2]; !s.empty();) {
    size_t c = s.find(',');
    toks.push_back(std::atoi(s.substr(0, c).c_str()));
    s = c == std::string::npos ? "" : s.substr(c + 1);
  }
  ggml_backend_load_all();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 0;  // the trained context, as anchorkv runs (Phi-3 picks its RoPE factors by it)
  cp.n_batch = cp.n_ubatch = toks.size();
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.n_threads = cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  llama_batch b = llama_batch_init(toks.size(), 0, 1);
  for (size_t i = 0; i < toks.size(); ++i) {
    b.token[i] = toks[i];
    b.pos[i] = i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = toks.size();
  if (llama_decode(ctx, b) != 0) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::printf("[");
  for (size_t i = 0; i < toks.size(); ++i) {
    const float* l = llama_get_logits_ith(ctx, i);
    std::printf(i ? ",[" : "[");
    for (int v = 0; v < n_vocab; ++v) std::printf(v ? ",%.9g" : "%.9g", l[v]);
    std::printf("]");
  }
  std::printf("]\n");
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
}
"""


def build_peer(peer):
    llama_cpp_compare.install_peer(peer)  # the npm package, its sources and prebuilt libraries
    bins = next((peer / "node_modules/@node-llama-cpp/linux-x64/bins").glob("linux-x64"))
    exe = bins / "llama-logits"
    if not exe.exists():
        src = peer / "llama.cpp"
        cc = peer / "llama_logits.cpp"
        cc.write_text(PROGRAM)
        libs = [f"-l:{p.name}" for p in sorted(list(bins.glob("libllama.v*.so")) + list(bins.glob("libggml.v*.so")) +
                                               list(bins.glob("libggml-base.so")))]
        llama_cpp_compare.run(["g++", "-std=c++17", "-O2", f"-I{src}/include", f"-I{src}/ggml/include", cc, "-o", exe,
                               f"-L{bins}", *libs, f"-Wl,-rpath,{bins}", "-lpthread"])
    return exe


def compare(exe, model, tokens):
    arg = ",".join(map(str, tokens))
    theirs = np.array(json.loads(subprocess.run([exe, model, arg], check=True, capture_output=True,
                                                text=True).stdout))
    ours = np.array(json.loads(subprocess.run([ROOT / "build/anchorkv", "logits", "-m", model, "--tokens", arg,
                                               "--activations", "f32", "--json"], check=True, capture_output=True,
                                              text=True).stdout)["logits"])
    rel = float(np.abs(ours - theirs).max() / max(1.0, np.abs(theirs).max()))
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    return rel, top1


def write_variants(folder):
    sys.path.insert(0, str(ROOT / "python/tests"))
    import ggufw
    import test_model_files as t
    folder.mkdir(parents=True, exist_ok=True)
    HD = t.HD
    variants = {
        "plain": {},
        "rope_freqs": dict(rope_freqs=np.concatenate([np.ones(HD // 4), np.linspace(1.0, 8.0, HD // 4)])),
        "linear": dict(meta_extra={"llama.rope.scaling.type": (ggufw.STR, "linear"),
                                   "llama.rope.scaling.factor": (ggufw.F32V, 4.0)}),
        "yarn_qwen2": dict(arch="qwen2", biases=("qkv",),
                           meta_extra={"qwen2.rope.scaling.type": (ggufw.STR, "yarn"),
                                       "qwen2.rope.scaling.factor": (ggufw.F32V, 4.0),
                                       "qwen2.rope.scaling.original_context_length": (ggufw.U32, 64)}),
        "biases": dict(biases=("qkv", "o", "ffn")),
        "fused_qkv": dict(biases=("qkv", "o", "ffn"), fused_qkv=True),
        "qwen2_out_bias": dict(arch="qwen2", biases=("qkv", "out")),
        "qwen3": dict(arch="qwen3", qk_norm=True),
        "gemma3_swa": dict(arch="gemma3", qk_norm=True, post_norms=True, layers=6,
                           meta_extra={"gemma3.attention.sliding_window": (ggufw.U32, 7),
                                       "gemma3.rope.freq_base": (ggufw.F32V, 1e6),
                                       "gemma3.rope.scaling.type": (ggufw.STR, "linear"),
                                       "gemma3.rope.scaling.factor": (ggufw.F32V, 8.0)}),
        "phi3_longrope": dict(arch="phi3", fused_qkv=True, fused_gate_up=True,
                              rope_factors=(np.linspace(1, 6, HD // 2), np.linspace(1, 1.5, HD // 2)),
                              meta_extra={"phi3.context_length": (ggufw.U32, 4096),
                                          "phi3.rope.scaling.original_context_length": (ggufw.U32, 256),
                                          "phi3.rope.scaling.attn_factor": (ggufw.F32V, 1.19)}),
    }
    paths = {}
    for name, kw in variants.items():
        paths[name] = folder / f"{name}.gguf"
        t.write_model(paths[name], **kw)
    return paths, t.TOKENS


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer-dir", required=True)
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--tokens", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--variants", help="write the synthetic variants into this folder and check them")
    a = ap.parse_args()
    exe = build_peer(pathlib.Path(a.peer_dir).resolve())
    runs = {pathlib.Path(m).name: (m, [int(x) for x in a.tokens.split(",")]) for m in a.model}
    if a.variants:
        paths, tokens = write_variants(pathlib.Path(a.variants))
        runs.update({n: (str(p), tokens) for n, p in paths.items()})
    print(f"{'model':<20} {'max |diff| / max |logit|':>26} {'top-1 agree':>12}")
    for name, (model, tokens) in runs.items():
        rel, top1 = compare(exe, model, tokens)
        print(f"{name:<20} {rel:>26.2e} {top1:>12.3f}")


if __name__ == "__main__":
    main()
