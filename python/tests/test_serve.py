"""`anchorkv serve` driven by a real HTTP client (requests) on loopback."""
import concurrent.futures
import json
import os
import pathlib
import signal
import socket
import subprocess
import time

import pytest

requests = pytest.importorskip("requests")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT.parent / "shared" / "models" / "anchorkv-tiny.gguf"
CLI = os.environ.get("ANCHORKV_CLI")
pytestmark = pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI and the tiny model")
CACHE = ["--cache", "anchorkv_compact:pre", "--theta", "0.1"]
PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form, and void."


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra, model=TINY):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([CLI, "serve", "-m", str(model), "--port", str(self.port), "--threads", "1", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(200):
            try:
                if requests.get(self.url + "/health", timeout=1).ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("server did not start")

    def post(self, path, body, **kw):
        return requests.post(self.url + path, json=body, timeout=60, **kw)

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=5).text
        return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # never left behind, burning a core under the tests that follow
            self.proc.wait()
            raise


@pytest.fixture(scope="module")
def server():
    s = Server(*CACHE, "--parallel", "2", "--chat-template", "chatml")
    yield s
    assert s.stop() == 0, "SIGTERM stops the server cleanly"


def test_completion_equals_anchorkv_run(server):
    body = {"prompt": PROMPT + " Then", "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200
    j = r.json()
    assert j["object"] == "text_completion" and j["choices"][0]["finish_reason"] in ("length", "stop")
    run = subprocess.run([CLI, "run", "-m", str(TINY), "-p", PROMPT + " Then", "-n", "24", "--temperature", "0.8",
                          "--top-p", "0.9", "--seed", "7", "--threads", "1", *CACHE], capture_output=True, check=True)
    assert j["choices"][0]["text"].encode() == run.stdout
    assert j["usage"]["completion_tokens"] == 24 and j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + 24


def test_stream_concatenates_to_the_plain_answer(server):
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0.7, "seed": 3}
    plain = server.post("/v1/completions", body).json()["choices"][0]["text"]
    r = server.post("/v1/completions", dict(body, stream=True), stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    pieces, finish, done = [], None, False
    for line in r.iter_lines():
        if not line:
            continue
        assert line.startswith(b"data: ")
        if line == b"data: [DONE]":
            done = True
            continue
        chunk = json.loads(line[6:])
        pieces.append(chunk["choices"][0]["text"])
        finish = chunk["choices"][0]["finish_reason"] or finish
    assert done and finish == "length" and "".join(pieces) == plain


def test_shared_prefix_is_reused(server):
    ids = list(range(40, 240))  # token ids: the prefix is exact, whatever the tokenizer merges
    first = server.post("/v1/completions", {"prompt": ids, "max_tokens": 2, "temperature": 0})
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    before = server.metrics()
    second = server.post("/v1/completions", {"prompt": ids + [50, 60, 70], "max_tokens": 2, "temperature": 0})
    after = server.metrics()
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(ids)
    assert after["anchorkv_prefix_hits_total"] == before["anchorkv_prefix_hits_total"] + 1
    assert after["anchorkv_prefilled_tokens_total"] - before["anchorkv_prefilled_tokens_total"] == 3
    assert after["anchorkv_prefix_pool_bytes"] > 0


def test_chat_completion_and_stop(server):
    r = server.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                           {"role": "user", "content": "Who made the earth?"}],
                                              "max_tokens": 8, "temperature": 0})
    j = r.json()
    assert r.status_code == 200 and j["object"] == "chat.completion"
    assert j["choices"][0]["message"]["role"] == "assistant"
    text = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 30, "temperature": 0}).json()
    full = text["choices"][0]["text"]
    stop = full[5:8]
    cut = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "stop": [stop]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["choices"][0]["text"] == full[:full.index(stop)]


@pytest.mark.parametrize("body", [
    b"{bad", b"[]", b'"x"', b"{}", b'{"prompt": 3}', b'{"prompt": []}', b'{"prompt": [1, "a"]}',
    b'{"prompt": [99999999]}', b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "max_tokens": "5"}',
    b'{"prompt": "x", "max_tokens": 100000}', b'{"prompt": "x", "temperature": "hot"}',
    b'{"prompt": "x", "top_p": 0}', b'{"prompt": "x", "stop": [1]}', b'{"prompt": "x", "stream": 1}',
    b'{"prompt": "x", "seed": -3}', b'\xff\xfe', b'{"messages": []}',
])
def test_malformed_requests_get_4xx(server, body):
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    r = requests.post(server.url + path, data=body, timeout=10)
    assert 400 <= r.status_code < 500
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert requests.get(server.url + "/health", timeout=5).ok


