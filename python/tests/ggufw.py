"""A small GGUF v3 writer and GGML block quantizers for tests (numpy only).

The quantizers produce the bytes of a block type and the exact values the
format defines for those bytes (computed here from the quantized integers and
fp16 scales), so a model written with them has a known float64 reference."""

import struct

import numpy as np

F32, F16, Q4_0, Q8_0, Q4_K, Q6_K = 0, 1, 2, 8, 12, 14


def _f16(x):
    return np.asarray(x, np.float32).astype(np.float16)


def q8_0(x):
    """x [rows, n], n % 32 == 0 -> (bytes, values)."""
    b = x.reshape(-1, 32).astype(np.float64)
    d = _f16(np.abs(b).max(1) / 127.0)
    df = d.astype(np.float64)
    q = np.where(df[:, None] > 0, np.rint(b / np.where(df > 0, df, 1)[:, None]), 0).clip(-128, 127).astype(np.int8)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], 1)
    return raw.tobytes(), (df[:, None] * q).reshape(x.shape)


def q4_0(x):
    """32-element blocks: x = d*(q - 8), q in 0..15 (element i in the low nibble
    of byte i, element 16 + i in its high nibble); d from the block's value of
    largest magnitude, as ggml quantizes."""
    b = x.reshape(-1, 32).astype(np.float64)
    mx = b[np.arange(b.shape[0]), np.abs(b).argmax(1)]
    d = _f16(mx / -8.0)
    df = d.astype(np.float64)
    q = np.where(df[:, None] != 0, np.rint(b / np.where(df != 0, df, 1)[:, None]) + 8, 8).clip(0, 15).astype(np.int64)
    qs = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), qs], 1)
    return raw.tobytes(), (df[:, None] * (q - 8)).reshape(x.shape)


def q4_k(x):
    """256-element super-blocks: 8 groups of 32, x = d*sc*q - dmin*m."""
    b = x.reshape(-1, 8, 32).astype(np.float64)
    lo, hi = b.min(2), b.max(2)
    mins = np.maximum(-lo, 0.0)
    scale = (hi + mins) / 15.0
    d = _f16(scale.max(1) / 63.0)
    dmin = _f16(mins.max(1) / 63.0)
    df, mf = d.astype(np.float64), dmin.astype(np.float64)
    sc = np.where(df[:, None] > 0, np.rint(scale / np.where(df > 0, df, 1)[:, None]), 0).clip(0, 63).astype(np.int64)
    m = np.where(mf[:, None] > 0, np.rint(mins / np.where(mf > 0, mf, 1)[:, None]), 0).clip(0, 63).astype(np.int64)
    step = (df[:, None] * sc)[:, :, None]
    off = (mf[:, None] * m)[:, :, None]
    q = np.where(step > 0, np.rint((b + off) / np.where(step > 0, step, 1)), 0).clip(0, 15).astype(np.int64)
    vals = step * q - off
    nb = b.shape[0]
    scales = np.zeros((nb, 12), np.int64)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(nb, 128)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          scales.astype(np.uint8), qs.astype(np.uint8)], 1)
    return raw.tobytes(), vals.reshape(x.shape)


def q6_k(x):
    """256-element super-blocks: 16 groups of 16, x = d*sc*(q - 32)."""
    b = x.reshape(-1, 16, 16).astype(np.float64)
    scale = np.abs(b).max(2) / 31.0
    d = _f16(scale.max(1) / 127.0)
    df = d.astype(np.float64)
    sc = np.where(df[:, None] > 0, np.rint(scale / np.where(df > 0, df, 1)[:, None]), 0).clip(-128, 127).astype(np.int64)
    step = (df[:, None] * sc)[:, :, None]
    q = (np.where(step != 0, np.rint(b / np.where(step != 0, step, 1)), 0) + 32).clip(0, 63).astype(np.int64)
    vals = step * (q - 32)
    nb = b.shape[0]
    qq = q.reshape(nb, 2, 4, 32)  # half, quarter, lane
    ql = np.concatenate([(qq[:, :, 0] & 15) | ((qq[:, :, 2] & 15) << 4),
                         (qq[:, :, 1] & 15) | ((qq[:, :, 3] & 15) << 4)], 2).reshape(nb, 128)
    qh = sum((qq[:, :, k] >> 4) << (2 * k) for k in range(4)).reshape(nb, 64)
    raw = np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), sc.astype(np.int8).view(np.uint8),
                          d.view(np.uint8).reshape(-1, 2)], 1)
    return raw.tobytes(), vals.reshape(x.shape)


QUANTIZERS = {Q4_0: q4_0, Q8_0: q8_0, Q4_K: q4_k, Q6_K: q6_k}


def encode(x, typ):
    """x [rows, n] float -> (bytes, values as stored)."""
    x = np.asarray(x, np.float64)
    if typ == F32:
        v = x.astype(np.float32)
        return v.tobytes(), v.astype(np.float64)
    if typ == F16:
        v = x.astype(np.float16)
        return v.tobytes(), v.astype(np.float64)
    return QUANTIZERS[typ](x)


# GGUF metadata value types
U32, I32, F32V, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9


def _val(t, v):
    if t == U32:
        return struct.pack("<I", v)
    if t == I32:
        return struct.pack("<i", v)
    if t == F32V:
        return struct.pack("<f", v)
    if t == BOOL:
        return struct.pack("<?", v)
    if t == STR:
        e = v.encode("utf-8") if isinstance(v, str) else v
        return struct.pack("<Q", len(e)) + e
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(_val(et, i) for i in items)


def write(path, meta, tensors, align=32):
    """meta: {key: (type, value)}; for arrays value = (elem_type, [items]).
    tensors: [(name, dims with ne[0] first, ggml type, bytes)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
    for k, (t, v) in meta.items():
        out += _val(STR, k) + struct.pack("<I", t) + _val(t, v)
    off = 0
    offsets = []
    for _, _, _, data in tensors:
        offsets.append(off)
        off += (len(data) + align - 1) // align * align
    for (name, dims, typ, _), o in zip(tensors, offsets):
        out += _val(STR, name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", typ, o)
    out += b"\0" * (-len(out) % align)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % align)
    with open(path, "wb") as f:
        f.write(out)
