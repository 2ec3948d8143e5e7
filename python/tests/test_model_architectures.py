"""Qwen3, Gemma 3 (sliding-window layers) and Phi-3 (fused projections, long RoPE) on synthetic GGUF
files written here, their logits against the independent float64 forward of numpy_llama.py (2e-3 of
the largest logit, as for every model), through the full cache, pre-RoPE caches and AnchorKV."""

import os

import numpy as np
import pytest

import ggufw
import numpy_llama
from test_model_files import HD, TOKENS, check_matches, write_model
from test_runtime_reference import cli_logits

CLI = os.environ.get("ANCHORKV_CLI")
pytestmark = pytest.mark.skipif(CLI is None, reason="needs the anchorkv CLI (ANCHORKV_CLI)")


def differs(a, b, share=0.01):
    return np.abs(a - b).max() > share * np.abs(a).max()


def test_qwen3_head_norms_are_applied(tmp_path):
    W, cfg = write_model(tmp_path / "m.gguf", arch="qwen3", qk_norm=True)
    ref = check_matches(tmp_path / "m.gguf", W, cfg, "qwen3")
    plain = {**W, "layers": [{k: v for k, v in L.items() if not k.endswith("_norm") or k in ("attn_norm", "ffn_norm")}
                             for L in W["layers"]]}
    assert differs(ref, numpy_llama.forward(plain, cfg, TOKENS))


def gemma3(tmp_path, window, layers=6, pattern=None, softcap=None):
    meta = {"gemma3.attention.sliding_window": (ggufw.U32, window), "gemma3.rope.freq_base": (ggufw.F32V, 1e6),
            "gemma3.rope.scaling.type": (ggufw.STR, "linear"), "gemma3.rope.scaling.factor": (ggufw.F32V, 8.0)}
    if pattern is not None:
        meta["gemma3.attention.sliding_window_pattern"] = (ggufw.U32, pattern)
    if softcap:
        meta["gemma3.final_logit_softcapping"] = (ggufw.F32V, softcap)
    W, cfg = write_model(tmp_path / "g.gguf", arch="gemma3", meta_extra=meta, qk_norm=True, post_norms=True,
                         layers=layers)
    period = 6 if pattern is None else pattern
    cfg.update(base=1e6, freq_scale=numpy_llama.linear_freq_scale(HD, 8.0), base_local=10000.0, window=window,
               local=[l % period < period - 1 for l in range(layers)], emb_scale=np.sqrt(cfg["dim"]), ffn="geglu",
               softcap=softcap or 0)
    return W, cfg


def test_gemma3_with_sliding_window_layers(tmp_path):
    # 6 layers: 0-4 local (a 7-position window, shorter than the 32 tokens), 5 global.
    W, cfg = gemma3(tmp_path, window=7)
    ref = check_matches(tmp_path / "g.gguf", W, cfg, "gemma3")
    assert differs(ref, numpy_llama.forward(W, dict(cfg, local=[False] * 6), TOKENS))  # the windows matter
    assert differs(ref, numpy_llama.forward(W, dict(cfg, base_local=1e6), TOKENS))  # so do the local bases
    # Compressed global layer(s), windows kept as rings: one token at a time gives the prefill's logits.
    inc = cli_logits(tmp_path / "g.gguf", TOKENS, "--cache", "anchorkv_tight:pre:obs:auto", "--theta", "1.0",
                     "--incremental")
    assert np.abs(inc - ref).max() < 4e-3 * max(1.0, np.abs(ref).max())


def test_gemma3_pattern_and_softcap(tmp_path):
    W, cfg = gemma3(tmp_path, window=5, layers=4, pattern=2, softcap=3.0)
    ref = check_matches(tmp_path / "g.gguf", W, cfg, "gemma3 pattern 2, soft-cap")
    assert np.abs(ref).max() <= 3.0 + 1e-9
    assert differs(ref, numpy_llama.forward(W, dict(cfg, softcap=0), TOKENS))


def phi3(tmp_path, context, original):
    rng = np.random.default_rng(3)
    long, short = 1 + rng.uniform(0, 6, HD // 2), 1 + rng.uniform(0, 0.5, HD // 2)
    meta = {"phi3.context_length": (ggufw.U32, context),
            "phi3.rope.scaling.original_context_length": (ggufw.U32, original),
            "phi3.rope.scaling.attn_factor": (ggufw.F32V, 1.19), "phi3.attention.sliding_window": (ggufw.U32, 2047)}
    W, cfg = write_model(tmp_path / "p.gguf", arch="phi3", meta_extra=meta, fused_qkv=True, fused_gate_up=True,
                         rope_factors=(long, short))
    return W, cfg, long, short


@pytest.mark.parametrize("long_context", [True, False])
def test_phi3_fused_projections_and_long_rope(tmp_path, long_context):
    W, cfg, long, short = phi3(tmp_path, 4096 if long_context else 256, 256)
    cfg.update(freq_scale=1.0 / (long if long_context else short), score_factor=1.19 ** 2)
    ref = check_matches(tmp_path / "p.gguf", W, cfg, f"phi3 long={long_context}")
    other = dict(cfg, freq_scale=1.0 / (short if long_context else long))
    assert differs(ref, numpy_llama.forward(W, other, TOKENS))
