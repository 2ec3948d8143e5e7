"""An independent float64 forward pass of the Llama family, written from the
published definitions (and llama.cpp's ggml_rope_ext for RoPE scaling), to
check the C++ runtime's logits against. numpy only.

W: {"emb", "final_norm", optional "out" (else tied), optional "out_b",
    "layers": [{"attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down",
                optional biases "bq", "bk", "bv", "bo", "b_gate", "b_up", "b_down",
                optional norms "q_norm", "k_norm" (per head, before RoPE), "post_attn_norm", "post_ffn_norm"}]}
cfg: {"dim", "heads", "kv_heads", "eps", "base", optional "hd", "style" ("normal" adjacent pairs or
      "neox" split halves), "freq_scale" (per-pair multipliers of the frequencies), "score_factor",
      "emb_scale", "ffn" ("swiglu" or "geglu": GELU's tanh form), "softcap" (final logits),
      "window" and "local" (per layer: True for sliding-window layers, which attend the last `window`
      positions with RoPE "base_local", unscaled)}"""

import math

import numpy as np


def rope(x, pos, base, style="normal", freq_scale=1.0):
    """x [..., hd] rotated to position pos: pair i by pos * base^(-2i/hd) * freq_scale[i]."""
    hd = x.shape[-1]
    i = np.arange(hd // 2)
    ang = pos * base ** (-2.0 * i / hd) * np.asarray(freq_scale, np.float64)
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    if style == "neox":
        h = hd // 2
        out[..., :h] = x[..., :h] * c - x[..., h:] * s
        out[..., h:] = x[..., :h] * s + x[..., h:] * c
    else:
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def linear_freq_scale(hd, factor):
    return np.full(hd // 2, 1.0 / factor)


def yarn(hd, base, factor, original_context, beta_fast=32.0, beta_slow=1.0, attn_factor=1.0):
    """(freq_scale, score_factor) of YaRN as ggml_rope_yarn computes it: pairs below the
    low correction dim keep their trained frequency, pairs above the high one are
    interpolated by 1/factor, a linear ramp between; cos and sin are scaled by
    attn_factor * (1 + 0.1 ln factor), so scores by its square."""

    def corr_dim(rotations):
        return hd * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(beta_fast)))
    high = min(hd - 1.0, math.ceil(corr_dim(beta_slow)))
    i = np.arange(hd // 2)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
    scale = (1.0 / factor) * (1.0 - ramp) + ramp
    mscale = attn_factor * (1.0 + 0.1 * math.log(factor))
    return scale, mscale * mscale


def gelu_tanh(g):
    return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))


def forward(W, cfg, tokens):
    D, Hq, Hk, eps, base = cfg["dim"], cfg["heads"], cfg["kv_heads"], cfg["eps"], cfg["base"]
    hd = cfg.get("hd", D // Hq)
    style, fs, score = cfg.get("style", "normal"), cfg.get("freq_scale", 1.0), cfg.get("score_factor", 1.0)
    T = len(tokens)
    x = W["emb"][tokens] * cfg.get("emb_scale", 1.0)

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    for l, L in enumerate(W["layers"]):
        local = cfg.get("local", [False] * len(W["layers"]))[l]
        b, f = (cfg["base_local"], 1.0) if local else (base, fs)
        xn = norm(x, L["attn_norm"])
        q = (xn @ L["wq"].T + L.get("bq", 0)).reshape(T, Hq, hd)
        k = (xn @ L["wk"].T + L.get("bk", 0)).reshape(T, Hk, hd)
        v = (xn @ L["wv"].T + L.get("bv", 0)).reshape(T, Hk, hd)
        if "q_norm" in L:
            q, k = norm(q, L["q_norm"]), norm(k, L["k_norm"])
        for t in range(T):
            q[t] = rope(q[t], t, b, style, f)
            k[t] = rope(k[t], t, b, style, f)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        if local:  # query i sees keys i - window + 1 .. i
            mask = mask + np.tril(np.full((T, T), -np.inf), -cfg["window"])
        out = np.zeros((T, Hq, hd))
        for h in range(Hq):
            kh = h // (Hq // Hk)
            s = score * (q[:, h] @ k[:, kh].T) / np.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kh]
        a = out.reshape(T, Hq * hd) @ L["wo"].T + L.get("bo", 0)
        x = x + (norm(a, L["post_attn_norm"]) if "post_attn_norm" in L else a)
        xn = norm(x, L["ffn_norm"])
        g = xn @ L["w_gate"].T + L.get("b_gate", 0)
        u = xn @ L["w_up"].T + L.get("b_up", 0)
        act = gelu_tanh(g) if cfg.get("ffn") == "geglu" else g / (1 + np.exp(-g))
        m = (act * u) @ L["w_down"].T + L.get("b_down", 0)
        x = x + (norm(m, L["post_ffn_norm"]) if "post_ffn_norm" in L else m)
    logits = norm(x, W["final_norm"]) @ W.get("out", W["emb"]).T + W.get("out_b", 0)
    cap = cfg.get("softcap", 0)
    return cap * np.tanh(logits / cap) if cap else logits
