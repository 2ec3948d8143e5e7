"""pytest suite for the anchorkv Python package: the seed's documented
invariants, byte accounting, dtypes/strides, bad input, GIL release."""

import dataclasses
import pathlib
import re
import threading
import time

import numpy as np
import pytest

import anchorkv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def kv(B=1, H=2, S=256, D=64, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((B, H, 8, D))
    idx = rng.integers(0, 8, size=(B, H, S))
    k = np.take_along_axis(centres, idx[..., None].repeat(D, -1), axis=2) + 0.3 * rng.standard_normal((B, H, S, D))
    v = rng.standard_normal((B, H, S, D))
    return k.astype(np.float32), v.astype(np.float32)


# ---------------------------------------------------------------- config

def test_config_defaults_are_the_seeds():
    c = anchorkv.KVCacheConfig()
    assert c.anchorkv_theta == 0.05
    assert c.anchorkv_window == 32
    assert c.anchorkv_rho == 0.7
    assert c.anchorkv_anchor_frac == 1 / 128
    assert c.anchorkv_residual_bits == 2
    assert c.anchorkv_seed == 42
    # dataclasses.replace works, as the seed's KVCacheBuilder relies on.
    assert dataclasses.replace(c, anchorkv_theta=0.1).anchorkv_theta == 0.1


@pytest.mark.parametrize("field,value", [
    ("anchorkv_theta", -0.1), ("anchorkv_theta", 1.5), ("anchorkv_window", -1),
    ("anchorkv_rho", 2.0), ("anchorkv_anchor_frac", 0.0), ("anchorkv_residual_bits", 5),
    ("anchorkv_residual_bits", 0), ("anchorkv_scale", "max"), ("anchorkv_allocation", "x"),
    ("anchorkv_compress_at", "never"), ("anchorkv_seed", -1), ("anchorkv_threads", -3),
])
def test_invalid_config_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError) as e:
        anchorkv.KVCacheConfig(**{field: value})
    short = field.replace("anchorkv_", "")
    assert short in str(e.value)


def test_config_type_errors_name_the_field():
    with pytest.raises(TypeError, match="anchorkv_window"):
        anchorkv.KVCacheConfig(anchorkv_window=3.5)
    with pytest.raises(TypeError, match="anchorkv_theta"):
        anchorkv.KVCacheConfig(anchorkv_theta="0.1")


# ---------------------------------------------------------------- seed invariants

def test_update_and_fetch_shapes_dtype_and_never_drops_tokens():
    k, v = kv()
    cache = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig())
    K, V = cache.update_and_fetch(k, v)
    assert K.shape == (1, 2, 256, 64) and V.shape == (1, 2, 256, 64)
    assert K.dtype == np.float16 and V.dtype == np.float16
    assert cache.offset == 256
    assert cache.tokens_total == 2 * 256
    assert cache.tokens_kept == cache.tokens_total
    assert cache.is_trimmable() is False
    assert not hasattr(cache, "bits")
    for step in range(3):
        t = np.full((1, 2, 1, 64), 0.5 + step, dtype=np.float32)
        K, V = cache.update_and_fetch(t, -t)
        assert K.shape == (1, 2, 257 + step, 64)
        # Decode tokens come back exactly.
        assert np.array_equal(K[:, :, -1], t[:, :, 0].astype(np.float16))
        assert np.array_equal(V[:, :, -1], (-t[:, :, 0]).astype(np.float16))
        assert cache.tokens_kept == cache.tokens_total == 2 * (257 + step)


def test_byte_accounting_formulas():
    # B=1, H=2, S=512, D=64, anchor_frac 1/16 -> 32 anchors per head, theta 0.2.
    k, v = kv(S=512)
    cfg = anchorkv.KVCacheConfig(anchorkv_anchor_frac=1 / 16, anchorkv_theta=0.2)
    cache = anchorkv.AnchorKVKVCache(cfg)
    cache.update_and_fetch(k, v)
    S, D, H, n_anchor = 512, 64, 2, 32
    full = H * S * D * 4
    base = H * (n_anchor * D * 4 + (S - n_anchor) * 16)
    b_res = (D * 2 + 7) // 8 + 2
    n_res = int(np.floor((0.2 * full - base) / b_res))
    assert cache.full_seq_bytes == full
    assert cache.n_anchor_total == H * n_anchor
    assert cache.n_residual_total == n_res
    assert cache.anchorkv_bytes == base + n_res * b_res
    assert cache.compression_ratio == pytest.approx(full / (base + n_res * b_res))
    t = np.zeros((1, 2, 1, 64), np.float32)
    cache.update_and_fetch(t, t)
    assert cache.anchorkv_bytes == base + n_res * b_res + H * D * 4
    assert cache.full_seq_bytes == full + H * D * 4


