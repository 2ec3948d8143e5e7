#!/usr/bin/env python3
"""Would streaming segments gain from anchors shared across segments?

A probe on real keys and values (an `.akv` dump of one prompt, `anchorkv
dump-kv`), before any format change: the prompt is cut into streaming
segments as the runtime does (SEG tokens behind a window of WINDOW exact
ones), each segment picks its anchors as AnchorKV's observation scoring does
(the mean attention of the WINDOW queries after it, top-k), and every other
token is approximated by one anchor and a coefficient,

  own         the best of its own segment's anchors (today's format), or
  dictionary  the best of its own and every earlier segment's anchors
              (an append-only dictionary per KV head: any prefix of segments
              still decodes on its own).

Both then give the same share of tokens (--residual-share, per side) a 2-bit
residual, modelled by its expected distortion (the codec's 0.1175 of the
residual's energy after the Hadamard rotation, as compress::residual_distortion
says), on the tokens whose anchor error is largest. Reported per model: the
keys' and values' relative error over the compressed tokens, and the
attention-output error of the model's own later queries over the compressed
prefix plus the exact window (||y^ - y||^2 / ||y||^2, mean over query heads
and positions). Index bits are not counted: a dictionary of n anchors needs
ceil(log2 n) bits per token where a segment's own needs ceil(log2 k).

  bench/anchor_dictionary_probe.py d128.akv [--seg 128 --window 32 --anchors 1 --residual-share 0.32]
"""
import argparse
import json
import struct
import sys

import numpy as np

RESIDUAL_DISTORTION_2BIT = 0.1175


