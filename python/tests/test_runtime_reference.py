"""The C++ runtime's logits against an independent numpy Llama forward pass
(own GGUF / llama2.c parsing, float64), on the shared test models. Skipped
where ../shared/models or the CLI is absent."""

import json
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest

import numpy_llama

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT.parent / "shared" / "models"
CLI = os.environ.get("ANCHORKV_CLI")


def read_gguf(path):
    b = pathlib.Path(path).read_bytes()
    o = 0

    def rd(fmt):
        nonlocal o
        v = struct.unpack_from("<" + fmt, b, o)
        o += struct.calcsize("<" + fmt)
        return v[0]

    def rs():
        nonlocal o
        n = rd("Q")
        s = b[o:o + n].decode("utf-8", "replace")
        o += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rv(t):
        if t in scalar:
            return rd(scalar[t])
        if t == 8:
            return rs()
        et, n = rd("I"), rd("Q")
        return [rv(et) for _ in range(n)]

    assert b[:4] == b"GGUF"
    o = 4
    rd("I")
    nt, nkv = rd("Q"), rd("Q")
    meta = {}
    for _ in range(nkv):
        k = rs()
        meta[k] = rv(rd("I"))
    infos = []
    for _ in range(nt):
        name = rs()
        dims = [rd("Q") for _ in range(rd("I"))]
        typ, off = rd("I"), rd("Q")
        infos.append((name, dims, typ, off))
    align = meta.get("general.alignment", 32)
    start = (o + align - 1) // align * align
    tensors = {}
    for name, dims, typ, off in infos:
        assert typ == 0, "the reference reads F32 only"
        n = int(np.prod(dims))
        tensors[name] = np.frombuffer(b, np.float32, n, start + off).reshape(list(reversed(dims))).astype(np.float64)
    return meta, tensors


def forward(W, cfg, tokens):
    return numpy_llama.forward(W, cfg, tokens)


def gguf_model(path):
    meta, t = read_gguf(path)
    a = meta["general.architecture"]
    cfg = dict(dim=meta[a + ".embedding_length"], heads=meta[a + ".attention.head_count"],
               kv_heads=meta[a + ".attention.head_count_kv"], eps=meta[a + ".attention.layer_norm_rms_epsilon"],
               base=meta.get(a + ".rope.freq_base", 10000.0))
    layers = []
    for l in range(meta[a + ".block_count"]):
        p = f"blk.{l}."
        layers.append({k: t[p + n + ".weight"] for k, n in [
            ("attn_norm", "attn_norm"), ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
            ("ffn_norm", "ffn_norm"), ("w_gate", "ffn_gate"), ("w_up", "ffn_up"), ("w_down", "ffn_down")]})
    W = dict(emb=t["token_embd.weight"], final_norm=t["output_norm.weight"],
             out=t.get("output.weight", t["token_embd.weight"]), layers=layers)
    return W, cfg