def test_compact_metadata_layout():
    k, v = kv(S=512)
    seed = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_anchor_frac=1 / 16, anchorkv_theta=0.2))
    comp = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_anchor_frac=1 / 16, anchorkv_theta=0.2,
                                                           anchorkv_metadata="compact"))
    tight = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_anchor_frac=1 / 16, anchorkv_theta=0.2,
                                                            anchorkv_metadata="tight"))
    seed.update_and_fetch(k, v)
    comp.update_and_fetch(k, v)
    tight.update_and_fetch(k, v)
    # Same bytes budget, cheaper metadata: more residuals.
    assert tight.n_residual_total > comp.n_residual_total > seed.n_residual_total
    assert abs(comp.anchorkv_bytes - seed.anchorkv_bytes) < 2 * 18
    assert abs(tight.anchorkv_bytes - seed.anchorkv_bytes) < 2 * 18
    assert tight.config.anchorkv_metadata == "tight"
    with pytest.raises(ValueError, match="metadata"):
        anchorkv.KVCacheConfig(anchorkv_metadata="tiny")


def test_deterministic_for_a_fixed_seed_and_thread_count():
    k, v = kv(B=2, H=3, S=700)
    outs = []
    for threads in (1, 2, 1):
        c = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_threads=threads, anchorkv_anchor_frac=1 / 32))
        outs.append(c.update_and_fetch(k, v))
    for K, V in outs[1:]:
        assert np.array_equal(K, outs[0][0]) and np.array_equal(V, outs[0][1])
    # With a short window the seeded uniform share picks anchors: the seed matters.
    picks = [anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_seed=s, anchorkv_window=4,
                                                             anchorkv_anchor_frac=1 / 32)).update_and_fetch(k, v)[0]
             for s in (42, 42, 7)]
    assert np.array_equal(picks[0], picks[1])
    assert not np.array_equal(picks[0], picks[2])


def test_anchor_frac_one_is_lossless_like_the_full_cache():
    k, v = kv(S=100)
    a = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_anchor_frac=1.0))
    f = anchorkv.FullKVCache()
    Ka, Va = a.update_and_fetch(k, v)
    Kf, Vf = f.update_and_fetch(k, v)
    assert np.array_equal(Ka, Kf) and np.array_equal(Va, Vf)
    assert np.array_equal(Kf, k.astype(np.float16))
    assert f.is_trimmable() and f.trim(10) == 10 and f.offset == 90


