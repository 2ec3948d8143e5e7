#!/usr/bin/env python3
"""Measures replicas of `anchorkv serve` sharing prefix blocks through a redis-server (--kv-store), per cache:
time to first token on replica B for a 900-token document first seen on replica A, against a fresh prefill
and against a hit in B's own pool; the bytes one hit moves from the store; the store memory one 900-token
prefix takes (Redis' MEMORY USAGE of its keys) and so how many a 64 MiB store holds; requests per second of
one replica against two sharing the store under 8 clients x 20 requests (the same cores in both runs).

    bench/store_bench.py --cli build/anchorkv -m ../shared/models/anchorkv-d128.gguf \\
        --caches full,anchorkv_tight:pre:obs:auto --json out.json
"""
import argparse
import concurrent.futures
import json
import random
import signal
import socket
import statistics
import subprocess
import time

import requests

from serve_bench import free_port, metrics, ttft


class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy",
                                      "allkeys-lru"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                self.call("PING")
                return
            except OSError:
                time.sleep(0.02)

    def call(self, *args):
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(str(a)), str(a).encode())
                                                         for a in args))
            f = s.makefile("rb")
            line = f.readline()
            if line[:1] == b"*":
                return [f.readline() and f.readline()[:-2].decode() for _ in range(int(line[1:]))]
            if line[:1] == b":":
                return int(line[1:])
            return line[1:-2].decode()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def start(cli, model, cache, theta, store, parallel=1):
    port = free_port()
    args = [cli, "serve", "-m", model, "--port", str(port), "--cache", cache, "--theta", str(theta),
            "--parallel", str(parallel), "--threads", "1", "--cache-budget", "64MiB"]
    proc = subprocess.Popen(args + (["--kv-store", store] if store else []), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if requests.get(url + "/health", timeout=1).ok:
                return proc, url
        except requests.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def stop(*procs):
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


def written(url, n):
    for _ in range(500):
        if metrics(url).get("anchorkv_kv_store_blocks_written_total", 0) >= n:
            return
        time.sleep(0.01)
    raise RuntimeError("the replica did not write its blocks")


def load(urls, docs):
    """8 clients x 20 requests (a 160-token document + 2 tokens, 8 tokens each), spread over `urls`."""
    def client(c):
        for i in range(20):
            r = requests.post(urls[(c + i) % len(urls)] + "/v1/completions",
                              json={"prompt": docs[(c + i) % len(docs)] + [c + 3, i + 3], "max_tokens": 8,
                                    "temperature": 0}, timeout=300)
            assert r.ok, r.text
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(client, range(8)))
    return 160 / (time.perf_counter() - t0)


def measure(cli, model, cache, theta, reps):
    rng = random.Random(5)
    doc = lambda n=900: [rng.randrange(3, 259) for _ in range(n)]
    redis = Redis()
    a, url_a = start(cli, model, cache, theta, f"redis://127.0.0.1:{redis.port}")
    b, url_b = start(cli, model, cache, theta, f"redis://127.0.0.1:{redis.port}")
    try:
        fresh, shared, own, moved = [], [], [], []
        for i in range(reps):
            d = doc()
            fresh.append(ttft(url_b, doc() + [7, 8])[0])
            before = metrics(url_a).get("anchorkv_kv_store_blocks_written_total", 0)
            ttft(url_a, d)
            written(url_a, before + 1)
            read0 = metrics(url_b)["anchorkv_kv_store_read_bytes_total"]
            shared.append(ttft(url_b, d + [9, i + 3])[0])
            moved.append(metrics(url_b)["anchorkv_kv_store_read_bytes_total"] - read0)
            own.append(ttft(url_b, d + [10, i + 3])[0])
        stop(a, b)
        redis.call("FLUSHALL")
        a, url_a = start(cli, model, cache, theta, f"redis://127.0.0.1:{redis.port}")
        ttft(url_a, doc())
        written(url_a, 1)
        keys = redis.call("KEYS", "anchorkv:*")
        per_prefix = sum(redis.call("MEMORY", "USAGE", k) for k in keys)
        stop(a)
        docs = [doc(160) for _ in range(4)]
        one, url_one = start(cli, model, cache, theta, None, parallel=2)
        rps_one = load([url_one], docs)
        stop(one)
        redis.call("FLUSHALL")
        a, url_a = start(cli, model, cache, theta, f"redis://127.0.0.1:{redis.port}")
        b, url_b = start(cli, model, cache, theta, f"redis://127.0.0.1:{redis.port}")
        rps_two = load([url_a, url_b], docs)
        return {"cache": cache, "ttft_fresh_ms": 1e3 * statistics.median(fresh),
                "ttft_store_hit_ms": 1e3 * statistics.median(shared),
                "ttft_own_pool_ms": 1e3 * statistics.median(own), "bytes_per_hit": statistics.median(moved),
                "store_bytes_per_prefix": per_prefix, "prefixes_in_64MiB": int(64 * 2**20 // per_prefix),
                "rps_one_replica": rps_one, "rps_two_replicas": rps_two}
    finally:
        for p in (a, b):
            if p.poll() is None:
                stop(p)
        redis.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--caches", default="full,anchorkv_tight:pre:obs:auto")
    ap.add_argument("--theta", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [measure(a.cli, a.model, c, a.theta, a.reps) for c in a.caches.split(",")]
    print(f"{a.model}: 900-token document, 1 thread per request, theta {a.theta}, median of {a.reps}\n")
    print("| cache | TTFT fresh ms | TTFT store hit ms | TTFT own pool ms | bytes per hit | store bytes per prefix "
          "| prefixes in 64 MiB | req/s one replica | req/s two replicas |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cache']} | {r['ttft_fresh_ms']:.1f} | {r['ttft_store_hit_ms']:.1f} | {r['ttft_own_pool_ms']:.1f} "
              f"| {r['bytes_per_hit']:.0f} | {r['store_bytes_per_prefix']} | {r['prefixes_in_64MiB']} "
              f"| {r['rps_one_replica']:.1f} | {r['rps_two_replicas']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "theta": a.theta, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