def test_limits_unknown_paths_and_cancellation(server):
    r = requests.post(server.url + "/v1/completions", data=b"{" + b" " * (2 << 20) + b"}", timeout=10)
    assert r.status_code == 413
    assert requests.get(server.url + "/v1/nothing", timeout=5).status_code == 404
    r = server.post("/v1/completions", {"prompt": "x" * 20000, "max_tokens": 1})
    assert r.status_code == 400 and "limit" in r.json()["error"]["message"]
    # A streaming client that leaves early: the server stops generating and stays up.
    before = server.metrics()
    with server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3000, "temperature": 0, "stream": True},
                     stream=True) as s:
        next(s.iter_lines())
    for _ in range(200):
        after = server.metrics()
        if after["anchorkv_requests_total"] > before["anchorkv_requests_total"]:
            break
        time.sleep(0.05)
    # Uncancelled it would run to the context limit (~900 tokens here).
    assert after["anchorkv_completion_tokens_total"] - before["anchorkv_completion_tokens_total"] < 200
    assert requests.get(server.url + "/health", timeout=5).ok


def test_pool_stays_within_its_budget():
    s = Server(*CACHE, "--cache-budget", "100000")
    try:
        for i in range(8):
            ids = [(i * 17 + j) % 200 + 3 for j in range(150)]
            assert s.post("/v1/completions", {"prompt": ids, "max_tokens": 1}).ok
            m = s.metrics()
            assert m["anchorkv_prefix_pool_bytes"] <= 100000
        assert m["anchorkv_prefix_pool_evictions_total"] > 0 and m["anchorkv_prefix_pool_entries"] >= 1
    finally:
        assert s.stop() == 0


def test_no_chat_template_is_a_clear_error():
    s = Server(*CACHE)
    try:
        r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "--chat-template" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_load_8_clients_20_requests_each(server):
    def client(c):
        out = []
        for i in range(20):
            r = server.post("/v1/completions", {"prompt": f"Client {c} request {i}: {PROMPT[:40]}", "max_tokens": 3,
                                                "temperature": 0.5, "seed": i})
            j = r.json()
            out.append(r.status_code == 200 and j["usage"]["completion_tokens"] <= 3 and "text" in j["choices"][0])
        return out

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = [ok for oks in ex.map(client, range(8)) for ok in oks]
    assert len(results) == 160 and all(results)
    assert time.time() - t0 < 120
    rss_kb = int(next(l for l in open(f"/proc/{server.proc.pid}/status") if l.startswith("VmRSS")).split()[1])
    assert rss_kb < 1 << 20, f"server holds {rss_kb} kB after the load"


def test_questions_about_one_document_reuse_its_prefix(server):
    doc = [(7 * j) % 250 + 5 for j in range(180)]
    usage = [server.post("/v1/completions", {"prompt": doc + q, "max_tokens": 1, "temperature": 0}).json()["usage"]
             for q in ([11, 12], [13, 14], [15, 16])]
    # The second question finds the shared beginning and pools it; the third restores it.
    assert usage[2]["prompt_tokens_details"]["cached_tokens"] == len(doc)


def test_a_conversation_pools_each_turns_new_segments_once():
    # Each turn's prompt is the conversation so far: it restores the blocks of the turn before and
    # pools blocks for its new tokens alone, so the pool grows by what the turn added.
    s = Server(*CACHE)
    try:
        turn = [[(j * 17) % 240 + 4 for j in range(200)]]
        for t in range(1, 4):
            turn.append(turn[-1] + [(j * (19 + t)) % 240 + 4 for j in range(200)])
        grown = []
        for i, p in enumerate(turn):
            before = s.metrics().get("anchorkv_prefix_pool_bytes", 0)
            u = s.post("/v1/completions", {"prompt": p, "max_tokens": 2, "temperature": 0}).json()["usage"]
            assert u["prompt_tokens_details"]["cached_tokens"] == (len(turn[i - 1]) if i else 0)
            grown.append(s.metrics()["anchorkv_prefix_pool_bytes"] - before)
        # Every turn adds 200 tokens, and about the bytes the first one did (a whole-prompt entry
        # per turn would add the whole conversation each time: 2x, 3x, 4x).
        assert all(0.5 * grown[0] < g < 1.5 * grown[0] for g in grown[1:]), grown
    finally:
        assert s.stop() == 0


def test_the_spill_folder_keeps_its_budget(tmp_path):
    spill = tmp_path / "spill"
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill), "--cache-dir-budget", "80000")
    try:
        for i in range(8):
            p = [(i * 13 + j) % 240 + 4 for j in range(160)]
            assert s.post("/v1/completions", {"prompt": p, "max_tokens": 2}).status_code == 200
        m = s.metrics()
        on_disk = sum(f.stat().st_size for f in spill.glob("block-*.akvc"))
        assert m["anchorkv_prefix_disk_evictions_total"] > 0, m
        assert on_disk == m["anchorkv_prefix_disk_bytes"] <= 80000
    finally:
        assert s.stop() == 0


