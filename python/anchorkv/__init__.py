"""anchorkv: AnchorKV anchor-residual KV-cache compression (C++ core, numpy API).

Mirrors the seed's ``veloxquant_mlx.cache.anchorkv_cache.AnchorKVKVCache``:
one cache per transformer layer, ``update_and_fetch(keys, values)`` with
``[B, H, S, D]`` arrays, the first call with S > 1 compressed once, decode
tokens appended exactly, every token kept. Every cache is safe to share
between threads (concurrent readers, one writer at a time).

    >>> import numpy as np, anchorkv
    >>> cache = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig())
    >>> k = np.random.default_rng(0).standard_normal((1, 2, 512, 64)).astype(np.float32)
    >>> K, V = cache.update_and_fetch(k, k)
    >>> K.shape, K.dtype
    ((1, 2, 512, 64), dtype('float16'))
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from . import _core

__all__ = [
    "KVCacheConfig",
    "AnchorKVKVCache",
    "FullKVCache",
    "KVCacheBuilder",
    "QuantizedKVCache",
    "StreamingLLMCache",
    "SnapKVCache",
    "KIVICache",
    "TurboQuantCache",
    "H2OCache",
    "attend",
    "save_prompt_cache",
    "load_prompt_cache",
]

_SCALES = {"rms": _core.ResidualScale.rms, "absmax": _core.ResidualScale.absmax}
_ALLOCATIONS = {"pooled": _core.ResidualAllocation.pooled, "per_head": _core.ResidualAllocation.per_head}
_METADATA = {"seed": _core.MetadataLayout.seed, "compact": _core.MetadataLayout.compact,
             "tight": _core.MetadataLayout.tight}
_ANCHOR_COUNTS = {"fixed": _core.AnchorCount.fixed, "auto": _core.AnchorCount.auto}
_TRIGGERS = {
    "first_prefill": _core.CompressTrigger.first_prefill,
    "first_decode": _core.CompressTrigger.first_decode,
}


_ROPE_STYLES = {"normal": _core.RopeStyle.normal, "neox": _core.RopeStyle.neox}


def _rope_options(base, style, offset, where: str, prefix: str, freq_scale=None) -> "_core.RopeOptions":
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"[{where}] {prefix}base must be a number, got {type(base).__name__}")
    if style not in _ROPE_STYLES:
        raise ValueError(f"[{where}] invalid {prefix}style: must be one of {sorted(_ROPE_STYLES)}, got {style!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**62:
        raise ValueError(f"[{where}] invalid {prefix}offset: must be an int in [0, 2**62), got {offset!r}")
    r = _core.RopeOptions()
    r.enabled, r.base, r.style, r.position_offset = True, float(base), _ROPE_STYLES[style], offset
    if freq_scale is not None:
        scale = np.asarray(freq_scale, dtype=np.float64)
        if scale.ndim != 1 or not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise ValueError(f"[{where}] invalid {prefix}freq_scale: must be a 1-D sequence of finite values > 0")
        r.freq_scale = scale.tolist()
    return r


def _pick(table, field, value):
    if value not in table:
        raise ValueError(f"[anchorkv.KVCacheConfig] invalid {field}: must be one of {sorted(table)}, got {value!r}")
    return table[value]


@dataclasses.dataclass(frozen=True)
class KVCacheConfig:
    """Cache configuration; field names and defaults are the seed's.

    anchorkv_theta: fraction of the fp16 K+V bytes to retain (0 <= theta <= 1).
    anchorkv_window: trailing positions always kept as anchors; proxy queries (>= 0).
    anchorkv_rho: share of the non-window anchors chosen by attention score (0..1).
    anchorkv_anchor_frac: anchor budget k as a fraction of the prefill length (0 < f <= 1).
    anchorkv_residual_bits: bits per residual coordinate (1, 2, 3 or 4).
    anchorkv_seed: seeds the uniform anchor share and the codec rotation.

    Added by this project:
    anchorkv_scale: residual scale, "rms" (default, measured better) or "absmax" (seed).
    anchorkv_allocation: "pooled" across heads (seed) or "per_head".
    anchorkv_compress_at: "first_prefill" (seed) or "first_decode" (chunked prefill).
    anchorkv_metadata: "seed" (16 bytes per token), "compact" (8 bytes + 4 per anchor) or "tight"
        (4 bytes + 4 per anchor, 8-bit coefficients, at most 256 anchors per segment).
    anchorkv_anchor_count: "fixed" (seed: k = round(S * anchor_frac)) or "auto" (per layer,
        k * 2^i with the least estimated attention-output error within the byte budget).
    anchorkv_threads: worker threads, 0 = all cores (results are identical for any value).
    anchorkv_key_rope_base: None (default: keys are coded as given), or, for keys given
        BEFORE RoPE, the RoPE base attend() will apply (with anchorkv_key_rope_style "normal"
        or "neox" and anchorkv_key_rope_offset, the position of the cache's first token):
        key residuals are then coded at their positions and attend() scores them without
        rotating each one per call; attend() must be given that same RoPE.
    anchorkv_key_rope_freq_scale: None, or D/2 per-pair multipliers of the RoPE frequencies
        (a model's RoPE scaling: pair i turns by base^(-2i/D) * freq_scale[i] per position).
    anchorkv_segment_tokens: 0 (the seed: compress the first prefill once, keep later tokens
        exact), or T > 0: streaming, every token enters an exact tail and, whenever the tail
        holds anchorkv_recent_tokens + T tokens, its oldest T become a compressed segment, so
        a whole session stays compressed.
    anchorkv_recent_tokens: exact tokens kept behind the newest segment (streaming only).
    anchorkv_extend_tokens: streaming only: a closing segment extends the one before it (its
        tokens may take that segment's anchors too) while the two hold at most this many
        tokens; 0 keeps every segment on its own.
    """

    anchorkv_theta: float = 0.05
    anchorkv_window: int = 32
    anchorkv_rho: float = 0.7
    anchorkv_anchor_frac: float = 1.0 / 128
    anchorkv_residual_bits: int = 2
    anchorkv_seed: int = 42
    anchorkv_scale: str = "rms"
    anchorkv_allocation: str = "pooled"
    anchorkv_compress_at: str = "first_prefill"
    anchorkv_metadata: str = "seed"
    anchorkv_anchor_count: str = "fixed"
    anchorkv_threads: int = 0
    anchorkv_key_rope_base: Optional[float] = None
    anchorkv_key_rope_style: str = "normal"
    anchorkv_key_rope_offset: int = 0
    anchorkv_key_rope_freq_scale: Optional[tuple] = None
    anchorkv_segment_tokens: int = 0
    anchorkv_recent_tokens: int = 0
    anchorkv_extend_tokens: int = 0

    def __post_init__(self):
        self._native()  # validates; raises ValueError / TypeError naming the field

    @staticmethod
    def _from_native(c: "_core.AnchorKVConfig") -> "KVCacheConfig":
        def name_of(table, value):
            return next(k for k, v in table.items() if v == value)

        return KVCacheConfig(
            anchorkv_theta=c.theta, anchorkv_window=c.window, anchorkv_rho=c.rho, anchorkv_anchor_frac=c.anchor_frac,
            anchorkv_residual_bits=c.residual_bits, anchorkv_seed=c.seed, anchorkv_scale=name_of(_SCALES, c.scale),
            anchorkv_allocation=name_of(_ALLOCATIONS, c.allocation),
            anchorkv_compress_at=name_of(_TRIGGERS, c.trigger), anchorkv_metadata=name_of(_METADATA, c.metadata),
            anchorkv_anchor_count=name_of(_ANCHOR_COUNTS, c.anchor_count), anchorkv_threads=c.threads,
            anchorkv_key_rope_base=c.key_rope.base if c.key_rope.enabled else None,
            anchorkv_key_rope_style=name_of(_ROPE_STYLES, c.key_rope.style),
            anchorkv_key_rope_offset=c.key_rope.position_offset,
            anchorkv_key_rope_freq_scale=tuple(c.key_rope.freq_scale) if c.key_rope.freq_scale else None,
            anchorkv_segment_tokens=c.segment_tokens, anchorkv_recent_tokens=c.recent_tokens,
            anchorkv_extend_tokens=c.extend_tokens)

    def _native(self) -> "_core.AnchorKVConfig":
        c = _core.AnchorKVConfig()
        for field, attr, kind in (
            ("anchorkv_theta", "theta", float),
            ("anchorkv_window", "window", int),
            ("anchorkv_rho", "rho", float),
            ("anchorkv_anchor_frac", "anchor_frac", float),
            ("anchorkv_residual_bits", "residual_bits", int),
            ("anchorkv_seed", "seed", int),
            ("anchorkv_threads", "threads", int),
            ("anchorkv_segment_tokens", "segment_tokens", int),
            ("anchorkv_recent_tokens", "recent_tokens", int),
            ("anchorkv_extend_tokens", "extend_tokens", int),
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
                raise TypeError(f"[anchorkv.KVCacheConfig] {field} must be {kind.__name__}, got {type(value).__name__}")
            if field == "anchorkv_seed" and not 0 <= value < 2**64:
                raise ValueError(f"[anchorkv.KVCacheConfig] invalid {field}: must be in [0, 2**64), got {value}")
            if kind is int and field != "anchorkv_seed" and not -(2**62) < value < 2**62:
                raise ValueError(f"[anchorkv.KVCacheConfig] invalid {field}: out of range, got {value}")
            setattr(c, attr, kind(value))
        c.scale = _pick(_SCALES, "anchorkv_scale", self.anchorkv_scale)
        c.allocation = _pick(_ALLOCATIONS, "anchorkv_allocation", self.anchorkv_allocation)
        c.trigger = _pick(_TRIGGERS, "anchorkv_compress_at", self.anchorkv_compress_at)
        c.metadata = _pick(_METADATA, "anchorkv_metadata", self.anchorkv_metadata)
        c.anchor_count = _pick(_ANCHOR_COUNTS, "anchorkv_anchor_count", self.anchorkv_anchor_count)
        if self.anchorkv_key_rope_base is not None:
            c.key_rope = _rope_options(self.anchorkv_key_rope_base, self.anchorkv_key_rope_style,
                                       self.anchorkv_key_rope_offset, "anchorkv.KVCacheConfig", "anchorkv_key_rope_",
                                       self.anchorkv_key_rope_freq_scale)
        c.validate()
        return c


def _forward(name: str, doc: str) -> property:
    """A read-only property answered by the native cache."""
    return property(lambda self: getattr(self._cache, name), doc=doc)


class _NativeCache:
    """What every cache wrapper shares: the seed's methods, forwarded to the C++ cache.

    Thread safety: a cache may be shared between Python threads. Readers
    (``fetch``, ``attend``, the properties) run in parallel with the GIL
    released; writers (``update``, ``update_and_fetch``, ``compress_now``,
    ``trim``) run alone. Each call sees the cache between two writes.
    """

    _cache = None

    def update_and_fetch(
        self, keys: np.ndarray, values: np.ndarray, queries: Optional[np.ndarray] = None
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Add tokens and return the dense fp16 K/V of everything.

        ``queries`` (optional, [B, Hq, W, D], Hq a multiple of H, 1 <= W <= S):
        the real queries of this call's last W positions, in the stored keys'
        RoPE domain. AnchorKV, SnapKV and H2O score tokens with them instead of
        keys acting as queries; other caches ignore them.
        """
        if queries is None:
            return self._cache.update_and_fetch(keys, values)
        return self._cache.update_and_fetch(keys, values, queries)

    def update(self, keys: np.ndarray, values: np.ndarray, queries: Optional[np.ndarray] = None) -> None:
        """Add tokens like update_and_fetch without building the dense K/V (for attend())."""
        self._cache.update(keys, values, queries)

    def fetch(self) -> Tuple[np.ndarray, np.ndarray]:
        """The dense fp16 K/V of everything stored, without adding tokens."""
        return self._cache.fetch()

    offset = _forward("offset", "Token positions per (batch, head) row seen so far.")
    full_seq_bytes = _forward("full_seq_bytes", "Hypothetical fp16 K + V cost for the same tokens, uncompressed.")
    compression_ratio = _forward("compression_ratio", "full_seq_bytes / stored bytes; > 1 means storage savings.")
    tokens_kept = _forward("tokens_kept", "Token positions still inside the softmax (all heads summed).")
    tokens_total = _forward("tokens_total", "Total token positions ever passed in (all heads summed).")

    @property
    def state(self) -> np.ndarray:
        """Everything the cache holds, as stored (a one-layer cache file, docs/cachefile.md), uint8.

        Assigning a state taken from a cache of the same class restores it exactly.
        """
        return np.frombuffer(_core.serialize_caches([self._cache], [], [], {}), dtype=np.uint8)

    @state.setter
    def state(self, value) -> None:
        caches, _, _, _ = _core.load_caches_from_bytes(np.asarray(value, dtype=np.uint8).tobytes())
        if len(caches) != 1 or type(caches[0]) is not type(self._cache):
            raise ValueError(f"[anchorkv.{type(self).__name__}.state] the state holds another kind of cache")
        self._adopt(caches[0])

    @property
    def meta_state(self) -> Tuple[str, ...]:
        """(class name, native class name): what a loader needs besides ``state``."""
        return (type(self).__name__, type(self._cache).__name__)

    @meta_state.setter
    def meta_state(self, value) -> None:
        if tuple(value)[:1] != (type(self).__name__,):
            raise ValueError(f"[anchorkv.{type(self).__name__}.meta_state] written by {tuple(value)[:1]}")

    def _adopt(self, native) -> None:
        self._cache = native


class AnchorKVKVCache(_NativeCache):
    """AnchorKV anchor-residual KV cache for one layer. Never evicts a token.

    update_and_fetch(keys, values): numpy float arrays [B, H, S, D] (float16 or
    float32 read in place with any strides; float64 cast to float32). Returns (K_out, V_out), float16 [B, H, n_total, D]. The first
    call with S > 1 is compressed once; later calls are appended exactly. Bad
    input raises ValueError/TypeError and leaves the cache unchanged. The GIL is
    released while the C++ core works.
    """

    def __init__(self, config: Optional[KVCacheConfig] = None):
        self.config = config if config is not None else KVCacheConfig()
        self._cache = _core.AnchorKVCache(self.config._native())

    def compress_now(self) -> None:
        """Compress every exactly-stored token now (chunked prefill by hand)."""
        self._cache.compress_now()

    def _adopt(self, native) -> None:
        self._cache = native
        self.config = KVCacheConfig._from_native(native.config)

    def is_trimmable(self) -> bool:
        """False: trimming would desynchronise the compressed state."""
        return False

    is_compressed = _forward("is_compressed", "Whether the prefill segment has been compressed.")
    anchorkv_bytes = _forward("anchorkv_bytes",
                              "True compressed storage: anchors + metadata + packed residuals (+ exact tokens).")
    n_anchor_total = _forward("n_anchor_total", "Anchor tokens over all heads.")
    n_residual_total = _forward("n_residual_total", "Residuals stored (keys and values, all heads).")

    def __repr__(self) -> str:
        return (f"AnchorKVKVCache(offset={self.offset}, compression_ratio={self.compression_ratio:.2f}, "
                f"config={self.config})")


class FullKVCache(_NativeCache):
    """Plain fp16 cache: the reference every comparison uses."""

    def __init__(self, config: Optional[KVCacheConfig] = None):
        self.config = config
        self._cache = _core.FullKVCache()

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self._cache.trim(n)
        return n

    nbytes = _forward("nbytes", "Bytes stored (fp16 K and V).")


class _BaselineCache(_NativeCache):
    """Common face of the baseline caches (true byte accounting in nbytes)."""

    _native_type = None

    def __init__(self, *args, **kwargs):
        self._cache = self._native_type(*args, **kwargs)

    def is_trimmable(self) -> bool:
        return False

    nbytes = _forward("nbytes", "Bytes really stored, incl. group parameters, scores and windows.")
    name = _forward("name", "The method's name.")


class QuantizedKVCache(_BaselineCache):
    """Group-wise affine quantization (bits 2, 4 or 8; fp16 scale and bias per group)."""

    _native_type = _core.QuantizedKVCache

    def __init__(self, bits: int = 4, group_size: int = 64):
        super().__init__(bits, group_size)


class StreamingLLMCache(_BaselineCache):
    """Attention sinks + recent window, theta x prefill tokens; rolling during decode."""

    _native_type = _core.StreamingLLMCache

    def __init__(self, theta: float = 0.05, sinks: int = 4):
        super().__init__(theta, sinks)


class SnapKVCache(_BaselineCache):
    """Observation-window scoring at prefill (pooled), keeps theta x prefill tokens."""

    _native_type = _core.SnapKVCache

    def __init__(self, theta: float = 0.05, window: int = 32, kernel: int = 7):
        super().__init__(theta, window, kernel)


class KIVICache(_BaselineCache):
    """KIVI: keys per channel over token groups, values per token, fp16 recent window."""

    _native_type = _core.KIVICache

    def __init__(self, bits: int = 2, group: int = 32, residual: int = 32):
        super().__init__(bits, group, residual)


class TurboQuantCache(_BaselineCache):
    """TurboQuant: each token rotated, every coordinate coded with Lloyd-Max levels, fp16 norm.

    key_bits / value_bits: 1 to 4 in steps of 0.25 (fractions give the largest channels one bit more).
    Keys are stored as given (post-RoPE); attention scores the codes directly.
    """

    _native_type = _core.TurboQuantCache

    def __init__(self, key_bits: float = 4.0, value_bits: float = 4.0, seed: int = 0x7475726271):
        super().__init__(key_bits, value_bits, seed)


class H2OCache(_BaselineCache):
    """H2O: heavy hitters by accumulated (key-as-query) attention plus a recent window."""

    _native_type = _core.H2OCache

    def __init__(self, theta: float = 0.05, recent_share: float = 0.5):
        super().__init__(theta, recent_share)


class KVCacheBuilder:
    """Builds one cache per layer with the config propagated to each."""

    @staticmethod
    def for_layers(n_layers: int, config: Optional[KVCacheConfig] = None) -> List[AnchorKVKVCache]:
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 0:
            raise ValueError(f"[anchorkv.KVCacheBuilder.for_layers] n_layers must be an int >= 0, got {n_layers!r}")
        config = config if config is not None else KVCacheConfig()
        return [AnchorKVKVCache(config) for _ in range(n_layers)]

    @staticmethod
    def for_model(model, config: Optional[KVCacheConfig] = None) -> List[AnchorKVKVCache]:
        """One AnchorKV cache per layer of ``model`` (an object with ``layers``, or ``n_layers``, or an int)."""
        if hasattr(model, "layers"):
            n_layers = len(model.layers)
        elif hasattr(model, "n_layers"):
            n_layers = model.n_layers
        else:
            n_layers = model
        return KVCacheBuilder.for_layers(n_layers, config)


_WRAPPERS = {}


def _wrap(native):
    """A Python cache object around a native cache of any class."""
    cls = _WRAPPERS[type(native)]
    obj = cls.__new__(cls)
    if cls is FullKVCache:
        obj.config = None
    obj._adopt(native)
    return obj


def save_prompt_cache(file_name: str, cache: List, metadata: Optional[dict] = None) -> None:
    """Save every layer's cache to ``file_name`` (mlx_lm's name and meaning), as stored.

    ``metadata``: a dict of str -> str kept with the caches. The write is
    atomic: a crash mid-save leaves the previous file intact.
    """
    metadata = {} if metadata is None else metadata
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("[anchorkv.save_prompt_cache] metadata must map str to str")
    natives = []
    for c in cache:
        native = getattr(c, "_cache", None)
        if native is None:
            raise TypeError(f"[anchorkv.save_prompt_cache] not an anchorkv cache: {type(c).__name__}")
        natives.append(native)
    _core.save_caches(str(file_name), natives, [], [], dict(metadata))


def load_prompt_cache(file_name: str, return_metadata: bool = False):
    """Load the caches saved by ``save_prompt_cache`` (mlx_lm's name and meaning).

    Returns the list of caches, and the metadata dict too when
    ``return_metadata``. A damaged file raises ValueError naming the section
    and field; a file from a newer version RuntimeError; a missing one OSError.
    """
    natives, _, _, entries = _core.load_caches(str(file_name))
    caches = [_wrap(n) for n in natives]
    return (caches, dict(entries)) if return_metadata else caches


def attend(query: np.ndarray, cache, scale: Optional[float] = None, dtype=np.float32, threads: int = 0,
           rope_base: Optional[float] = None, rope_style: str = "normal", rope_offset: int = 0,
           rope_freq_scale=None, bf16_residuals: bool = True, bf16_scores: bool = True) -> np.ndarray:
    """Attention of ``query`` [B, Hq, Sq, D] over ``cache`` without building its dense K/V.

    Hq must be a multiple of the cache's H (GQA). The Sq queries are the cache's
    last Sq positions and attend causally. ``scale`` defaults to 1/sqrt(D).
    With ``rope_base``, query and cached keys are taken as BEFORE RoPE and RoPE
    is applied inside attention (pairs "normal": (2i, 2i+1), or "neox": (i, i + D/2);
    ``rope_offset``: position of the cache's first token; ``rope_freq_scale``: D/2 per-pair
    multipliers of the frequencies, a model's RoPE scaling).
    ``bf16_residuals``: AnchorKV's 2-bit residuals are scored and summed with bf16
    products (fp32 sums) where the CPU has AVX-512 BF16; False keeps them in fp32.
    ``bf16_scores``: with keys stored before RoPE, the anchor scores likewise (each
    rotated key and the queries rounded to bf16); False keeps them in fp32.
    Returns [B, Hq, Sq, D] float32 (or float16 with dtype=np.float16).
    """
    native = getattr(cache, "_cache", None)
    if native is None:
        raise TypeError(f"[anchorkv.attend] cache must be an anchorkv cache, got {type(cache).__name__}")
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"[anchorkv.attend] dtype must be float32 or float16, got {dtype}")
    rope = _core.RopeOptions() if rope_base is None else _rope_options(rope_base, rope_style, rope_offset,
                                                                        "anchorkv.attend", "rope_", rope_freq_scale)
    return _core.attend(query, native, 0.0 if scale is None else float(scale), np.dtype(dtype) == np.float16,
                        int(threads), rope, bool(bf16_residuals), bool(bf16_scores))


_WRAPPERS.update({
    _core.AnchorKVCache: AnchorKVKVCache,
    _core.FullKVCache: FullKVCache,
    _core.QuantizedKVCache: QuantizedKVCache,
    _core.StreamingLLMCache: StreamingLLMCache,
    _core.SnapKVCache: SnapKVCache,
    _core.KIVICache: KIVICache,
    _core.TurboQuantCache: TurboQuantCache,
    _core.H2OCache: H2OCache,
})
