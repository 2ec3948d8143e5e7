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


def rope(x, pos, base):
    # x [..., hd], adjacent pairs (2i, 2i+1), theta_i = base^(-2i/hd)
    hd = x.shape[-1]
    i = np.arange(hd // 2)
    ang = pos * base ** (-2.0 * i / hd)
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def forward(W, cfg, tokens):
    D, Hq, Hk, eps, base = cfg["dim"], cfg["heads"], cfg["kv_heads"], cfg["eps"], cfg["base"]
    hd = D // Hq
    T = len(tokens)
    x = W["emb"][tokens]

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    for L in W["layers"]:
        xn = norm(x, L["attn_norm"])
        q = (xn @ L["wq"].T).reshape(T, Hq, hd)
        k = (xn @ L["wk"].T).reshape(T, Hk, hd)
        v = (xn @ L["wv"].T).reshape(T, Hk, hd)
        for t in range(T):
            q[t] = rope(q[t], t, base)
            k[t] = rope(k[t], t, base)
        out = np.zeros((T, Hq, hd))
        for h in range(Hq):
            kh = h // (Hq // Hk)
            s = q[:, h] @ k[:, kh].T / np.sqrt(hd)
            s = s + np.triu(np.full((T, T), -np.inf), 1)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kh]
        x = x + out.reshape(T, D) @ L["wo"].T
        xn = norm(x, L["ffn_norm"])
        g = xn @ L["w_gate"].T
        x = x + (g / (1 + np.exp(-g)) * (xn @ L["w_up"].T)) @ L["w_down"].T
    return norm(x, W["final_norm"]) @ W["out"].T


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