def test_spill_to_disk_and_reload_give_identical_completions(tmp_path):
    spill = tmp_path / "spill"
    prompts = [[(i * 13 + j) % 240 + 4 for j in range(160)] for i in range(4)]
    body = {"max_tokens": 12, "temperature": 0.9, "seed": 11}
    s = Server(*CACHE, "--cache-budget", "100000", "--cache-dir", str(spill))
    try:
        first = [s.post("/v1/completions", dict(body, prompt=p)).json()["choices"][0]["text"] for p in prompts]
        m = s.metrics()
        assert m["anchorkv_prefix_disk_entries"] >= 1 and m["anchorkv_prefix_pool_bytes"] <= 100000
        again = s.post("/v1/completions", dict(body, prompt=prompts[0])).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 160
        m = s.metrics()  # the prompt's blocks came back from the folder, each counted
        assert m["anchorkv_prefix_hits_total"] == 1 and m["anchorkv_prefix_disk_hits_total"] >= 1
        assert again["choices"][0]["text"] == first[0]
    finally:
        assert s.stop() == 0
    # A new server finds the spilled prefixes of the same model and cache.
    s = Server(*CACHE, "--cache-budget", "100000", "--cache-dir", str(spill))
    try:
        assert s.metrics()["anchorkv_prefix_disk_entries"] >= 1
        hits = [s.post("/v1/completions", dict(body, prompt=p)).json() for p in prompts]
        reused = [h for h in hits if h["usage"]["prompt_tokens_details"]["cached_tokens"] == 160]
        assert reused and all(h["choices"][0]["text"] == first[prompts.index(p)]
                              for h, p in zip(hits, prompts) if h in reused)
    finally:
        s.stop()


def test_logprobs(server):
    j = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3}).json()
    lp = j["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 6 and len(lp["token_logprobs"]) == 6 and len(lp["text_offset"]) == 6
    assert "".join(lp["tokens"]) == j["choices"][0]["text"]
    for tok, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert p <= 0 and len(top) == 3
        assert max(top.values()) == pytest.approx(p)  # greedy: the chosen token is the most likely
    c = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                              "logprobs": True, "top_logprobs": 2}).json()
    content = c["choices"][0]["logprobs"]["content"]
    assert len(content) == c["usage"]["completion_tokens"] and all(len(x["top_logprobs"]) == 2 for x in content)
    r = server.post("/v1/completions", {"prompt": "x", "logprobs": 3, "stream": True})
    assert r.status_code == 400


def test_byte_tokens_that_are_half_a_character_keep_distinct_logprob_keys(server):
    # The tiny vocabulary's tokens 3 + b are bytes; 0xC3, 0xC4 and 0xE2 alone are no UTF-8.
    bias = {str(3 + b): 100 for b in (0xC3, 0xC4, 0xE2)}
    r = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 5,
                                        "logit_bias": bias})
    pairs = json.loads(r.text, object_pairs_hook=lambda kv: kv)  # keeps duplicate keys, if any
    lp = dict(dict(pairs)["choices"][0])["logprobs"]
    top = dict(lp)["top_logprobs"][0]
    keys = [k for k, _ in top]
    assert len(keys) == len(set(keys)) == 5, keys
    assert {"bytes:\\xc3", "bytes:\\xc4", "bytes:\\xe2"} <= set(keys), keys
    c = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                              "temperature": 0, "logprobs": True, "top_logprobs": 3,
                                              "logit_bias": bias}).json()
    first = c["choices"][0]["logprobs"]["content"][0]
    assert first["bytes"] in ([0xC3], [0xC4], [0xE2]) and first["token"].startswith("bytes:")


def test_random_mutations_of_a_request_never_break_the_server(server):
    import random

    rng = random.Random(1)
    base = json.dumps({"prompt": "In the beginning", "max_tokens": 2, "temperature": 0.5, "stop": ["x"],
                       "seed": 4}).encode()
    for _ in range(150):
        b = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(b))
            op = rng.randrange(3)
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i]
            else:
                b.insert(i, rng.choice(b'{}[]",:0123456789-.eE\\ntfa'))
        r = requests.post(server.url + "/v1/completions", data=bytes(b), timeout=30)
        assert r.status_code == 200 or (400 <= r.status_code < 500 and r.json()["error"]["message"])
    assert requests.get(server.url + "/health", timeout=5).ok