def test_float16_and_noncontiguous_inputs_match_float32():
    k, v = kv(S=128)
    ref = anchorkv.AnchorKVKVCache().update_and_fetch(k, v)
    out16 = anchorkv.AnchorKVKVCache().update_and_fetch(k.astype(np.float16), v.astype(np.float16))
    assert np.array_equal(ref[0], out16[0]) and np.array_equal(ref[1], out16[1])
    # [B, S, H, D] memory viewed as [B, H, S, D]; and a reversed-stride view.
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    vt = np.ascontiguousarray(v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not kt.flags["C_CONTIGUOUS"]
    outt = anchorkv.AnchorKVKVCache().update_and_fetch(kt, vt)
    assert np.array_equal(ref[0], outt[0])
    kr = np.ascontiguousarray(k[:, :, :, ::-1])[:, :, :, ::-1]
    outr = anchorkv.AnchorKVKVCache().update_and_fetch(kr, v)
    assert np.array_equal(ref[0], outr[0])


def test_chunked_prefill_and_compress_now():
    k, v = kv(S=200)
    cfg = anchorkv.KVCacheConfig(anchorkv_compress_at="first_decode")
    c = anchorkv.AnchorKVKVCache(cfg)
    c.update_and_fetch(k[:, :, :100], v[:, :, :100])
    c.update_and_fetch(k[:, :, 100:], v[:, :, 100:])
    assert not c.is_compressed and c.compression_ratio == 1.0
    c.update_and_fetch(k[:, :, :1], v[:, :, :1])
    assert c.is_compressed and c.offset == 201
    d = anchorkv.AnchorKVKVCache(cfg)
    d.update_and_fetch(k, v)
    d.compress_now()
    assert d.is_compressed
    with pytest.raises(RuntimeError, match="already holds a compressed segment"):
        d.compress_now()


def test_streaming_stays_compressed_through_decode_and_survives_state():
    k, v = kv(S=600, D=128)
    cfg = anchorkv.KVCacheConfig(anchorkv_metadata="tight", anchorkv_segment_tokens=128,
                                 anchorkv_recent_tokens=32)
    c = anchorkv.AnchorKVKVCache(cfg)
    c.update_and_fetch(k[:, :, :200], v[:, :, :200])
    ratios = []
    for t in range(200, 600):
        K, V = c.update_and_fetch(k[:, :, t:t + 1], v[:, :, t:t + 1])
        ratios.append(c.compression_ratio)
    assert K.shape == (1, 2, 600, 128) and c.tokens_kept == c.tokens_total
    # Fewer than 32 + 128 + 32 exact tokens (recent window, a segment, the steps a segment has
    # to compress off the decode path): 600 tokens at theta 0.05 end 5x smaller than fp16
    # (4 segments of 128 at 20x and 88 exact: 600 / (25.6 + 88)), where the seed's cache,
    # its decoded tokens exact, holds 600 / (10 + 400) = 1.5x.
    assert min(ratios[100:]) > 1.5 and ratios[-1] > 4.5
    np.testing.assert_array_equal(K[:, :, -32:], k[:, :, -32:].astype(np.float16))  # the recent window is exact
    d = anchorkv.AnchorKVKVCache(cfg)
    d.state = c.state
    assert d.config.anchorkv_segment_tokens == 128 and d.config.anchorkv_recent_tokens == 32
    d.update_and_fetch(k[:, :, :1], v[:, :, :1])
    c.update_and_fetch(k[:, :, :1], v[:, :, :1])
    assert c.state.tobytes() == d.state.tobytes()
    with pytest.raises(ValueError, match="segment_tokens"):
        anchorkv.KVCacheConfig(anchorkv_segment_tokens=-1)


def test_streaming_segments_extend_the_one_before_and_keep_the_bytes():
    k, v = kv(S=600, D=128)
    apart = anchorkv.KVCacheConfig(anchorkv_metadata="tight", anchorkv_segment_tokens=64,
                                   anchorkv_recent_tokens=16)
    joined = anchorkv.KVCacheConfig(anchorkv_metadata="tight", anchorkv_segment_tokens=64,
                                    anchorkv_recent_tokens=16, anchorkv_extend_tokens=512)
    a, j = anchorkv.AnchorKVKVCache(apart), anchorkv.AnchorKVKVCache(joined)
    for t in range(600):
        a.update_and_fetch(k[:, :, t:t + 1], v[:, :, t:t + 1])
        j.update_and_fetch(k[:, :, t:t + 1], v[:, :, t:t + 1])
    assert j.config.anchorkv_extend_tokens == 512
    # The same tokens compressed, in fewer rows: the bytes within the per-row exponents of the tight layout.
    assert abs(j.anchorkv_bytes - a.anchorkv_bytes) < 0.01 * a.anchorkv_bytes
    assert j.compression_ratio > 3
    d = anchorkv.AnchorKVKVCache(joined)
    d.state = j.state
    assert d.config.anchorkv_extend_tokens == 512 and d.state.tobytes() == j.state.tobytes()
    with pytest.raises(ValueError, match="extend_tokens"):
        anchorkv.KVCacheConfig(anchorkv_extend_tokens=-1)


def test_builder_propagates_the_config():
    cfg = anchorkv.KVCacheConfig(anchorkv_theta=0.1)
    caches = anchorkv.KVCacheBuilder.for_layers(4, cfg)
    assert len(caches) == 4 and all(c.config is cfg for c in caches)
    assert len({id(c) for c in caches}) == 4
    with pytest.raises(ValueError):
        anchorkv.KVCacheBuilder.for_layers(-1, cfg)


# ---------------------------------------------------------------- bad input

def state(c):
    K, V = c.fetch()
    return (c.offset, c.anchorkv_bytes, c.full_seq_bytes, c.tokens_total, K.tobytes(), V.tobytes())


@pytest.mark.parametrize("case", ["shape_mismatch", "nan", "inf", "too_big", "heads_change", "ndim", "d_zero"])
def test_bad_input_raises_value_error_and_leaves_cache_unchanged(case):
    k, v = kv(S=64)
    c = anchorkv.AnchorKVKVCache()
    c.update_and_fetch(k, v)
    before = state(c)
    t = np.ones((1, 2, 3, 64), np.float32)
    args = {
        "shape_mismatch": (t, np.ones((1, 2, 4, 64), np.float32)),
        "nan": (np.where(t > 0, np.nan, t).astype(np.float32), t),
        "inf": (t, np.full_like(t, np.inf)),
        "too_big": (t * np.float32(70000), t),
        "heads_change": (np.ones((1, 3, 1, 64), np.float32),) * 2,
        "ndim": (np.ones((2, 3, 64), np.float32),) * 2,
        "d_zero": (np.ones((1, 2, 1, 0), np.float32),) * 2,
    }[case]
    with pytest.raises(ValueError, match=r"update_and_fetch\]"):
        c.update_and_fetch(*args)
    assert state(c) == before


def test_float64_is_cast_like_the_seed():
    k, v = kv(S=64)
    a = anchorkv.AnchorKVKVCache().update_and_fetch(k.astype(np.float64), v.astype(np.float64))
    b = anchorkv.AnchorKVKVCache().update_and_fetch(k, v)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="non-finite"):  # beyond float32: Inf after the cast
        anchorkv.AnchorKVKVCache().update_and_fetch(np.full((1, 1, 2, 4), 1e300), np.ones((1, 1, 2, 4)))


