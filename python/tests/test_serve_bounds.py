"""`anchorkv serve`: no request buys unbounded CPU or memory, whatever field its bytes are in. A model
with a GPT-2 vocabulary whose merges double a letter ("a a", "aa aa", ...) makes one long word the
tokenizer's worst case; each test is bounded to seconds."""
import concurrent.futures
import socket
import time

import pytest

requests = pytest.importorskip("requests")

from test_model_files import write_model  # noqa: E402
from test_runtime_reference import B2U  # noqa: E402
from test_serve import CACHE, CLI, TINY, Server  # noqa: E402
from test_serve_hostile import peak_rss_kb  # noqa: E402

pytestmark = pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI and the tiny model")


@pytest.fixture(scope="module")
def doubling_model(tmp_path_factory):
    """Byte-level pieces, then "a" doubled up to 2^16 letters, then ChatML's markers (<|im_end|> last: EOS)."""
    pieces, merges, p = [B2U[b] for b in range(256)], [], "a"
    while len(p) < 1 << 16:
        merges.append(p + " " + p)
        p += p
        pieces.append(p)
    pieces += ["<|im_start|>", "<|im_end|>"]
    types = [1] * (len(pieces) - 2) + [3, 3]
    path = tmp_path_factory.mktemp("bpe") / "doubling.gguf"
    write_model(path, vocab=(pieces, types, merges))
    return path


@pytest.fixture(scope="module")
def bpe_server(doubling_model):
    s = Server(*CACHE, "--chat-template", "chatml", "--request-timeout", "20", model=doubling_model)
    yield s
    assert s.stop() == 0


def timed_post(s, path, body, timeout=10):
    t0 = time.time()
    r = requests.post(s.url + path, json=body, timeout=timeout)
    return r, time.time() - t0


def test_a_long_word_is_tokenized_in_n_log_n(bpe_server):
    # 65,000 letters merge into 11 tokens; rescanning every pair per merge took minutes.
    r, dt = timed_post(bpe_server, "/v1/completions", {"prompt": "a" * 65000, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == bin(65000).count("1")
    r, dt = timed_post(bpe_server, "/v1/chat/completions",
                       {"messages": [{"role": "a" * 60000, "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_tokenizing_counts_against_the_request_timeout(doubling_model):
    # A megabyte of letters takes ~0.5 s to tokenize: past a 0.05 s deadline it is stopped, not finished.
    s = Server(*CACHE, "--request-timeout", "0.05", "--max-body", str(2 << 20), model=doubling_model)
    try:
        r, dt = timed_post(s, "/v1/completions", {"prompt": "a" * (1 << 20), "max_tokens": 1})
        assert r.status_code == 408 and "request-timeout" in r.json()["error"]["message"], r.text
        assert s.metrics()["anchorkv_request_errors_total"] == 1
    finally:
        assert s.stop() == 0


def test_chat_roles_count_against_the_byte_limit_and_messages_are_bounded():
    s = Server(*CACHE, "--chat-template", "chatml")
    try:
        before = peak_rss_kb(s.proc.pid)
        role = {"messages": [{"role": "r" * 1_000_000, "content": "hi"}], "max_tokens": 1}
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            codes = list(pool.map(lambda _: s.post("/v1/chat/completions", role).status_code, range(20)))
        assert codes == [400] * 20
        grown = (peak_rss_kb(s.proc.pid) - before) >> 10
        # Each body is 1 MiB, parsed once; before, each role was tokenized too (tens of MiB each).
        assert grown < 200, f"peak RSS grew by {grown} MiB"
        r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}] * 1100, "max_tokens": 1})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"], r.text
        r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 3, "max_tokens": 1})
        assert r.status_code == 200
    finally:
        assert s.stop() == 0


def test_bodies_of_many_small_values_are_refused_before_they_are_held():
    s = Server(*CACHE)
    try:
        before = peak_rss_kb(s.proc.pid)
        flat = b'{"prompt": "x", "pad": [' + b",".join([b"{}"] * 300000) + b"]}"
        deep = b'{"prompt": "x", "pad": ' + b"[" * 100000 + b"]" * 100000 + b"}"
        for body in (flat, deep):
            r = requests.post(s.url + "/v1/completions", data=body, timeout=10,
                              headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "JSON" in r.json()["error"]["message"], r.text
        grown = (peak_rss_kb(s.proc.pid) - before) >> 10
        assert grown < 32, f"peak RSS grew by {grown} MiB"
    finally:
        assert s.stop() == 0
