"""Writes the seed corpus of fuzz/model_fuzz.cc: two tiny models (llama with a
SentencePiece byte vocabulary, qwen2 with a GPT-2 BPE vocabulary), small
enough for libFuzzer's input limit. Run from the repository root:
    /usr/bin/python3 fuzz/make_model_seeds.py"""

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "tests"))
import ggufw  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "model"


def model(path, arch, tokenizer):
    rng = np.random.default_rng(1)
    D, H, Hk, hidden = 8, 2, 1, 16
    if tokenizer == "llama":
        pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [2, 3, 3] + [6] * 256
        tok = {"tokenizer.ggml.model": (ggufw.STR, "llama")}
    else:
        b2u = {}
        n = 0
        for b in range(256):
            if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
                b2u[b] = chr(b)
            else:
                b2u[b] = chr(256 + n)
                n += 1
        pieces = [b2u[b] for b in range(256)] + ["he", "ll", "<|endoftext|>"]
        types = [1] * 258 + [3]
        tok = {"tokenizer.ggml.model": (ggufw.STR, "gpt2"), "tokenizer.ggml.pre": (ggufw.STR, "qwen2"),
               "tokenizer.ggml.merges": (ggufw.ARR, (ggufw.STR, ["h e", "l l"]))}
    V = len(pieces)
    meta = {"general.architecture": (ggufw.STR, arch), f"{arch}.embedding_length": (ggufw.U32, D),
            f"{arch}.block_count": (ggufw.U32, 1), f"{arch}.attention.head_count": (ggufw.U32, H),
            f"{arch}.attention.head_count_kv": (ggufw.U32, Hk), f"{arch}.feed_forward_length": (ggufw.U32, hidden),
            f"{arch}.attention.layer_norm_rms_epsilon": (ggufw.F32V, 1e-5),
            "tokenizer.ggml.tokens": (ggufw.ARR, (ggufw.STR, pieces)),
            "tokenizer.ggml.token_type": (ggufw.ARR, (ggufw.I32, types)), **tok}
    tensors = []

    def add(name, shape, typ=ggufw.F16):
        data, _ = ggufw.encode(np.atleast_2d(rng.normal(0, 0.2, shape)), typ)
        tensors.append((name, list(reversed(shape)), typ, data))

    add("token_embd.weight", (V, D))
    add("output_norm.weight", (D,), ggufw.F32)
    hd = D // H
    for name, shape in [("attn_norm", (D,)), ("attn_q", (H * hd, D)), ("attn_k", (Hk * hd, D)),
                        ("attn_v", (Hk * hd, D)), ("attn_output", (D, H * hd)), ("ffn_norm", (D,)),
                        ("ffn_gate", (hidden, D)), ("ffn_up", (hidden, D)), ("ffn_down", (D, hidden))]:
        add(f"blk.0.{name}.weight", shape, ggufw.F32 if len(shape) == 1 else ggufw.F16)
    if arch == "qwen2":
        for name, n in [("attn_q", H * hd), ("attn_k", Hk * hd), ("attn_v", Hk * hd)]:
            add(f"blk.0.{name}.bias", (n,), ggufw.F32)
    ggufw.write(path, meta, tensors)


OUT.mkdir(parents=True, exist_ok=True)
model(OUT / "llama_spm.gguf", "llama", "llama")
model(OUT / "qwen2_bpe.gguf", "qwen2", "gpt2")