@pytest.mark.parametrize("bad", [[[1.0]], np.ones((1, 2, 3, 4), np.int32), np.ones((1, 2, 3, 4), np.complex64),
                                 np.ones((1, 2, 3, 4), bool)])
def test_wrong_types_raise_type_error(bad):
    c = anchorkv.AnchorKVKVCache()
    with pytest.raises(TypeError):
        c.update_and_fetch(bad, bad)
    assert c.offset == 0


# ---------------------------------------------------------------- attention

def dense_attention(q, K, V):
    """Causal attention in float64: query i sits at position n - Sq + i."""
    B, Hq, Sq, D = q.shape
    H, n = K.shape[1], K.shape[2]
    G = Hq // H
    out = np.zeros(q.shape)
    for b in range(B):
        for hq in range(Hq):
            for i in range(Sq):
                P = n - Sq + i
                s = K[b, hq // G, :P + 1].astype(np.float64) @ q[b, hq, i].astype(np.float64) / np.sqrt(D)
                p = np.exp(s - s.max())
                out[b, hq, i] = p @ V[b, hq // G, :P + 1].astype(np.float64) / p.sum()
    return out


def rope(x, positions, base, style, freq_scale=1.0):
    """RoPE of x [..., S, D] at the given positions, in float64 (pair i scaled by freq_scale[i])."""
    D = x.shape[-1]
    theta = np.asarray(positions, np.float64)[:, None] * base ** (-2.0 * np.arange(D // 2) / D) * freq_scale
    c, s = np.cos(theta), np.sin(theta)
    x = x.astype(np.float64)
    a, b = (x[..., 0::2], x[..., 1::2]) if style == "normal" else (x[..., :D // 2], x[..., D // 2:])
    ra, rb = a * c - b * s, a * s + b * c
    out = np.empty_like(x)
    if style == "normal":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :D // 2], out[..., D // 2:] = ra, rb
    return out


def test_attend_applies_rope_to_keys_given_before_it():
    k, v = kv(B=1, H=2, S=500)
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    base, style, offset = 10000.0, "neox", 5
    plain = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_theta=0.2, anchorkv_anchor_frac=1 / 16))
    coded = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(
        anchorkv_theta=0.2, anchorkv_anchor_frac=1 / 16, anchorkv_key_rope_base=base, anchorkv_key_rope_style=style,
        anchorkv_key_rope_offset=offset))
    assert coded.config.anchorkv_key_rope_base == base and coded.config.anchorkv_key_rope_offset == offset
    for cache in (plain, coded):
        K, V = cache.update_and_fetch(k, v)  # keys come back before RoPE either way
        assert np.sum((K - k) ** 2) / np.sum(k ** 2) < 0.2
        n = K.shape[2]
        ref = dense_attention(rope(q, [offset + n - 1], base, style), rope(K, offset + np.arange(n), base, style), V)
        y = anchorkv.attend(q, cache, rope_base=base, rope_style=style, rope_offset=offset)
        assert np.sum((y - ref) ** 2) / np.sum(ref ** 2) < 1e-5
        # fp32 anchor scores (and residuals): as close, and the two within bf16 rounding of each other
        y32 = anchorkv.attend(q, cache, rope_base=base, rope_style=style, rope_offset=offset,
                              bf16_residuals=False, bf16_scores=False)
        assert np.sum((y32 - ref) ** 2) / np.sum(ref ** 2) < 1e-5
        assert np.sum((y - y32) ** 2) / np.sum(y32 ** 2) < 1e-5
    with pytest.raises(ValueError, match="key_rope"):  # coded for one RoPE, attended with another
        anchorkv.attend(q, coded, rope_base=base, rope_style=style, rope_offset=offset + 1)
    with pytest.raises(ValueError, match="key_rope"):
        anchorkv.attend(q, coded)
    with pytest.raises(ValueError, match="style"):
        anchorkv.attend(q, plain, rope_base=base, rope_style="sideways")
    with pytest.raises(ValueError, match="key_rope"):
        anchorkv.KVCacheConfig(anchorkv_key_rope_base=0.5)


def test_attend_matches_dense_attention_on_both_caches():
    k, v = kv(B=1, H=2, S=600)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 8, 3, 64)).astype(np.float32)
    full = anchorkv.FullKVCache()
    full.update_and_fetch(k, v)
    ref = dense_attention(q, *full.fetch())
    y = anchorkv.attend(q, full)
    assert y.dtype == np.float32 and y.shape == q.shape
    assert np.sum((y - ref) ** 2) / np.sum(ref ** 2) < 1e-9
    comp = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_theta=0.2, anchorkv_anchor_frac=1 / 16))
    K, V = comp.update_and_fetch(k, v)
    # Against attention over the fp16 reconstruction: equal up to that rounding.
    yc = anchorkv.attend(q, comp)
    refc = dense_attention(q, K, V)
    assert np.sum((yc - refc) ** 2) / np.sum(refc ** 2) < 1e-5
    y32 = anchorkv.attend(q, comp, bf16_residuals=False)  # fp32 residual arithmetic: as close, or closer
    assert np.sum((y32 - refc) ** 2) / np.sum(refc ** 2) < 1e-5
    assert np.sum((yc - y32) ** 2) / np.sum(y32 ** 2) < 1e-5
    assert anchorkv.attend(q, comp, dtype=np.float16).dtype == np.float16
    with pytest.raises(ValueError, match="multiple"):
        anchorkv.attend(np.ones((1, 3, 1, 64), np.float32), comp)
    with pytest.raises(TypeError):
        anchorkv.attend(q, object())


