"""One cache shared by several Python threads (the GIL is released in the core)."""
import threading

import numpy as np
import pytest

import anchorkv

B, H, HQ, S, D = 1, 2, 4, 256, 64
WRITERS, STEPS = 2, 10


def _make(kind):
    if kind == "anchorkv":
        return anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_theta=0.1))
    if kind == "full":
        return anchorkv.FullKVCache()
    return anchorkv.KIVICache(bits=2)


@pytest.mark.parametrize("kind", ["anchorkv", "full", "kivi"])
def test_writers_and_readers_share_one_cache(kind):
    rng = np.random.default_rng(0)
    k = rng.standard_normal((B, H, S, D)).astype(np.float32)
    v = rng.standard_normal((B, H, S, D)).astype(np.float32)
    step = rng.standard_normal((B, H, 1, D)).astype(np.float32)
    q = rng.standard_normal((B, HQ, 1, D)).astype(np.float32)
    total = WRITERS * STEPS

    # Serial run: the attention output after each number of decode tokens.
    serial = _make(kind)
    serial.update(k, v)
    expected = [anchorkv.attend(q, serial, threads=1)]
    for _ in range(total):
        serial.update(step, step)
        expected.append(anchorkv.attend(q, serial, threads=1))
    final_k, final_v = serial.fetch()

    cache = _make(kind)
    cache.update(k, v)
    problems, done = [], threading.Event()

    def writer():
        try:
            for i in range(STEPS):
                if i % 2:
                    cache.update(step, step)
                else:
                    K, _ = cache.update_and_fetch(step, step)
                    if K.shape[2] <= S:
                        problems.append("update_and_fetch lost its own token")
        except Exception as e:  # noqa: BLE001 - any error is a failure here
            problems.append(repr(e))

    def reader():
        try:
            while not done.is_set():
                y = anchorkv.attend(q, cache, threads=1)
                if not any(np.array_equal(y, e) for e in expected):
                    problems.append("attend result matches no serial state")
                K, V = cache.fetch()
                n = K.shape[2]
                if not (S <= n <= S + total) or not np.array_equal(V, final_v[:, :, :n]):
                    problems.append(f"fetch returned an inconsistent state ({n} tokens)")
                assert cache.compression_ratio > 0
        except Exception as e:  # noqa: BLE001
            problems.append(repr(e))

    writers = [threading.Thread(target=writer) for _ in range(WRITERS)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in readers:
        t.join()
    assert problems == []
    assert cache.offset == S + total
    assert cache.tokens_total == B * H * (S + total)
    K, V = cache.fetch()
    assert np.array_equal(K, final_k) and np.array_equal(V, final_v)


def test_bad_input_from_one_thread_leaves_the_cache_consistent():
    cache = anchorkv.AnchorKVKVCache()
    rng = np.random.default_rng(1)
    cache.update(rng.standard_normal((1, 2, 128, 32)).astype(np.float32),
                 rng.standard_normal((1, 2, 128, 32)).astype(np.float32))
    good = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    bad = rng.standard_normal((1, 3, 1, 32)).astype(np.float32)
    errors = []

    def run(x):
        for _ in range(8):
            try:
                cache.update(x, x)
            except ValueError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=run, args=(good if i % 2 else bad,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 16 and all("update" in e for e in errors)
    assert cache.offset == 128 + 16
