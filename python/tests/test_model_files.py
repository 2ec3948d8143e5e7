"""GGUF features that change a model's arithmetic, on synthetic `llama` / `qwen2` files written here:
Llama-3.1 rope_freqs, linear and YaRN RoPE scaling, q/k/v/o and FFN biases, fused QKV, output bias.
The runtime's logits must match the independent float64 forward of numpy_llama.py (tolerance 2e-3 of
the largest logit, as for the shared models), and a file with a tensor or key the runtime does not
apply must be refused with its name, never run differently."""

import os
import subprocess

import numpy as np
import pytest

import ggufw
import numpy_llama
from test_runtime_reference import B2U, cli_logits

CLI = os.environ.get("ANCHORKV_CLI")
pytestmark = pytest.mark.skipif(CLI is None, reason="needs the anchorkv CLI (ANCHORKV_CLI)")

D, HQ, HK, HD, HIDDEN, LAYERS = 128, 4, 2, 32, 192, 2
TOKENS = [3, 77, 200, 5, 100, 255, 17, 250, 42, 9, 60, 61, 62, 63, 64, 120] * 2


def write_model(path, arch="llama", meta_extra=None, rope_freqs=None, biases=(), fused_qkv=False,
                extra_tensors=(), seed=11, layers=LAYERS, qk_norm=False, post_norms=False, fused_gate_up=False,
                rope_factors=None, vocab=None):
    """A small model with a byte-level GPT-2 vocabulary; returns (W, cfg) for numpy_llama.
    vocab: (pieces, token types, merges) instead, the last piece the end-of-text token.
    qk_norm / post_norms: Qwen3's and Gemma 3's extra norms; fused_gate_up: Phi-3's ffn_up holding gate
    then up rows; rope_factors: Phi-3's (long, short) per-pair divisors."""
    rng = np.random.default_rng(seed)
    pieces, types, merges = vocab or ([B2U[b] for b in range(256)] + ["<|end|>"], [1] * 256 + [3], [])
    V = len(pieces)
    a = arch
    meta = {
        "general.architecture": (ggufw.STR, a),
        a + ".embedding_length": (ggufw.U32, D), a + ".block_count": (ggufw.U32, layers),
        a + ".attention.head_count": (ggufw.U32, HQ), a + ".attention.head_count_kv": (ggufw.U32, HK),
        a + ".feed_forward_length": (ggufw.U32, HIDDEN), a + ".context_length": (ggufw.U32, 256),
        a + ".rope.freq_base": (ggufw.F32V, 10000.0), a + ".attention.layer_norm_rms_epsilon": (ggufw.F32V, 1e-5),
        "tokenizer.ggml.model": (ggufw.STR, "gpt2"), "tokenizer.ggml.pre": (ggufw.STR, "qwen2"),
        "tokenizer.ggml.tokens": (ggufw.ARR, (ggufw.STR, pieces)),
        "tokenizer.ggml.token_type": (ggufw.ARR, (ggufw.I32, types)),
        "tokenizer.ggml.eos_token_id": (ggufw.U32, V - 1),
        "tokenizer.ggml.merges": (ggufw.ARR, (ggufw.STR, merges)),  # none: bytes only; llama.cpp wants the key
    }
    meta.update(meta_extra or {})
    tensors, W = [], {"layers": []}

    def add(name, x):
        data, vals = ggufw.encode(np.atleast_2d(x), ggufw.F32)
        tensors.append((name, list(reversed(np.shape(x))), ggufw.F32, data))
        return vals.reshape(np.shape(x))

    W["emb"] = add("token_embd.weight", rng.normal(0, 0.5, (V, D)))
    W["final_norm"] = add("output_norm.weight", 1 + rng.normal(0, 0.1, D))
    if "out" in biases:
        W["out_b"] = add("output.bias", rng.normal(0, 0.5, V))
    if rope_freqs is not None:
        add("rope_freqs.weight", np.asarray(rope_freqs, np.float64))
    if rope_factors is not None:
        add("rope_factors_long.weight", np.asarray(rope_factors[0], np.float64))
        add("rope_factors_short.weight", np.asarray(rope_factors[1], np.float64))
    q, kv = HQ * HD, HK * HD
    for l in range(layers):
        p, L = f"blk.{l}.", {}
        L["attn_norm"] = add(p + "attn_norm.weight", 1 + rng.normal(0, 0.1, D))
        wq, wk, wv = rng.normal(0, 0.15, (q, D)), rng.normal(0, 0.15, (kv, D)), rng.normal(0, 0.1, (kv, D))
        bq, bk, bv = rng.normal(0, 0.5, q), rng.normal(0, 1.0, kv), rng.normal(0, 0.5, kv)
        if fused_qkv:
            both = add(p + "attn_qkv.weight", np.concatenate([wq, wk, wv]))
            L["wq"], L["wk"], L["wv"] = both[:q], both[q:q + kv], both[q + kv:]
            if "qkv" in biases:
                b = add(p + "attn_qkv.bias", np.concatenate([bq, bk, bv]))
                L["bq"], L["bk"], L["bv"] = b[:q], b[q:q + kv], b[q + kv:]
        else:
            L["wq"], L["wk"], L["wv"] = add(p + "attn_q.weight", wq), add(p + "attn_k.weight", wk), add(p + "attn_v.weight", wv)
            if "qkv" in biases:
                L["bq"], L["bk"] = add(p + "attn_q.bias", bq), add(p + "attn_k.bias", bk)
                L["bv"] = add(p + "attn_v.bias", bv)
        if qk_norm:
            L["q_norm"] = add(p + "attn_q_norm.weight", 1 + rng.normal(0, 0.2, HD))
            L["k_norm"] = add(p + "attn_k_norm.weight", 1 + rng.normal(0, 0.2, HD))
        L["wo"] = add(p + "attn_output.weight", rng.normal(0, 0.1, (D, q)))
        if "o" in biases:
            L["bo"] = add(p + "attn_output.bias", rng.normal(0, 0.3, D))
        L["ffn_norm"] = add(p + "ffn_norm.weight", 1 + rng.normal(0, 0.1, D))
        gate, up = rng.normal(0, 0.1, (HIDDEN, D)), rng.normal(0, 0.1, (HIDDEN, D))
        if fused_gate_up:
            both = add(p + "ffn_up.weight", np.concatenate([gate, up]))
            L["w_gate"], L["w_up"] = both[:HIDDEN], both[HIDDEN:]
        else:
            L["w_gate"], L["w_up"] = add(p + "ffn_gate.weight", gate), add(p + "ffn_up.weight", up)
        L["w_down"] = add(p + "ffn_down.weight", rng.normal(0, 0.08, (D, HIDDEN)))
        if post_norms:
            L["post_attn_norm"] = add(p + "post_attention_norm.weight", 1 + rng.normal(0, 0.2, D))
            L["post_ffn_norm"] = add(p + "post_ffw_norm.weight", 1 + rng.normal(0, 0.2, D))
        if "ffn" in biases:
            L["b_gate"] = add(p + "ffn_gate.bias", rng.normal(0, 0.3, HIDDEN))
            L["b_up"] = add(p + "ffn_up.bias", rng.normal(0, 0.3, HIDDEN))
            L["b_down"] = add(p + "ffn_down.bias", rng.normal(0, 0.3, D))
        W["layers"].append(L)
    for name, x in extra_tensors:
        add(name, x)
    ggufw.write(path, meta, tensors)
    cfg = dict(dim=D, heads=HQ, kv_heads=HK, hd=HD, eps=1e-5, base=10000.0,
               style="normal" if arch in ("llama", "mistral") else "neox")
    return W, cfg