def test_update_stores_like_update_and_fetch_without_the_dense_result():
    k, v = kv(B=1, H=2, S=300)
    cfg = anchorkv.KVCacheConfig(anchorkv_theta=0.1)
    a, b = anchorkv.AnchorKVKVCache(cfg), anchorkv.AnchorKVKVCache(cfg)
    assert a.update(k, v) is None
    K, V = b.update_and_fetch(k, v)
    A, AV = a.fetch()
    assert np.array_equal(A, K) and np.array_equal(AV, V) and a.anchorkv_bytes == b.anchorkv_bytes
    step = k[:, :, :1].copy()
    a.update(step, step)
    assert a.offset == 301 and a.fetch()[0].shape == (1, 2, 301, 64)
    for c in (anchorkv.FullKVCache(), anchorkv.SnapKVCache(theta=0.1)):
        c.update(k, v)
        assert c.offset == 300
    with pytest.raises(ValueError, match="update"):
        a.update(np.ones((1, 2, 1, 32), np.float32), np.ones((1, 2, 1, 32), np.float32))
    assert a.offset == 301  # unchanged by the failed call


def test_observation_queries_steer_scoring():
    """Real queries of the last positions pick what SnapKV keeps and AnchorKV anchors."""
    B, H, S, D, G, W = 1, 2, 300, 64, 2, 8
    rng = np.random.default_rng(3)
    k = rng.standard_normal((B, H, S, D)).astype(np.float32)
    v = rng.standard_normal((B, H, S, D)).astype(np.float32)
    target = [41, 177]
    q = np.stack([np.repeat(5.0 * k[0, h, target[h]][None], G * W, 0).reshape(G, W, D) for h in range(H)])
    q = q.reshape(B, H * G, W, D).astype(np.float32)
    snap = anchorkv.SnapKVCache(theta=0.2)  # 60 tokens: its 32-token window and 28 scored
    K, _ = snap.update_and_fetch(k, v, q)
    for h in range(H):
        assert any(np.array_equal(K[0, h, i], k[0, h, target[h]].astype(np.float16)) for i in range(K.shape[2]))
    cfg = anchorkv.KVCacheConfig(anchorkv_theta=0.2, anchorkv_window=W, anchorkv_rho=1.0,
                                 anchorkv_anchor_frac=16 / S)
    with_q, without = anchorkv.AnchorKVKVCache(cfg), anchorkv.AnchorKVKVCache(cfg)
    with_q.update(k, v, queries=q)
    without.update(k, v)
    assert not np.array_equal(with_q.fetch()[0], without.fetch()[0])
    auto = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_theta=0.3, anchorkv_anchor_count="auto"))
    auto.update(k, v, queries=q)
    assert auto.anchorkv_bytes <= 0.3 * auto.full_seq_bytes
    assert auto.config.anchorkv_anchor_count == "auto"
    with pytest.raises(ValueError, match="anchor_count"):
        anchorkv.KVCacheConfig(anchorkv_anchor_count="some")
    with pytest.raises(ValueError, match="queries"):
        anchorkv.AnchorKVKVCache(cfg).update(k, v, queries=q[:, :3])  # 3 query heads for 2 KV heads
    bad = q.copy()
    bad[0, 0, 0, 0] = np.nan
    c = anchorkv.SnapKVCache(theta=0.05)
    with pytest.raises(ValueError, match="non-finite"):
        c.update_and_fetch(k, v, bad)
    assert c.offset == 0


