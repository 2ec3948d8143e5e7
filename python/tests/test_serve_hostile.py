"""`anchorkv serve` and the cache-file paths under hostile clients and damaged disks: no crash, bounded
memory, /health always answers, bad files are misses (each test bounded to seconds)."""
import os
import pathlib
import socket
import stat
import subprocess
import threading
import time

import numpy as np
import pytest

requests = pytest.importorskip("requests")

from test_serve import CACHE, CLI, PROMPT, TINY, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not CLI or not TINY.exists(), reason="needs the anchorkv CLI and the tiny model")


def peak_rss_kb(pid):
    return int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM")).split()[1])


def timed_get(url, timeout=5):
    t0 = time.time()
    r = requests.get(url, timeout=timeout)
    return r, time.time() - t0


def raw(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def test_slow_clients_stall_neither_health_nor_completions():
    s = Server(*CACHE, "--parallel", "2")
    socks = []
    try:
        for i in range(60):  # half-sent request lines and headers
            c = raw(s)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
            socks.append(c)
        for i in range(20):  # headers sent, body half-sent
            c = raw(s)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
            socks.append(c)
        body = b'{"prompt": "In the beginning", "max_tokens": 40, "stream": true}'
        for i in range(6):  # slow readers: a streamed answer nobody reads
            c = raw(s)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            socks.append(c)
        for _ in range(3):
            r, dt = timed_get(s.url + "/health")
            assert r.ok and dt < 1.0, dt
        t0 = time.time()
        r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and time.time() - t0 < 3.0, time.time() - t0
        r, dt = timed_get(s.url + "/metrics")
        assert r.ok and dt < 1.0
    finally:
        for c in socks:
            c.close()
        assert s.stop() == 0


def test_chunked_body_over_the_limit_is_refused_early_with_bounded_memory():
    s = Server(*CACHE, "--max-body", "65536")
    try:
        before = peak_rss_kb(s.proc.pid)
        c = raw(s)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Type: application/json\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        sent = 0
        try:
            while sent < 50 << 20:
                c.sendall(chunk)
                sent += 65536
        except OSError:
            pass  # the server closed the connection: refused
        try:
            reply = c.recv(4096)
        except OSError:
            reply = b""
        c.close()
        assert sent < 8 << 20, f"{sent} bytes accepted before the refusal"
        assert reply == b"" or b" 413 " in reply.split(b"\r\n")[0], reply[:100]
        grown = peak_rss_kb(s.proc.pid) - before
        assert grown < 64 << 10, f"peak RSS grew by {grown} kB"
        assert requests.get(s.url + "/health", timeout=5).ok
    finally:
        assert s.stop() == 0


def test_header_floods_are_refused_with_bounded_memory():
    s = Server(*CACHE)
    try:
        before = peak_rss_kb(s.proc.pid)
        for flood in (b"X-A: b\r\n" * 200000, b"X-Long: " + b"a" * (4 << 20) + b"\r\n"):
            c = raw(s)
            try:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + flood + b"\r\n")
                reply = c.recv(4096)
            except OSError:
                reply = b""
            c.close()
            assert not reply.startswith(b"HTTP/1.1 200"), reply[:80]
        grown = peak_rss_kb(s.proc.pid) - before
        assert grown < 64 << 10, f"peak RSS grew by {grown} kB"
        assert requests.get(s.url + "/health", timeout=5).ok
    finally:
        assert s.stop() == 0


def test_a_client_that_leaves_cancels_a_plain_request():
    s = Server(*CACHE)
    try:
        before = s.metrics()
        c = raw(s)
        body = b'{"prompt": "In the beginning", "max_tokens": 3000, "temperature": 0}'
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.05)
        c.close()
        for _ in range(200):
            after = s.metrics()
            if after["anchorkv_requests_total"] > before["anchorkv_requests_total"]:
                break
            time.sleep(0.05)
        assert after["anchorkv_requests_cancelled_total"] == before["anchorkv_requests_cancelled_total"] + 1
        assert after["anchorkv_completion_tokens_total"] - before["anchorkv_completion_tokens_total"] < 300
    finally:
        assert s.stop() == 0