def check_matches(path, W, cfg, label):
    ref = numpy_llama.forward(W, cfg, TOKENS)
    got = cli_logits(path, TOKENS)
    scale = max(1.0, np.abs(ref).max())
    err = np.abs(got - ref).max() / scale
    assert err < 2e-3, (label, err)
    # Pre-RoPE keys rotated inside attention, decoded one at a time, through the compressed
    # kernel too (theta 1: every residual, so only fp16 rounding separates it from the full cache).
    for cache in ("full:pre", "anchorkv:pre"):
        pre = cli_logits(path, TOKENS, "--cache", cache, "--theta", "1.0", "--incremental")
        assert np.abs(pre - ref).max() / scale < 4e-3, (label, cache)
    return ref


def plain_reference(W, cfg):
    return numpy_llama.forward(W, dict(cfg, freq_scale=1.0, score_factor=1.0), TOKENS)


def test_llama31_rope_freqs_are_applied(tmp_path):
    # Llama 3.1's rope_freqs: the low frequencies divided by up to 8, the high ones kept.
    factors = np.concatenate([np.ones(HD // 4), np.linspace(1.0, 8.0, HD // 4)])
    W, cfg = write_model(tmp_path / "m.gguf", rope_freqs=factors)
    cfg["freq_scale"] = 1.0 / factors
    ref = check_matches(tmp_path / "m.gguf", W, cfg, "rope_freqs")
    assert np.abs(ref - plain_reference(W, cfg)).max() > 0.01 * np.abs(ref).max()  # the test can fail


def test_linear_rope_scaling_is_applied(tmp_path):
    meta = {"llama.rope.scaling.type": (ggufw.STR, "linear"), "llama.rope.scaling.factor": (ggufw.F32V, 4.0)}
    W, cfg = write_model(tmp_path / "m.gguf", meta_extra=meta)
    cfg["freq_scale"] = numpy_llama.linear_freq_scale(HD, 4.0)
    ref = check_matches(tmp_path / "m.gguf", W, cfg, "linear")
    assert np.abs(ref - plain_reference(W, cfg)).max() > 0.01 * np.abs(ref).max()


def test_yarn_rope_scaling_and_its_attention_factor_are_applied(tmp_path):
    meta = {"qwen2.rope.scaling.type": (ggufw.STR, "yarn"), "qwen2.rope.scaling.factor": (ggufw.F32V, 4.0),
            "qwen2.rope.scaling.original_context_length": (ggufw.U32, 64)}
    W, cfg = write_model(tmp_path / "m.gguf", arch="qwen2", meta_extra=meta, biases=("qkv",))
    cfg["freq_scale"], cfg["score_factor"] = numpy_llama.yarn(HD, 10000.0, 4.0, 64)
    assert 0 < (cfg["freq_scale"] < 1).sum() < HD // 2  # a ramp: some pairs kept, some interpolated
    ref = check_matches(tmp_path / "m.gguf", W, cfg, "yarn")
    assert np.abs(ref - plain_reference(W, cfg)).max() > 0.01 * np.abs(ref).max()
    # The magnitude factor alone moves the logits too.
    no_factor = numpy_llama.forward(W, dict(cfg, score_factor=1.0), TOKENS)
    assert np.abs(ref - no_factor).max() > 0.01 * np.abs(ref).max()


@pytest.mark.parametrize("fused", [False, True])
def test_llama_biases_and_fused_qkv_are_applied(tmp_path, fused):
    W, cfg = write_model(tmp_path / "m.gguf", biases=("qkv", "o", "ffn"), fused_qkv=fused)
    ref = check_matches(tmp_path / "m.gguf", W, cfg, f"biases fused={fused}")
    unbiased = {**W, "layers": [{k: v for k, v in L.items() if not k.startswith("b")} for L in W["layers"]]}
    assert np.abs(ref - numpy_llama.forward(unbiased, cfg, TOKENS)).max() > 0.05 * np.abs(ref).max()


def test_qwen2_output_bias_is_applied(tmp_path):
    W, cfg = write_model(tmp_path / "m.gguf", arch="qwen2", biases=("qkv", "out"))
    check_matches(tmp_path / "m.gguf", W, cfg, "output bias")


def refusal(path):
    r = subprocess.run([CLI, "logits", "-m", str(path), "--tokens", "1,2,3"], capture_output=True, text=True)
    assert r.returncode != 0, "the file must be refused"
    return r.stderr


@pytest.mark.parametrize("name,extra,meta,expect", [
    ("moe router", [("blk.0.ffn_gate_inp.weight", np.zeros((4, D)))], {}, "tensor 'blk.0.ffn_gate_inp.weight'"),
    ("q norm", [("blk.1.attn_q_norm.weight", np.ones(HD))], {}, "tensor 'blk.1.attn_q_norm.weight'"),
    ("attention scale", [], {"llama.attention.scale": (ggufw.F32V, 0.1)}, "key 'llama.attention.scale'"),
    ("logit softcap", [], {"llama.final_logit_softcapping": (ggufw.F32V, 30.0)},
     "key 'llama.final_logit_softcapping'"),
    ("longrope", [], {"llama.rope.scaling.type": (ggufw.STR, "longrope")}, "rope scaling 'longrope'"),
    ("experts", [], {"llama.expert_count": (ggufw.U32, 8)}, "mixture-of-experts"),
])
def test_what_the_runtime_does_not_apply_is_refused_by_name(tmp_path, name, extra, meta, expect):
    write_model(tmp_path / "m.gguf", meta_extra=meta, extra_tensors=extra)
    err = refusal(tmp_path / "m.gguf")
    assert expect in err, (name, err)


def test_qwen2_rope_freqs_are_refused_not_ignored(tmp_path):
    # llama.cpp's qwen2 never reads rope_freqs; a file that has them is not one this runtime can trust.
    write_model(tmp_path / "m.gguf", arch="qwen2", rope_freqs=np.ones(HD // 2))
    assert "tensor 'rope_freqs.weight'" in refusal(tmp_path / "m.gguf")


def test_harmless_keys_load(tmp_path):
    meta = {"llama.vocab_size": (ggufw.U32, 257), "llama.rope.dimension_count": (ggufw.U32, HD),
            "llama.rope.scaling.type": (ggufw.STR, "none"), "llama.expert_count": (ggufw.U32, 0),
            "general.name": (ggufw.STR, "synthetic")}
    W, cfg = write_model(tmp_path / "m.gguf", meta_extra=meta)
    check_matches(tmp_path / "m.gguf", W, cfg, "harmless keys")