def test_baseline_caches():
    k, v = kv(B=1, H=2, S=400)
    q = anchorkv.QuantizedKVCache(bits=4)
    K, V = q.update_and_fetch(k, v)
    assert K.shape == k.shape and q.nbytes == 2 * 400 * 2 * (32 + 4)
    assert np.abs(K.astype(np.float32) - k).max() < 0.5
    s = anchorkv.StreamingLLMCache(theta=0.1)
    K, V = s.update_and_fetch(k, v)
    assert K.shape == (1, 2, 40, 64) and s.tokens_kept == 80 and s.tokens_total == 800
    assert np.array_equal(K[:, :, :4], k[:, :, :4].astype(np.float16))
    n = anchorkv.SnapKVCache(theta=0.1)
    K, V = n.update_and_fetch(k, v)
    assert K.shape == (1, 2, 40, 64) and n.nbytes == 2 * 40 * 64 * 4
    y = anchorkv.attend(np.ones((1, 2, 1, 64), np.float32), n)
    assert y.shape == (1, 2, 1, 64)
    kv2 = anchorkv.KIVICache(bits=2)
    K, V = kv2.update_and_fetch(k, v)
    assert K.shape == k.shape and kv2.tokens_kept == kv2.tokens_total
    assert np.array_equal(K[:, :, -16:], k[:, :, -16:].astype(np.float16))  # fp16 window
    tq = anchorkv.TurboQuantCache(key_bits=2.5, value_bits=2)
    K, V = tq.update_and_fetch(k, v)
    assert K.shape == k.shape and tq.name == "turboquant:k2.5v2"
    assert tq.nbytes == 2 * 400 * ((8 + 2 + 12 + 2) + (16 + 2)) + 2 * 2 * 64 * 4  # codes, scales, channel orders
    err = np.linalg.norm(K.astype(np.float32) - k) / np.linalg.norm(k)
    assert err < 0.35
    y = anchorkv.attend(np.ones((1, 2, 1, 64), np.float32), tq)
    assert y.shape == (1, 2, 1, 64) and np.isfinite(y).all()
    with pytest.raises(ValueError, match="bits"):
        anchorkv.TurboQuantCache(key_bits=5)
    h = anchorkv.H2OCache(theta=0.1)
    K, V = h.update_and_fetch(k, v)
    assert K.shape[2] < 400 and h.nbytes <= 0.1 * h.full_seq_bytes
    with pytest.raises(ValueError, match="bits"):
        anchorkv.QuantizedKVCache(bits=3)
    with pytest.raises(ValueError, match="theta"):
        anchorkv.SnapKVCache(theta=2.0)