def llama2c_model(path):
    b = pathlib.Path(path).read_bytes()
    dim, hidden, L, heads, kvh, vocab, seq = struct.unpack_from("<7i", b, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // heads
    f = np.frombuffer(b, np.float32, offset=28).astype(np.float64)
    o = 0

    def take(*shape):
        nonlocal o
        n = int(np.prod(shape))
        v = f[o:o + n].reshape(shape)
        o += n
        return v

    emb = take(vocab, dim)
    att_norm, wq, wk, wv, wo = take(L, dim), take(L, dim, dim), take(L, kvh * hd, dim), take(L, kvh * hd, dim), take(L, dim, dim)
    ffn_norm, w1, w2, w3 = take(L, dim), take(L, hidden, dim), take(L, dim, hidden), take(L, hidden, dim)
    final = take(dim)
    take(seq * hd)
    out = emb if shared else take(vocab, dim)
    layers = [dict(attn_norm=att_norm[l], wq=wq[l], wk=wk[l], wv=wv[l], wo=wo[l], ffn_norm=ffn_norm[l],
                   w_gate=w1[l], w_up=w3[l], w_down=w2[l]) for l in range(L)]
    return dict(emb=emb, final_norm=final, out=out, layers=layers), dict(dim=dim, heads=heads, kv_heads=kvh,
                                                                         eps=1e-5, base=10000.0)


def cli_logits(model, tokens, *extra):
    out = subprocess.run([CLI, "logits", "-m", str(model), "--tokens", ",".join(map(str, tokens)), "--json", *extra],
                         check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    assert d["tokens"] == tokens
    return np.array(d["logits"])


CASES = [("anchorkv-tiny.gguf", gguf_model, [1, 87, 105, 108, 108, 35, 119, 111, 114, 108, 100]),
         ("stories260K.bin", llama2c_model, [1, 300, 301, 302, 17, 99, 256, 4, 480])]


@pytest.mark.parametrize("name,loader,tokens", CASES)
def test_logits_match_independent_numpy_reference(name, loader, tokens):
    path = MODELS / name
    if CLI is None or not path.exists():
        pytest.skip("needs the anchorkv CLI (ANCHORKV_CLI) and ../shared/models")
    W, cfg = loader(path)
    ref = forward(W, cfg, tokens)
    got = cli_logits(path, tokens)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() < 2e-3 * max(1.0, np.abs(ref).max())
    # Decode one token at a time through the cache: same logits.
    inc = cli_logits(path, tokens, "--incremental")
    assert np.abs(inc - got).max() < 1e-4 * max(1.0, np.abs(got).max())
    # A prefill attends over exact K/V whatever the cache; the cache compresses afterwards.
    for cache in ("anchorkv", "snapkv", "h2o", "kivi2"):
        comp = cli_logits(path, tokens, "--cache", cache)
        assert np.abs(comp - got).max() < 1e-4 * max(1.0, np.abs(got).max()), cache
    # Keys stored before RoPE (rotated inside attention), decoded one at a time: the same
    # model up to fp16 rounding of unrotated keys.
    pre = cli_logits(path, tokens, "--cache", "full:pre", "--incremental")
    assert np.abs(pre - got).max() < 2e-3 * max(1.0, np.abs(got).max())


# ---------------------------------------------------------------- qwen2, quantized weights, byte-level BPE
# A synthetic qwen2 model written here (random weights in Q4_0 / Q8_0 / Q4_K / Q6_K /
# F16 / F32, Q/K/V biases, NeoX RoPE, tied output, GPT-2 tokenizer with merges)
# checks the loader, the dequantizers, the architecture and the tokenizer
# against this file's own float64 forward pass and BPE encoder.

import re  # noqa: E402

import ggufw  # noqa: E402


def gpt2_bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = gpt2_bytes_to_unicode()
# qwen2's split pattern restricted to ASCII (\p{L} -> [A-Za-z], \p{N} -> [0-9]); the tests feed ASCII.
QWEN2_ASCII = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
                         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
          "and darkness was upon the face of the deep. 1234 said the thin tinker's son, then there.")


def train_merges(text, n):
    words = [[B2U[b] for b in w.encode()] for w in QWEN2_ASCII.findall(text)]
    merges = []
    for _ in range(n):
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        merges.append(best)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


def bpe_encode(text, vocab, merges):
    rank = {m: i for i, m in enumerate(merges)}
    ids = []
    for chunk in QWEN2_ASCII.findall(text):
        sym = [B2U[b] for b in chunk.encode()]
        while len(sym) > 1:
            pairs = [(rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(sym, sym[1:]))]
            r, i = min(pairs)
            if r == 1 << 30:
                break
            sym[i:i + 2] = [sym[i] + sym[i + 1]]
        ids += [vocab[s] for s in sym]
    return ids


def write_qwen2(path):
    rng = np.random.default_rng(5)
    D, Hq, Hk, hd, hidden, nl = 256, 4, 2, 64, 512, 2
    merges = train_merges(CORPUS, 40)
    pieces = [B2U[b] for b in range(256)] + [a + b for a, b in merges] + ["<|endoftext|>"]
    V = len(pieces)
    meta = {
        "general.architecture": (ggufw.STR, "qwen2"),
        "qwen2.embedding_length": (ggufw.U32, D), "qwen2.block_count": (ggufw.U32, nl),
        "qwen2.attention.head_count": (ggufw.U32, Hq), "qwen2.attention.head_count_kv": (ggufw.U32, Hk),
        "qwen2.feed_forward_length": (ggufw.U32, hidden), "qwen2.context_length": (ggufw.U32, 512),
        "qwen2.rope.freq_base": (ggufw.F32V, 1000000.0), "qwen2.attention.layer_norm_rms_epsilon": (ggufw.F32V, 1e-6),
        "tokenizer.ggml.model": (ggufw.STR, "gpt2"), "tokenizer.ggml.pre": (ggufw.STR, "qwen2"),
        "tokenizer.ggml.tokens": (ggufw.ARR, (ggufw.STR, pieces)),
        "tokenizer.ggml.token_type": (ggufw.ARR, (ggufw.I32, [1] * (V - 1) + [3])),
        "tokenizer.ggml.merges": (ggufw.ARR, (ggufw.STR, [a + " " + b for a, b in merges])),
        "tokenizer.ggml.eos_token_id": (ggufw.U32, V - 1), "tokenizer.ggml.bos_token_id": (ggufw.U32, V - 1),
    }
    tensors, W = [], {"layers": []}

    def add(name, x, typ):
        data, vals = ggufw.encode(np.atleast_2d(x), typ)
        tensors.append((name, list(reversed(np.shape(x))), typ, data))
        return vals.reshape(np.shape(x))

    W["emb"] = add("token_embd.weight", rng.normal(0, 0.5, (V, D)), ggufw.Q4_K)
    W["final_norm"] = add("output_norm.weight", 1 + rng.normal(0, 0.1, D), ggufw.F32)
    types = [dict(q=ggufw.Q8_0, k=ggufw.Q6_K, v=ggufw.Q4_K, o=ggufw.Q8_0, g=ggufw.Q4_K, u=ggufw.Q6_K, d=ggufw.Q6_K),
             dict(q=ggufw.F16, k=ggufw.Q8_0, v=ggufw.Q6_K, o=ggufw.Q4_0, g=ggufw.F16, u=ggufw.Q8_0, d=ggufw.Q4_K)]
    for l in range(nl):
        p, t = f"blk.{l}.", types[l]
        L = {}
        L["attn_norm"] = add(p + "attn_norm.weight", 1 + rng.normal(0, 0.1, D), ggufw.F32)
        L["wq"] = add(p + "attn_q.weight", rng.normal(0, 0.08, (Hq * hd, D)), t["q"])
        L["wk"] = add(p + "attn_k.weight", rng.normal(0, 0.08, (Hk * hd, D)), t["k"])
        L["wv"] = add(p + "attn_v.weight", rng.normal(0, 0.08, (Hk * hd, D)), t["v"])
        L["bq"] = add(p + "attn_q.bias", rng.normal(0, 0.3, Hq * hd), ggufw.F32)
        L["bk"] = add(p + "attn_k.bias", rng.normal(0, 1.0, Hk * hd), ggufw.F32)
        L["bv"] = add(p + "attn_v.bias", rng.normal(0, 0.3, Hk * hd), ggufw.F32)
        L["wo"] = add(p + "attn_output.weight", rng.normal(0, 0.06, (D, Hq * hd)), t["o"])
        L["ffn_norm"] = add(p + "ffn_norm.weight", 1 + rng.normal(0, 0.1, D), ggufw.F32)
        L["w_gate"] = add(p + "ffn_gate.weight", rng.normal(0, 0.06, (hidden, D)), t["g"])
        L["w_up"] = add(p + "ffn_up.weight", rng.normal(0, 0.06, (hidden, D)), t["u"])
        L["w_down"] = add(p + "ffn_down.weight", rng.normal(0, 0.04, (D, hidden)), t["d"])
        W["layers"].append(L)
    ggufw.write(path, meta, tensors)
    cfg = dict(dim=D, heads=Hq, kv_heads=Hk, hd=hd, eps=1e-6, base=1000000.0)
    return W, cfg, {s: i for i, s in enumerate(pieces)}, merges


def cli_json(*args):
    return json.loads(subprocess.run([CLI, *map(str, args)], check=True, capture_output=True, text=True).stdout)


def test_quantizers_reproduce_their_values():
    # The writer's own check: bytes re-decoded here agree with the values it reports (Q8_0 only;
    # the K-quant layouts are checked against the C++ decoder by the model test below).
    x = np.random.default_rng(0).normal(0, 1, (2, 64))
    data, vals = ggufw.q8_0(x)
    raw = np.frombuffer(data, np.uint8).reshape(-1, 34)
    d = raw[:, :2].copy().view(np.float16).astype(np.float64)
    assert np.allclose(d * raw[:, 2:].view(np.int8), vals.reshape(-1, 32))
    for q in (ggufw.q8_0, ggufw.q4_k, ggufw.q6_k):
        y = np.random.default_rng(1).normal(0, 1, (2, 256))
        err = np.abs(q(y)[1] - y).max()
        assert err < 0.5, (q.__name__, err)  # a quantizer, not noise


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    if CLI is None:
        pytest.skip("needs the anchorkv CLI (ANCHORKV_CLI)")
    path = tmp_path_factory.mktemp("qwen2") / "synthetic-qwen2.gguf"
    W, cfg, vocab, merges = write_qwen2(path)
    return path, W, cfg, vocab, merges


def test_qwen2_quantized_logits_match_numpy_reference(qwen2):
    path, W, cfg, vocab, _ = qwen2
    tokens = [3, 77, 290, 5, 100, 256, 17, 250, 42, 9, 260]
    ref = numpy_llama.forward(W, dict(cfg, style="neox"), tokens)
    got = cli_logits(path, tokens, "--activations", "f32")
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() < 2e-3 * max(1.0, np.abs(ref).max())
    # Without biases or with adjacent-pair RoPE the reference differs clearly: the test can fail.
    assert np.abs(numpy_llama.forward(W, cfg, tokens) - ref).max() > 0.05 * np.abs(ref).max()
    # Decode with f32 activations is prefill's arithmetic; the default (8-bit activations, integer
    # dot products) is off by their rounding, a few per mille of the largest logit on this model.
    inc = cli_logits(path, tokens, "--incremental", "--activations", "f32")
    assert np.abs(inc - got).max() < 1e-4 * max(1.0, np.abs(got).max())
    int8 = cli_logits(path, tokens, "--incremental")
    err = np.abs(int8 - ref).max() / max(1.0, np.abs(ref).max())
    assert 1e-4 < err < 2e-2, err  # quantized activations, not f32 ones, and not noise
    assert (int8.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    # Default prefill: 8-bit activations on AMX tiles where the CPU has them (else f32 tiles).
    default = cli_logits(path, tokens)
    assert np.abs(default - ref).max() < 2e-2 * max(1.0, np.abs(ref).max())
    assert (default.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    # Without the tiles: the row kernels (weights in groups of 16 rows, where the CPU has VNNI) or f32 tiles.
    rows = cli_logits(path, tokens, "--no-amx")
    assert np.abs(rows - ref).max() < 2e-2 * max(1.0, np.abs(ref).max())
    assert (rows.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    # NeoX RoPE inside attention (keys cached unrotated), through the compressed kernel too.
    for cache in ("full:pre", "anchorkv:pre"):
        pre = cli_logits(path, tokens, "--cache", cache, "--theta", "1.0", "--incremental", "--activations", "f32")
        assert np.abs(pre - ref).max() < 4e-3 * max(1.0, np.abs(ref).max()), cache


def test_gpt2_bpe_tokenizer_matches_reference_encoder(qwen2):
    path, _, _, vocab, merges = qwen2
    text = "And the earth was without form; then there said the thin tinker's son 1234.\n\n  In the  beginning"
    d = cli_json("tokenize", "-m", path, "-t", text, "--json")
    assert d["tokens"] == bpe_encode(text, vocab, merges)
    assert len(d["tokens"]) < len(text.encode()) * 0.7  # merges were used
    assert d["decoded"] == text
    # UTF-8 beyond the trained merges round-trips through the byte tokens.
    utf = "naïve café 日本語 😀"
    assert cli_json("tokenize", "-m", path, "-t", utf, "--json")["decoded"] == utf
    # gpt2 models add no BOS unless the file asks.
    assert cli_json("tokenize", "-m", path, "-t", "In", "--bos", "--json")["tokens"] == [vocab["In"]]