def test_deadline_and_full_queue():
    # 0.05 s: the tiny model would need ~20000 tokens/s to reach its context first.
    s = Server(*CACHE, "--request-timeout", "0.05")
    try:
        t0 = time.time()
        r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3000, "temperature": 0})
        assert r.status_code == 200 and time.time() - t0 < 3.0
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] < 900
        assert s.metrics()["anchorkv_requests_timed_out_total"] == 1
    finally:
        assert s.stop() == 0
    # One slot busy with a stream, no queue: the next request is told to retry. (On the tiny model
    # a stream ran to its 1024-token context in a fifth of a second, and on a loaded machine the
    # client lost that race 20 times in a row; the 4096-token model's stream takes seconds. A
    # request that comes after it ended gets its slot, so the pair is tried again.)
    s = Server(*CACHE, "--max-queue", "0", model=TINY.parent / "anchorkv-d128-4k.gguf")
    try:
        statuses = []
        for _ in range(20):
            with s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4000, "stream": True}, stream=True) as st:
                next(st.iter_lines())
                busy = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
                # A stream refused for a full queue gets its 503 as a status, not a 200 and an error event.
                busy_stream = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": True})
                statuses.append(busy.status_code)
            if busy.status_code == 503 and busy_stream.status_code == 503:
                assert busy.headers.get("Retry-After") == "1" and busy_stream.headers.get("Retry-After") == "1"
                break
        assert busy_stream.status_code == 503 and set(statuses) <= {200, 503}, statuses
        assert s.metrics()["anchorkv_requests_busy_total"] >= 1
        assert requests.get(s.url + "/health", timeout=5).ok
    finally:
        assert s.stop() == 0