# ---------------------------------------------------------------- GIL

def test_gil_is_released_during_compression():
    k, v = kv(B=1, H=8, S=4096, D=128)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    cache = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_threads=1))
    th = threading.Thread(target=ticker)
    th.start()
    time.sleep(0.01)
    start = len(ticks)
    t0 = time.perf_counter()
    cache.update_and_fetch(k, v)
    elapsed = time.perf_counter() - t0
    stop.set()
    th.join()
    during = len(ticks) - start
    # Holding the GIL for the whole call would starve the ticker (at most a tick or two).
    assert elapsed > 0.02, "workload too small to observe"
    assert during >= 5, f"ticker ran {during} times during a {elapsed:.3f}s call"


# ---------------------------------------------------------------- README

def test_readme_python_example_runs_as_written():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_attend_applies_scaled_rope_frequencies():
    # A model's RoPE scaling (Llama 3.1's rope_freqs, YaRN): per-pair frequency multipliers, inside
    # attention and in key residuals coded at their positions; a cache coded for one scaling refuses another.
    k, v = kv(B=1, H=2, S=400)
    q = np.random.default_rng(4).standard_normal((1, 4, 1, 64)).astype(np.float32)
    base, scale = 500000.0, np.linspace(1.0, 0.125, 32)
    coded = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(
        anchorkv_theta=0.2, anchorkv_anchor_frac=1 / 16, anchorkv_key_rope_base=base,
        anchorkv_key_rope_freq_scale=tuple(scale)))
    assert coded.config.anchorkv_key_rope_freq_scale == tuple(scale)
    K, V = coded.update_and_fetch(k, v)
    n = K.shape[2]
    ref = dense_attention(rope(q, [n - 1], base, "normal", scale), rope(K, np.arange(n), base, "normal", scale), V)
    y = anchorkv.attend(q, coded, rope_base=base, rope_freq_scale=scale)
    assert np.sum((y - ref) ** 2) / np.sum(ref ** 2) < 1e-5
    unscaled = dense_attention(rope(q, [n - 1], base, "normal"), rope(K, np.arange(n), base, "normal"), V)
    assert np.sum((unscaled - ref) ** 2) / np.sum(ref ** 2) > 1e-3  # the scales matter here
    with pytest.raises(ValueError, match="key_rope"):
        anchorkv.attend(q, coded, rope_base=base)
    with pytest.raises(ValueError, match="freq_scale"):
        anchorkv.attend(q, coded, rope_base=base, rope_freq_scale=scale[:-1])
    with pytest.raises(ValueError, match="freq_scale"):
        anchorkv.KVCacheConfig(anchorkv_key_rope_base=base, anchorkv_key_rope_freq_scale=(1.0, -1.0))
