"""Prompt caches on disk: save_prompt_cache / load_prompt_cache, state / meta_state,
and `anchorkv run --prompt-cache` (same text as without the file)."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

import anchorkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT.parent / "shared" / "models" / "anchorkv-tiny.gguf"
CLI = os.environ.get("ANCHORKV_CLI")


def _every_kind():
    return [
        anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_theta=0.1)),
        anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_metadata="compact", anchorkv_compress_at="first_decode")),
        anchorkv.FullKVCache(),
        anchorkv.QuantizedKVCache(bits=4),
        anchorkv.KIVICache(bits=2),
        anchorkv.StreamingLLMCache(0.2),
        anchorkv.SnapKVCache(0.2),
        anchorkv.H2OCache(0.2),
    ]


def _kv(seed, s):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((1, 2, s, 32)).astype(np.float32), rng.standard_normal((1, 2, s, 32)).astype(np.float32)


def _same(a, b):
    assert type(a) is type(b)
    assert a.offset == b.offset and a.tokens_kept == b.tokens_kept and a.compression_ratio == b.compression_ratio
    for x, y in zip(a.fetch(), b.fetch()):
        assert np.array_equal(x, y)
    q = np.random.default_rng(9).standard_normal((1, 4, 1, 32)).astype(np.float32)
    assert np.array_equal(anchorkv.attend(q, a), anchorkv.attend(q, b))


def test_save_and_load_every_kind_exactly(tmp_path):
    caches = _every_kind()
    for c in caches:
        c.update(*_kv(1, 200))
        c.update(*_kv(2, 1))
    path = tmp_path / "prompt.akvc"
    anchorkv.save_prompt_cache(path, caches, {"model": "test", "note": "é"})
    loaded, meta = anchorkv.load_prompt_cache(path, return_metadata=True)
    assert meta == {"model": "test", "note": "é"}
    assert len(loaded) == len(caches)
    for a, b in zip(caches, loaded):
        _same(a, b)
    assert loaded[1].config.anchorkv_metadata == "compact"
    for a, b in zip(caches, loaded):  # decoding goes on identically
        step = _kv(3, 1)
        a.update(*step)
        b.update(*step)
        _same(a, b)
    assert anchorkv.load_prompt_cache(path) and not isinstance(anchorkv.load_prompt_cache(path), tuple)


def test_state_round_trip_and_wrong_kind():
    a = anchorkv.AnchorKVKVCache(anchorkv.KVCacheConfig(anchorkv_theta=0.2, anchorkv_seed=7))
    a.update(*_kv(4, 300))
    b = anchorkv.AnchorKVKVCache()
    b.state = a.state
    b.meta_state = a.meta_state
    assert b.config.anchorkv_seed == 7
    _same(a, b)
    assert np.array_equal(a.state, b.state)
    full = anchorkv.FullKVCache()
    with pytest.raises(ValueError, match="another kind"):
        full.state = a.state
    with pytest.raises(ValueError):
        full.meta_state = a.meta_state


def test_damaged_missing_and_foreign_files(tmp_path):
    c = anchorkv.AnchorKVKVCache()
    c.update(*_kv(5, 128))
    path = tmp_path / "c.akvc"
    anchorkv.save_prompt_cache(path, [c])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad = tmp_path / "bad.akvc"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"bad\.akvc.*section 1 \(layer 0\).*checksum"):
        anchorkv.load_prompt_cache(bad)
    short = tmp_path / "short.akvc"
    short.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError):
        anchorkv.load_prompt_cache(short)
    with pytest.raises(OSError):
        anchorkv.load_prompt_cache(tmp_path / "missing.akvc")
    with pytest.raises(TypeError):
        anchorkv.save_prompt_cache(path, [c], {"n": 1})
    assert anchorkv.load_prompt_cache(path)[0].offset == 128, "a failed save left the file intact"


def test_builder_for_model():
    class Model:
        layers = [object()] * 3

    caches = anchorkv.KVCacheBuilder.for_model(Model(), anchorkv.KVCacheConfig(anchorkv_theta=0.1))
    assert len(caches) == 3 and caches[0].config.anchorkv_theta == 0.1
    assert len(anchorkv.KVCacheBuilder.for_model(2)) == 2


@pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI (ANCHORKV_CLI) and the tiny model")
@pytest.mark.parametrize("cache", ["anchorkv_compact:pre", "snapkv", "full"])
def test_cli_prompt_cache_gives_the_same_text(tmp_path, cache):
    prompt = "In the beginning God created the heaven and the earth. And the earth was without form, and void."
    base = [CLI, "run", "-m", str(TINY), "-n", "16", "--cache", cache, "--theta", "0.1", "--threads", "2"]

    def run(p, *extra):
        r = subprocess.run(base + ["-p", p, *extra], capture_output=True, text=True, check=True)
        return r.stdout, r.stderr

    plain, _ = run(prompt)
    file = str(tmp_path / "p.akvc")
    first, err1 = run(prompt, "--prompt-cache", file)
    assert "saved" in err1 and first == plain
    second, err2 = run(prompt, "--prompt-cache", file)
    assert "loaded" in err2 and ", 0 prefilled" in err2 and second == plain
    longer = prompt + " And God said"
    ext_plain, _ = run(longer)
    ext, err3 = run(longer, "--prompt-cache", file)
    assert "loaded" in err3 and "saved" in err3
    if cache == "full":  # exact caches give the same text after a partial prefill too
        assert ext == ext_plain


@pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI (ANCHORKV_CLI) and the tiny model")
def test_cli_foreign_files_are_not_used(tmp_path):
    prompt = "In the beginning God created the heaven and the earth."
    file = str(tmp_path / "p.akvc")
    base = [CLI, "run", "-m", str(TINY), "-n", "4", "-p", prompt, "--prompt-cache", file]
    subprocess.run(base + ["--cache", "anchorkv_compact:pre", "--theta", "0.1"], capture_output=True, check=True)
    r = subprocess.run(base + ["--cache", "full"], capture_output=True, text=True, check=True)
    assert "not used: written with cache anchorkv_compact:pre" in r.stderr
    other = ROOT.parent / "shared" / "models" / "stories260K.bin"
    if other.exists():
        r = subprocess.run([CLI, "run", "-m", str(other), "-n", "2", "--tokens", "1,300,301", "--cache", "full",
                            "--prompt-cache", file], capture_output=True, text=True, check=True)
        assert "not used: written for another model" in r.stderr
    pathlib.Path(file).write_bytes(b"AKVCACHE" + b"\0" * 40)  # damaged: reported, then overwritten
    r = subprocess.run(base + ["--cache", "full"], capture_output=True, text=True, check=True)
    assert "not used:" in r.stderr and "saved" in r.stderr


@pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI (ANCHORKV_CLI) and the tiny model")
def test_cli_eval_prefix_from_prompt_cache_scores_the_same(tmp_path):
    import json

    text = ROOT / "tests" / "data" / "genesis1.txt"
    cmd = [CLI, "eval", "-m", str(TINY), "--text", str(text), "--ctx", "256", "--theta", "0.1", "--caches",
           "full,anchorkv_compact:pre,snapkv", "--prompt-cache", str(tmp_path / "g")]
    results = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        subprocess.run(cmd + ["--json", str(out)], capture_output=True, check=True)
        results.append(json.loads(out.read_text())["results"])
    for first, second in zip(*results):
        assert first["prefix_from_file"] == 0 and second["prefix_from_file"] > 0
        assert first["kl_mean"] == second["kl_mean"] and first["perplexity"] == second["perplexity"]