def read_akv(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n_layers, n_heads, n_kv, D, T, dtype, _res, payload = struct.unpack_from("<4sIIIIIQIIQ", data, 0)
    if magic != b"AKVD" or dtype != 0:
        raise SystemExit(f"{path}: not an f32 .akv dump")
    off, base, style = 48, 10000.0, 0
    if version == 2:
        base, style, _ = struct.unpack_from("<dII", data, 48)
        off = 64
    arr = np.frombuffer(data, dtype="<f4", offset=off)
    layers, pos = [], 0
    for _ in range(n_layers):
        q = arr[pos:pos + n_heads * T * D].reshape(n_heads, T, D); pos += q.size
        k_post = arr[pos:pos + n_kv * T * D].reshape(n_kv, T, D); pos += k_post.size
        k_pre = arr[pos:pos + n_kv * T * D].reshape(n_kv, T, D); pos += k_pre.size
        v = arr[pos:pos + n_kv * T * D].reshape(n_kv, T, D); pos += v.size
        layers.append((q, k_post, k_pre, v))
    return layers, base, style


def rope(x, positions, base, style):
    """x [T, D] rotated to its positions (adjacent pairs, or NeoX halves)."""
    D = x.shape[1]
    inv = base ** (-np.arange(0, D, 2) / D)
    ang = positions[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    out = np.empty_like(x)
    if style == 0:
        a, b = x[:, 0::2], x[:, 1::2]
        out[:, 0::2], out[:, 1::2] = a * c - b * s, a * s + b * c
    else:
        h = D // 2
        a, b = x[:, :h], x[:, h:]
        out[:, :h], out[:, h:] = a * c - b * s, a * s + b * c
    return out


def approximate(x, anchors, candidates):
    """x [n, D] tokens of one segment; anchors: their rows' indices into x
    (kept exact); candidates [m, D]: the anchor rows a token may use. Returns
    the residuals x - gamma * a (zero on the anchors)."""
    norms = np.linalg.norm(candidates, axis=1) + 1e-12
    dots = x @ candidates.T
    best = np.argmax(np.abs(dots) / norms[None, :], axis=1)
    a = candidates[best]
    gamma = dots[np.arange(len(x)), best] / (norms[best] ** 2)
    r = x - gamma[:, None] * a
    r[anchors] = 0
    return r


def observation(q_after, k_post_seg, v_seg, D):
    """The segment's observation: the attention of the WINDOW queries after
    it (each query's softmax over the segment), and their outputs y_w."""
    s = q_after @ k_post_seg.T / np.sqrt(D)
    s = np.exp(s - s.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    return s, s @ v_seg


def utilities(alpha, q_after, y_w, r_k_post, r_v, v_seg, D):
    """docs/spec.md 4.3: u_K(t) = mean_w a_wt^2 (q_w . r_t / sqrt D)^2 ||V_t - y_w||^2,
    u_V(t) = mean_w a_wt^2 ||r^V_t||^2."""
    a2 = alpha ** 2
    qr = (q_after @ r_k_post.T / np.sqrt(D)) ** 2
    dv = np.sum((v_seg[None, :, :] - y_w[:, None, :]) ** 2, axis=2)
    return np.mean(a2 * qr * dv, axis=0), np.mean(a2, axis=0) * np.sum(r_v ** 2, axis=1)


def with_residuals(r, utility, share, anchors, rng):
    """The share of the segment's tokens with the largest utility keep a 2-bit
    residual: their error becomes the codec's expected distortion."""
    u = utility.copy()
    u[anchors] = -1
    n = int(round(share * len(u)))
    top = np.argsort(-u, kind="stable")[:n]
    out = r.copy()
    e = np.sum(r[top] ** 2, axis=1)
    noise = rng.standard_normal(out[top].shape)
    noise *= np.sqrt(RESIDUAL_DISTORTION_2BIT * e / np.maximum(np.sum(noise ** 2, axis=1), 1e-30))[:, None]
    out[top] = noise
    return out


def compress_head(mode, q, k_post, k_pre, v, h, group, n_closed, seg, window, n_anchor, share, base, style, rng):
    """Residual errors [n, D] of keys (pre-RoPE) and values of the closed segments of KV head h."""
    D = k_pre.shape[2]
    rk = np.zeros((n_closed * seg, D))
    rv = np.zeros_like(rk)
    dict_k, dict_v = [], []
    for s in range(n_closed):
        lo, hi = s * seg, (s + 1) * seg
        qa = q[h * group:(h + 1) * group, hi:hi + window].reshape(-1, D).astype(np.float64)
        ks, vs = k_pre[h, lo:hi].astype(np.float64), v[h, lo:hi].astype(np.float64)
        kp = k_post[h, lo:hi].astype(np.float64)
        alpha, y_w = observation(qa, kp, vs, D)
        rows = np.sort(np.argsort(-alpha.mean(axis=0), kind="stable")[:n_anchor])
        dict_k.extend(ks[rows])
        dict_v.extend(vs[rows])
        r_k = approximate(ks, rows, np.array(dict_k) if mode == "dictionary" else ks[rows])
        r_v = approximate(vs, rows, np.array(dict_v) if mode == "dictionary" else vs[rows])
        u_k, u_v = utilities(alpha, qa, y_w, rope(r_k, np.arange(lo, hi, dtype=np.float64), base, style), r_v,
                             vs, D)
        rk[lo:hi] = with_residuals(r_k, u_k, share, rows, rng)
        rv[lo:hi] = with_residuals(r_v, u_v, share, rows, rng)
    return rk, rv


def probe(layers, base, style, seg, window, n_anchor, share, stride):
    out = {}
    for mode in ("own", "dictionary"):
        rng = np.random.default_rng(0)
        key_err = val_err = key_den = val_den = 0.0
        att = []
        for q, k_post, k_pre, v in layers:
            Hq, T, D = q.shape
            group = Hq // k_pre.shape[0]
            n_closed = (T - window) // seg  # segments with a full window after them
            n = n_closed * seg
            for h in range(k_pre.shape[0]):
                rk, rv = compress_head(mode, q, k_post, k_pre, v, h, group, n_closed, seg, window, n_anchor, share,
                                       base, style, rng)
                key_err += np.sum(rk ** 2)
                key_den += np.sum(k_pre[h, :n].astype(np.float64) ** 2)
                val_err += np.sum(rv ** 2)
                val_den += np.sum(v[h, :n].astype(np.float64) ** 2)
                k_hat = rope(k_pre[h, :n] - rk, np.arange(n, dtype=np.float64), base, style)
                v_hat = v[h, :n] - rv
                for p in range(n + window, T, stride):
                    K = k_post[h, :p + 1].astype(np.float64)
                    V = v[h, :p + 1].astype(np.float64)
                    Kh = np.concatenate([k_hat, K[n:]])
                    Vh = np.concatenate([v_hat, V[n:]])
                    for g in range(group):
                        qq = q[h * group + g, p].astype(np.float64)
                        y = softmax(K @ qq / np.sqrt(D)) @ V
                        yh = softmax(Kh @ qq / np.sqrt(D)) @ Vh
                        att.append(np.sum((yh - y) ** 2) / np.sum(y ** 2))
        out[mode] = {"key_rel_err": key_err / key_den, "value_rel_err": val_err / val_den,
                     "attention_err": float(np.mean(att)), "queries": len(att)}
    return out


def softmax(s):
    s = np.exp(s - s.max())
    return s / s.sum()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", nargs="+")
    ap.add_argument("--seg", type=int, default=128)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--anchors", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--residual-share", type=float, default=0.32)
    ap.add_argument("--stride", type=int, default=1, help="every stride-th later position is a query")
    a = ap.parse_args()
    results = []
    for path in a.dump:
        layers, base, style = read_akv(path)
        for k in a.anchors:
            r = probe(layers, base, style, a.seg, a.window, k, a.residual_share, a.stride)
            row = {"dump": path.rsplit("/", 1)[-1], "seg": a.seg, "window": a.window, "anchors_per_segment": k,
                   "residual_share": a.residual_share, **r}
            results.append(row)
            print(f"{row['dump']:>12} k={k}: "
                  + "  ".join(f"{m}: K {r[m]['key_rel_err']:.4f} V {r[m]['value_rel_err']:.4f} "
                              f"att {r[m]['attention_err']:.5f}" for m in ("own", "dictionary"))
                  + f"  (att ratio {r['own']['attention_err'] / r['dictionary']['attention_err']:.2f}x)",
                  file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