def test_configuration_values_are_range_checked():
    for args, needle in ((["--max-body", "-1"], "max-body"), (["--cache-budget", "1e30"], "cache-budget"),
                         (["--cache-dir-budget", "lots"], "cache-dir-budget"),
                         (["--max-prompt", "5000"], "context"), (["--parallel", "0"], "parallel"),
                         (["--theta", "2"], "theta")):
        r = subprocess.run([CLI, "serve", "-m", str(TINY), "--port", "1", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and needle in r.stderr, (args, r.stderr)


def test_prompt_limits_come_before_the_work(server_tiny):
    s = server_tiny
    r = s.post("/v1/completions", {"prompt": list(range(1, 1200)), "max_tokens": 1})  # tiny context: 1024
    assert r.status_code == 400 and "limit is 1024" in r.json()["error"]["message"]
    r = s.post("/v1/completions", {"prompt": [5] * 9000, "max_tokens": 1})
    assert r.status_code == 400 and "9000 tokens" in r.json()["error"]["message"]
    r = s.post("/v1/completions", {"prompt": "word " * 200000, "max_tokens": 1})  # refused before tokenizing
    assert r.status_code in (400, 413)


@pytest.fixture()
def server_tiny():
    s = Server(*CACHE, "--max-body", str(4 << 20))
    yield s
    assert s.stop() == 0


def test_a_second_server_on_the_same_port_fails():
    s = Server(*CACHE)
    try:
        r = subprocess.run([CLI, "serve", "-m", str(TINY), "--port", str(s.port)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and "cannot listen" in r.stderr, r.stderr
        assert requests.get(s.url + "/health", timeout=5).ok
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------- damaged and foreign pool files

def damage(files, anchorkv_core):
    """Damages five spilled files: garbage, truncated, valid without logits, tokens that disagree with
    their caches, and another model's layers."""
    garbage, truncated, no_logits, wrong_tokens, wrong_shape = files[:5]
    garbage.write_bytes(os.urandom(garbage.stat().st_size))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    natives, tokens, logits, entries = anchorkv_core.load_caches(str(no_logits))
    anchorkv_core.save_caches(str(no_logits), natives, list(tokens), [], dict(entries))  # valid, no logits
    natives, tokens, logits, entries = anchorkv_core.load_caches(str(wrong_tokens))
    anchorkv_core.save_caches(str(wrong_tokens), natives, list(tokens)[:-5], list(logits), dict(entries))
    natives, tokens, logits, entries = anchorkv_core.load_caches(str(wrong_shape))
    import anchorkv
    other = []
    for _ in natives:  # another model's layers: 3 heads of dim 16, the right token count
        c = anchorkv.FullKVCache()
        kv = np.ones((1, 3, len(tokens), 16), np.float32)
        c.update_and_fetch(kv, kv)
        other.append(c._cache)
    anchorkv_core.save_caches(str(wrong_shape), other, list(tokens), list(logits), dict(entries))


def touched_prompts(files, prompts, anchorkv_core):
    """Which prompts begin with the tokens of one of the five blocks damage() damages. Such a prompt
    restores a shorter chain (or none) and prefills the rest; its answer may differ in the last bits
    from the one its whole chain gives, as any prompt restored from a shorter prefix may."""
    touched = set()
    for f in files[:5]:
        _, tokens, _, entries = anchorkv_core.load_caches(str(f))
        first = int(entries["chain.first"])  # a block holds its own tokens, from this position
        touched |= {i for i, p in enumerate(prompts) if p[first:first + len(tokens)] == list(tokens)}
    return touched


def test_damaged_pool_files_are_misses_at_start_and_after_indexing(tmp_path):
    import anchorkv
    core = anchorkv._core
    # Every entry fits in memory but the budget forces them out to the folder one by one.
    spill = tmp_path / "spill"
    prompts = [[(i * 13 + j) % 240 + 4 for j in range(160)] for i in range(6)]
    body = {"max_tokens": 8, "temperature": 0.9, "seed": 11}
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill))
    try:
        first = [s.post("/v1/completions", dict(body, prompt=p)).json()["choices"][0]["text"] for p in prompts]
        files = sorted(spill.glob("block-*.akvc"))
        assert len(files) >= 5, files
        touched = touched_prompts(files, prompts, core)
        damage(files, core)
        # After indexing: each damaged block ends its chain early (a prefill from there), never a 500;
        # the prompts it does not touch give the same answer.
        for i, (p, text) in enumerate(zip(prompts, first)):
            r = s.post("/v1/completions", dict(body, prompt=p))
            assert r.status_code == 200 and r.json()["choices"][0]["text"]
            assert i in touched or r.json()["choices"][0]["text"] == text
        # Garbage, truncated, wrong tokens and another model's layers are dropped when a chain reaches
        # them (one may sit behind another in the same chain); a block saved without logits is bad only
        # where it ends a prompt (blocks inside a chain hold none), and then a shorter chain serves.
        m = s.metrics()
        assert m["anchorkv_prefix_bad_entries_total"] >= 3, m
        assert m["anchorkv_server_errors_total"] == 0
    finally:
        assert s.stop() == 0
    # At start: the same damage, plus a FIFO, a folder and a left-over temporary file where files are expected.
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill / "x"))  # spill afresh
    try:
        first = [s.post("/v1/completions", dict(body, prompt=p)).json()["choices"][0]["text"] for p in prompts]
    finally:
        s.stop()
    spill2 = spill / "x"
    files = sorted(spill2.glob("block-*.akvc"))
    touched = touched_prompts(files, prompts, core)
    damage(files, core)
    os.mkfifo(spill2 / "block-900.akvc")
    (spill2 / "block-901.akvc").mkdir()
    (spill2 / ".block-902.akvc.tmp.AbCdEf").write_bytes(b"half a file")
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill2))
    try:
        assert not (spill2 / ".block-902.akvc.tmp.AbCdEf").exists(), "temporary files are cleaned up"
        for i, (p, text) in enumerate(zip(prompts, first)):
            r = s.post("/v1/completions", dict(body, prompt=p))
            assert r.status_code == 200 and r.json()["choices"][0]["text"]
            assert i in touched or r.json()["choices"][0]["text"] == text
        assert s.metrics()["anchorkv_server_errors_total"] == 0
        assert stat.S_ISFIFO(os.stat(spill2 / "block-900.akvc").st_mode)
    finally:
        assert s.stop() == 0


