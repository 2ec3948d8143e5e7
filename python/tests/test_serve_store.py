"""Two `anchorkv serve` replicas sharing prefix blocks through a real redis-server (--kv-store)."""
import concurrent.futures
import re
import shutil
import socket
import subprocess
import time

import pytest

from test_serve import CACHE, CLI, TINY, Server, _free_port, requests

pytestmark = pytest.mark.skipif(not CLI or not TINY.exists() or not shutil.which("redis-server"),
                                reason="needs the anchorkv CLI, the tiny model and redis-server")

DOC = [(7 * j) % 250 + 5 for j in range(420)]
BODY = {"max_tokens": 12, "temperature": 0}


class Redis:
    """A redis-server of the test's own: loopback, no persistence, 64 MiB, LRU eviction."""

    def __init__(self, port=None):
        self.port = port or _free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy",
                                      "allkeys-lru"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                self.call("PING")
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    url = property(lambda self: f"redis://127.0.0.1:{self.port}")

    def call(self, *args):
        """One command in the Redis protocol (binary safe); returns the reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            out = b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(out)
            f = s.makefile("rb")
            return self._reply(f)

    def _reply(self, f):
        line = f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b"-"):
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2]
        if kind == b"*":
            return [self._reply(f) for _ in range(int(rest))]
        raise OSError("not the Redis protocol")

    def blocks(self):
        """{key: (first position, value)} of every stored block."""
        out = {}
        for k in self.call("KEYS", "anchorkv:1:*:block:*"):
            v = self.call("GET", k)
            if v is not None:
                out[k] = (int(re.search(rb"chain\.first.{0,8}?(\d+)", v, re.S).group(1)), v)
        return out

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def replica(redis, *extra):
    return Server(*CACHE, "--kv-store", redis.url, "--kv-store-timeout", "200", *extra)


def complete(server, prompt, **kw):
    r = server.post("/v1/completions", dict(BODY, prompt=prompt, **kw))
    assert r.status_code == 200, r.text
    j = r.json()
    return j["choices"][0]["text"], j["usage"]["prompt_tokens_details"]["cached_tokens"]


def written(server, n):
    """Waits until the replica has written n blocks to the store (writes are in the background)."""
    for _ in range(250):
        if server.metrics().get("anchorkv_kv_store_blocks_written_total", 0) >= n:
            return
        time.sleep(0.02)
    raise AssertionError("the replica did not write its blocks")


@pytest.fixture
def redis():
    r = Redis()
    yield r
    r.stop()


def test_a_document_seen_on_one_replica_is_restored_on_another(redis):
    a, b = replica(redis), replica(redis)
    try:
        complete(a, DOC)
        written(a, 1)
        stored = redis.blocks()
        assert stored and sorted(f for f, _ in stored.values())[0] == 0
        tail = DOC + [11, 12, 13]
        text_b, cached = complete(b, tail)
        assert cached == len(DOC), "B restores the document and prefills only the tail"
        m = b.metrics()
        assert m["anchorkv_kv_store_hits_total"] == 1 and m["anchorkv_kv_store_blocks_read_total"] == len(stored)
        assert m["anchorkv_kv_store_read_bytes_total"] == sum(len(v) for _, v in stored.values())
        again, cached = complete(b, tail)  # now from B's own pool
        assert cached == len(tail) and again == text_b
        text_a, cached = complete(a, tail)  # the document from A's pool, the tail from B's block in the store
        assert cached == len(tail) and text_a == text_b
        assert requests.get(b.url + "/health").json()["kv_store"] == "up"
    finally:
        a.stop(), b.stop()
    # A replica that starts with an empty pool finds the whole prompt in the store.
    c = replica(redis)
    try:
        text_c, cached = complete(c, tail)
        assert cached == len(tail) and text_c == text_b
    finally:
        c.stop()


def test_a_store_that_goes_away_costs_prefills_never_requests(redis):
    a, b = replica(redis), replica(redis)
    try:
        complete(a, DOC)
        written(a, 1)
        redis.stop()
        for i in range(6):
            text, cached = complete(b if i % 2 else a, DOC[:300] + [i])
        for s in (a, b):
            assert requests.get(s.url + "/health").json() == {"status": "ok", "kv_store": "down"}
            assert s.metrics()["anchorkv_kv_store_up"] == 0
        back = Redis(redis.port)  # an empty store on the same address
        try:
            for s in (a, b):
                for _ in range(300):
                    if requests.get(s.url + "/health").json()["kv_store"] == "up":
                        break
                    time.sleep(0.02)
                assert requests.get(s.url + "/health").json()["kv_store"] == "up", "reconnected without a restart"
            other = [(11 * j) % 250 + 5 for j in range(300)]
            before = a.metrics()["anchorkv_kv_store_blocks_written_total"]
            complete(a, other)
            written(a, before + 1)
            assert complete(b, other + [1])[1] == len(other)
        finally:
            back.stop()
    finally:
        a.stop(), b.stop()


def test_damaged_or_foreign_values_are_misses_deleted_and_counted(redis):
    plain = Server(*CACHE)  # the truth: no store at all
    a, b = replica(redis), replica(redis)
    foreign = Server("--cache", "anchorkv_compact:pre", "--theta", "0.2", "--kv-store", redis.url)
    try:
        want = complete(plain, DOC)[0]
        complete(foreign, DOC)
        written(foreign, 1)
        other_spec = list(redis.blocks().values())
        complete(a, DOC)
        written(a, 1)
        ours = {k: v for k, v in redis.blocks().items() if v[1] not in {x[1] for x in other_spec}}
        first_key = next(k for k, (f, _) in ours.items() if f == 0)
        value = ours[first_key][1]
        damages = [b"garbage", value[: len(value) // 2], value[:-1] + bytes([value[-1] ^ 1]), other_spec[0][1]]
        for i, damage in enumerate(damages):
            redis.call("SET", first_key, damage)
            text, cached = complete(b, DOC)
            assert cached == 0 and text == want, f"damage {i}: nothing restored, the answer unchanged"
            # Deleted (B may have written its own good copy back since: it prefilled the same tokens).
            assert redis.call("GET", first_key) in (None, value), "the bad value is deleted"
            assert b.metrics()["anchorkv_kv_store_bad_entries_total"] == 1
            b.stop()
            b = replica(redis)  # an empty pool again
            redis.call("SET", first_key, value)
        text, cached = complete(b, DOC)  # the good value back: used again
        assert text == want and cached >= len(DOC)
    finally:
        for s in (plain, a, b, foreign):
            s.stop()


def test_an_evicted_middle_block_ends_the_hit_there(redis):
    a, b = replica(redis), replica(redis)
    try:
        chat = [DOC[:200]]
        for t in range(1, 4):  # a conversation: each turn adds its own blocks
            chat.append(chat[-1] + [(j * (19 + t)) % 240 + 4 for j in range(120)])
        for p in chat:
            complete(a, p)
        written(a, 4)
        stored = sorted(redis.blocks().items(), key=lambda kv: kv[1][0])
        firsts = [f for _, (f, _) in stored]
        assert firsts[0] == 0 and len(stored) >= 4, firsts
        middle = len(stored) // 2
        redis.call("DEL", stored[middle][0])
        text, cached = complete(b, chat[-1] + [7])
        assert cached == firsts[middle], "the chain stops before the missing block; the rest is prefilled"
        assert b.metrics()["anchorkv_kv_store_bad_entries_total"] == 0, "a missing block is a miss, not damage"
    finally:
        a.stop(), b.stop()


def test_load_through_two_replicas(redis):
    a, b = replica(redis, "--parallel", "2"), replica(redis, "--parallel", "2")
    docs = [[(j * (3 + d)) % 240 + 4 for j in range(160)] for d in range(4)]
    try:
        for d in docs:  # A has seen every document: B's first question about each finds it in the store
            complete(a, d)
        written(a, 4)
        def client(c):
            out = []
            for i in range(20):
                s = (a, b)[(c + i) % 2]
                r = s.post("/v1/completions", {"prompt": docs[(c + i) % 4] + [c, i], "max_tokens": 4, "temperature": 0})
                out.append((r.status_code, r.json()))
            return out
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = [r for rs in pool.map(client, range(8)) for r in rs]
        assert len(results) == 160
        for status, j in results:
            assert status == 200 and j["choices"][0]["finish_reason"] in ("length", "stop"), j
            assert j["usage"]["prompt_tokens"] == 162
        hits = a.metrics()["anchorkv_kv_store_hits_total"] + b.metrics()["anchorkv_kv_store_hits_total"]
        assert hits > 0
        assert a.metrics()["anchorkv_kv_store_errors_total"] == b.metrics()["anchorkv_kv_store_errors_total"] == 0
    finally:
        a.stop(), b.stop()


def test_an_unknown_store_scheme_is_refused():
    r = subprocess.run([CLI, "serve", "-m", str(TINY), "--kv-store", "memcached://127.0.0.1:11211"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--kv-store" in r.stderr and "unknown scheme" in r.stderr
