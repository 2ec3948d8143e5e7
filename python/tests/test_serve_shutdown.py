"""`anchorkv serve` under SIGTERM (a rolling restart): /health says draining and new requests get 503
with `Connection: close` and `Retry-After`; running requests finish, or past --shutdown-timeout end with
a 503 or an error event; a second signal exits at once; pooled prefixes are written to --cache-dir and
queued blocks to --kv-store, so a restart loses none of them."""
import concurrent.futures
import json
import shutil
import signal
import socket
import threading
import time

import pytest

requests = pytest.importorskip("requests")

from test_serve import CACHE, CLI, ROOT, TINY, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI and the tiny model")
LONG = ROOT.parent / "shared" / "models" / "anchorkv-d128-4k.gguf"  # 4096 tokens of context: ~2 s to decode


def held_request(server, body):
    """A request whose head and half its body are sent: it is running (reading its body) until finish()."""
    c = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    data = json.dumps(body).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data[:10]))
    time.sleep(0.1)  # the head is parsed: the request is in flight

    def finish():
        c.sendall(data[10:])
        out = b""
        while True:
            d = c.recv(65536)
            if not d:
                return out
            out += d
            if out.endswith(b"0\r\n\r\n") or (b"\r\n\r\n" in out and not body.get("stream")
                                               and len(out.split(b"\r\n\r\n", 1)[1]) >= content_length(out)):
                return out
    return finish


def content_length(response):
    for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def test_sigterm_drains_running_requests_and_refuses_new_ones():
    s = Server(*CACHE, "--parallel", "2")
    try:
        plain = held_request(s, {"prompt": "In the beginning", "max_tokens": 40, "temperature": 0})
        stream = held_request(s, {"prompt": "In the beginning", "max_tokens": 40, "stream": True})
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        h = requests.get(s.url + "/health", timeout=5)
        assert h.status_code == 503 and h.json()["status"] == "draining"
        r = requests.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
        assert r.status_code == 503 and r.headers["Connection"] == "close" and r.headers["Retry-After"] == "1"
        assert s.proc.poll() is None, "the server waits for the requests it is running"
        out = plain()
        assert out.startswith(b"HTTP/1.1 200 ") and b'"completion_tokens":40' in out, out[:400]
        out = stream()
        assert out.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" in out and out.endswith(b"0\r\n\r\n"), out[-200:]
        assert s.proc.wait(timeout=10) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


@pytest.mark.skipif(not LONG.exists(), reason="needs the 4096-token shared model")
def test_past_the_shutdown_timeout_running_requests_end_with_an_error():
    s = Server("--parallel", "2", "--shutdown-timeout", "0.3", model=LONG)
    try:
        body = {"prompt": "In the beginning", "max_tokens": 3000, "temperature": 0}
        plain = {}
        t = threading.Thread(target=lambda: plain.update(r=s.post("/v1/completions", body)))
        t.start()
        with s.post("/v1/completions", dict(body, stream=True), stream=True) as st:
            lines = st.iter_lines()
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            rest = [l for l in lines if l]  # ends cleanly: the chunked body is terminated
        t.join(30)
        assert rest and b"error" in rest[-1] and b"[DONE]" not in rest[-1], rest[-2:]
        assert plain["r"].status_code == 503 and plain["r"].headers.get("Retry-After") == "1"
        assert s.proc.wait(timeout=15) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


@pytest.mark.skipif(not LONG.exists(), reason="needs the 4096-token shared model")
def test_a_second_signal_exits_at_once():
    s = Server(model=LONG)
    try:
        with s.post("/v1/completions", {"prompt": "In the beginning", "max_tokens": 3000, "temperature": 0, "stream": True}, stream=True) as st:
            lines = st.iter_lines()  # held: a closed generator would close the connection
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
            t0 = time.time()
            s.proc.send_signal(signal.SIGTERM)
            assert s.proc.wait(timeout=5) == 1 and time.time() - t0 < 2
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_a_restart_keeps_every_pooled_prefix(tmp_path):
    prompt = [(j * 7) % 240 + 4 for j in range(456)]
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    s = Server(*CACHE, "--cache-dir", str(tmp_path / "spill"))
    try:
        first = s.post("/v1/completions", body).json()
        again = s.post("/v1/completions", body).json()
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and again["choices"][0]["text"] == first["choices"][0]["text"]
    finally:
        assert s.stop() == 0
    assert "written to --cache-dir, 0 not written" in s.proc.stderr.read()
    s = Server(*CACHE, "--cache-dir", str(tmp_path / "spill"))
    try:
        after = s.post("/v1/completions", body).json()
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        assert after["choices"][0]["text"] == first["choices"][0]["text"]
    finally:
        assert s.stop() == 0


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
def test_blocks_queued_for_the_store_are_written_before_exit():
    from test_serve_store import Redis
    redis = Redis()
    try:
        s = Server(*CACHE, "--kv-store", redis.url)
        try:
            for i in range(12):
                s.post("/v1/completions", {"prompt": [(i * 31 + j) % 240 + 4 for j in range(300)], "max_tokens": 1})
            made = s.metrics()["anchorkv_prefix_pool_entries"]
        finally:
            assert s.stop() == 0  # at once: most blocks are still queued
        assert ", 0 dropped" in s.proc.stderr.read()
        assert len(redis.blocks()) == made
    finally:
        redis.stop()


def test_a_spilling_pool_gives_one_answer_per_prompt(tmp_path):
    # A pool far smaller than the prompts it holds: blocks move to the folder and back all the time,
    # while four slots ask for the same prompts. A block is findable at every instant of its moves and
    # its first bytes win, so a prompt restored whole always gives the same answer.
    s = Server(*CACHE, "--parallel", "4", "--cache-budget", "300KiB", "--cache-dir", str(tmp_path / "spill"),
               "--cache-dir-budget", "64MiB")
    try:
        prompts = [[(j * (7 + i)) % 240 + 4 for j in range(830)] for i in range(3)]
        body = {"max_tokens": 6, "temperature": 0, "logprobs": 1}
        first = [s.post("/v1/completions", dict(body, prompt=p)).json()["choices"][0] for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: (i % 3, s.post("/v1/completions", dict(body, prompt=prompts[i % 3]))),
                                    range(36)))
        for i, r in answers:
            assert r.status_code == 200
            c = r.json()["choices"][0]
            assert c["text"] == first[i]["text"] and c["logprobs"]["token_logprobs"] == first[i]["logprobs"]["token_logprobs"]
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        m = s.metrics()
        assert m["anchorkv_prefix_disk_hits_total"] > 0 and m["anchorkv_prefix_bad_entries_total"] == 0
    finally:
        assert s.stop() == 0