def test_a_pooled_file_without_logits_for_the_whole_prompt_does_not_crash(tmp_path):
    import anchorkv
    core = anchorkv._core
    spill = tmp_path / "spill"
    prompt = [(j * 7) % 240 + 4 for j in range(160)]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill))
    try:
        want = s.post("/v1/completions", body).json()["choices"][0]["text"]
        for i in range(4):  # push the prompt's entry out to the folder
            s.post("/v1/completions", {"prompt": [(j * 11 + i) % 240 + 4 for j in range(160)], "max_tokens": 1})
    finally:
        s.stop()
    for f in spill.glob("block-*.akvc"):
        natives, tokens, logits, entries = core.load_caches(str(f))
        core.save_caches(str(f), natives, list(tokens), [], dict(entries))  # valid: logits are optional
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill))
    try:
        r = s.post("/v1/completions", body)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        r = s.post("/v1/completions", dict(body, prompt=prompt + [9, 10]))  # still a good prefix for longer ones
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 160
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------- files that are not regular files

def special_files(tmp_path):
    fifo = tmp_path / "fifo.akvc"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.akvc"
    folder.mkdir()
    out = {"fifo": fifo, "folder": folder}
    dev = tmp_path / "devnull"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        out["device"] = dev
    except (PermissionError, OSError):
        pass  # no device nodes here: FIFOs and folders are still checked
    return out


def run_cli(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=30)


def test_the_cli_never_blocks_on_or_replaces_special_files(tmp_path):
    specials = special_files(tmp_path)
    for kind, path in specials.items():
        mode = os.stat(path).st_mode
        r = run_cli("run", "-m", TINY, "-p", "In the beginning", "-n", "2", "--prompt-cache", path)
        assert r.returncode != 0 and "not a regular file" in r.stderr, (kind, r.stderr)
        assert os.stat(path).st_mode == mode, f"{kind} was replaced"
        r = run_cli("run", "-m", path, "-p", "x", "-n", "1")
        assert r.returncode != 0, kind
        r = run_cli("eval", "-m", TINY, "--text", path, "--ctx", "64")
        assert r.returncode != 0, kind
        r = run_cli("run", "-m", TINY, "--prompt-file", path, "-n", "1")
        assert r.returncode != 0, kind
    # A regular file that is not a cache file is not overwritten either.
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    r = run_cli("run", "-m", TINY, "-p", "In the beginning", "-n", "2", "--prompt-cache", notes)
    assert r.returncode != 0 and "not a cache file" in r.stderr
    assert notes.read_text() == "my notes"


def test_python_never_blocks_on_or_replaces_special_files(tmp_path):
    import anchorkv
    specials = special_files(tmp_path)
    cache = anchorkv.AnchorKVKVCache()
    k = np.ones((1, 1, 64, 8), np.float32)
    cache.update_and_fetch(k, k)
    done = {}

    def attempt():
        for kind, path in specials.items():
            with pytest.raises(OSError, match="regular file"):
                anchorkv.load_prompt_cache(str(path))
            mode = os.stat(path).st_mode
            with pytest.raises(OSError):
                anchorkv.save_prompt_cache(str(path), [cache])
            assert os.stat(path).st_mode == mode
        done["ok"] = True

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(20)
    assert done.get("ok"), "a load or save blocked, or failed its checks"


def test_a_folder_that_cannot_be_written_turns_spills_into_drops(tmp_path):
    spill = tmp_path / "spill"
    s = Server(*CACHE, "--cache-budget", "60000", "--cache-dir", str(spill))
    try:
        prompts = [[(i * 13 + j) % 240 + 4 for j in range(160)] for i in range(6)]
        for p in prompts[:3]:
            assert s.post("/v1/completions", {"prompt": p, "max_tokens": 2}).ok
        # The folder goes away and a file takes its place: writes and read-backs fail.
        for f in spill.iterdir():
            f.unlink()
        spill.rmdir()
        spill.write_text("not a folder")
        for p in prompts:
            r = s.post("/v1/completions", {"prompt": p, "max_tokens": 2})
            assert r.status_code == 200
        m = s.metrics()
        assert m["anchorkv_prefix_disk_errors_total"] >= 1 and m["anchorkv_server_errors_total"] == 0, m
    finally:
        assert s.stop() == 0
