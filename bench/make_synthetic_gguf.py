"""Writes a random-weight Llama GGUF for speed measurements of the runtime
(`anchorkv bench runtime`): the text it produces is noise, but its shapes and
weight types are those of a real model. Run from the repository root, e.g.
    /usr/bin/python3 bench/make_synthetic_gguf.py --type q8_0 --dim 1024 --layers 8 -o synth-q8_0.gguf
Long-context runs need --ctx (the context length the model declares), e.g.
    /usr/bin/python3 bench/make_synthetic_gguf.py --type q8_0 --dim 512 --heads 4 --kv-heads 1 --layers 4 \
        --hidden 1376 --ctx 40960 -o synth-d128-long.gguf
--arch writes the other families' tensors and keys: qwen3 (per-head Q/K norms), gemma3 (the norms,
post-attention and post-FFN norms, sliding-window layers: --window, every 6th layer global), phi3
(fused QKV and gate/up), e.g. a Gemma-3-shaped model (head dim 256, window 1024):
    /usr/bin/python3 bench/make_synthetic_gguf.py --arch gemma3 --type q8_0 --dim 640 --heads 4 --kv-heads 1 \
        --head-dim 256 --layers 12 --hidden 2048 --window 1024 --ctx 40960 -o synth-gemma3.gguf
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "tests"))
import ggufw  # noqa: E402

TYPES = {"f32": ggufw.F32, "f16": ggufw.F16, "q4_0": ggufw.Q4_0, "q8_0": ggufw.Q8_0, "q4_k": ggufw.Q4_K,
         "q6_k": ggufw.Q6_K}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", choices=TYPES, default="q8_0")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=8192, help="context length the model declares")
    ap.add_argument("--arch", choices=["llama", "qwen3", "gemma3", "phi3"], default="llama")
    ap.add_argument("--head-dim", type=int, default=0, help="head size (default dim / heads)")
    ap.add_argument("--window", type=int, default=1024, help="gemma3: the local layers' sliding window")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    typ = TYPES[a.type]
    rng = np.random.default_rng(0)
    hd = a.head_dim or a.dim // a.heads
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"<unused{i}>" for i in range(len(pieces), a.vocab)]
    types = [2, 3, 3] + [6] * 256 + [5] * (a.vocab - 259)
    A = a.arch
    meta = {"general.architecture": (ggufw.STR, A), A + ".embedding_length": (ggufw.U32, a.dim),
            A + ".block_count": (ggufw.U32, a.layers), A + ".attention.head_count": (ggufw.U32, a.heads),
            A + ".attention.head_count_kv": (ggufw.U32, a.kv_heads),
            A + ".feed_forward_length": (ggufw.U32, a.hidden), A + ".context_length": (ggufw.U32, a.ctx),
            A + ".attention.layer_norm_rms_epsilon": (ggufw.F32V, 1e-5),
            A + ".attention.key_length": (ggufw.U32, hd), A + ".attention.value_length": (ggufw.U32, hd),
            "tokenizer.ggml.model": (ggufw.STR, "llama"), "tokenizer.ggml.tokens": (ggufw.ARR, (ggufw.STR, pieces)),
            "tokenizer.ggml.token_type": (ggufw.ARR, (ggufw.I32, types))}
    if A == "gemma3":
        meta[A + ".attention.sliding_window"] = (ggufw.U32, a.window)
        meta[A + ".rope.freq_base"] = (ggufw.F32V, 1e6)
    tensors = []

    def add(name, shape, t=typ):
        x = rng.normal(0, 1.0 / np.sqrt(shape[-1]), shape).astype(np.float32)
        data, _ = ggufw.encode(np.atleast_2d(x), t)
        tensors.append((name, list(reversed(shape)), t, data))

    add("token_embd.weight", (a.vocab, a.dim))
    add("output_norm.weight", (a.dim,), ggufw.F32)
    add("output.weight", (a.vocab, a.dim))
    for l in range(a.layers):
        p = f"blk.{l}."
        add(p + "attn_norm.weight", (a.dim,), ggufw.F32)
        add(p + "ffn_norm.weight", (a.dim,), ggufw.F32)
        if A == "phi3":
            add(p + "attn_qkv.weight", ((a.heads + 2 * a.kv_heads) * hd, a.dim))
            add(p + "ffn_up.weight", (2 * a.hidden, a.dim))
        else:
            add(p + "attn_q.weight", (a.heads * hd, a.dim))
            add(p + "attn_k.weight", (a.kv_heads * hd, a.dim))
            add(p + "attn_v.weight", (a.kv_heads * hd, a.dim))
            add(p + "ffn_gate.weight", (a.hidden, a.dim))
            add(p + "ffn_up.weight", (a.hidden, a.dim))
        if A in ("qwen3", "gemma3"):
            add(p + "attn_q_norm.weight", (hd,), ggufw.F32)
            add(p + "attn_k_norm.weight", (hd,), ggufw.F32)
        if A == "gemma3":
            add(p + "post_attention_norm.weight", (a.dim,), ggufw.F32)
            add(p + "post_ffw_norm.weight", (a.dim,), ggufw.F32)
        add(p + "attn_output.weight", (a.dim, a.heads * hd))
        add(p + "ffn_down.weight", (a.dim, a.hidden))
    ggufw.write(a.out, meta, tensors)


if __name__ == "__main__":
    main()
