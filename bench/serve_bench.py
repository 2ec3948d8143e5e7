#!/usr/bin/env python3
"""Measures `anchorkv serve` on loopback, side by side per cache:
time to first token for a repeated 900-token prefix (pool hit) vs a fresh one,
requests per second and p50/p99 latency for 8 clients x 20 requests, and how
many 900-token prefixes a 64 MiB pool holds (from the pool's own byte count).

    bench/serve_bench.py --cli build/anchorkv -m ../shared/models/anchorkv-tiny.gguf \\
        --caches full,anchorkv_compact:pre --json out.json
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cli, model, cache, theta):
    port = free_port()
    proc = subprocess.Popen([cli, "serve", "-m", model, "--port", str(port), "--cache", cache, "--theta", str(theta),
                             "--parallel", "2", "--threads", "1", "--cache-budget", "64MiB", "--max-prompt", "4096"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if requests.get(url + "/health", timeout=1).ok:
                return proc, url
        except requests.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def ttft(url, ids):
    t0 = time.perf_counter()
    with requests.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 1, "temperature": 0,
                                                      "stream": True}, stream=True, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                return time.perf_counter() - t0, r
    raise RuntimeError("no token")


def metrics(url):
    text = requests.get(url + "/metrics", timeout=5).text
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}


def measure(cli, model, cache, theta, reps):
    proc, url = start(cli, model, cache, theta)
    rng = random.Random(5)
    try:
        prefix = [rng.randrange(3, 259) for _ in range(900)]
        cold = [ttft(url, [rng.randrange(3, 259) for _ in range(900)] + [7, 8])[0] for _ in range(reps)]
        ttft(url, prefix + [1, 2])
        ttft(url, prefix + [3, 4])  # shares 900 tokens with the first: the prefix enters the pool
        warm = [ttft(url, prefix + [rng.randrange(3, 259), 9])[0] for _ in range(reps)]
        m = metrics(url)
        entry = m["anchorkv_prefix_pool_bytes"] / max(1.0, m["anchorkv_prefix_pool_entries"])

        def client(c):
            lat = []
            for i in range(20):
                t0 = time.perf_counter()
                r = requests.post(url + "/v1/completions", json={
                    "prompt": [rng.randrange(3, 259) for _ in range(96)], "max_tokens": 16, "temperature": 0.7,
                    "seed": c * 100 + i}, timeout=120)
                assert r.ok
                lat.append(time.perf_counter() - t0)
            return lat

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            lat = sorted(x for l in ex.map(client, range(8)) for x in l)
        wall = time.perf_counter() - t0
        return {"cache": cache, "ttft_fresh_ms": 1e3 * statistics.median(cold),
                "ttft_pooled_prefix_ms": 1e3 * statistics.median(warm), "entry_bytes_900": entry,
                "prefixes_in_64MiB": int(64 * 2**20 // entry), "rps": len(lat) / wall,
                "p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[int(len(lat) * 0.99) - 1]}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--caches", default="full,anchorkv_compact:pre")
    ap.add_argument("--theta", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [measure(a.cli, a.model, c, a.theta, a.reps) for c in a.caches.split(",")]
    print(f"{a.model}: 900-token prefix, 2 slots, 1 thread per request, theta {a.theta}, median of {a.reps}\n")
    print("| cache | TTFT fresh ms | TTFT pooled prefix ms | entry bytes | prefixes in 64 MiB | req/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cache']} | {r['ttft_fresh_ms']:.1f} | {r['ttft_pooled_prefix_ms']:.1f} | {r['entry_bytes_900']:.0f} "
              f"| {r['prefixes_in_64MiB']} | {r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "theta": a.theta, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
