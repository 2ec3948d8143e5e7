"""Side-by-side speed of anchorkv and llama.cpp on the same GGUF files (a benchmark; no build
or test of the project depends on it).

llama.cpp comes from the npm package node-llama-cpp@3.21.1: its prebuilt CPU libraries
(libllama, libggml and one libggml-cpu-<arch> per x86 level) and its bundled llama.cpp sources.
The package ships no llama-bench, so this script compiles llama.cpp's own tools/llama-bench
against the prebuilt libraries (one g++ call, seconds) and puts the binary beside them, where
ggml looks for its CPU backends. Needs node/npm (network for the first install) and g++.

Runs alternate within each repetition (anchorkv, then llama.cpp with each KV type), same
threads. The first table reports min / median / max of each speed; the second, the ratio of
each anchorkv cache to each llama.cpp KV type taken within one repetition (the two ran back
to back, so a machine that slows for a while moves both) as min / median / max over the
repetitions, so a swing like 0.90-1.51x shows:
  * prefill: llama-bench `-p CTX -n 0` (flash attention on) vs `anchorkv bench runtime` prefill;
  * decode: llama-bench `-p 0 -n N -d CTX` (N tokens generated after a CTX-token context) vs
    anchorkv's N greedy steps after a CTX-token prompt;
  * KV bytes at CTX tokens as each cache reports them (anchorkv's bytes_after_prefill); llama.cpp's
    from its cache types: anchorkv's full cache holds the same elements in fp16 (2 bytes each), q8_0
    takes 34/32 bytes per element, q4_0 18/32.

    /usr/bin/python3 bench/llama_cpp_compare.py --peer-dir /path/to/scratch -m synth-q8_0.gguf \\
        --ctx 512 -n 64 --threads 2 --reps 3 --json out.json
"""

import argparse
import glob
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "node-llama-cpp@3.21.1"
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def run(cmd, **kw):
    print("+", " ".join(map(str, cmd)), file=sys.stderr)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def install_peer(peer):
    """npm package + llama-bench built against its prebuilt libraries; returns the binary."""
    peer.mkdir(parents=True, exist_ok=True)
    pkg = peer / "node_modules" / "node-llama-cpp"
    if not pkg.exists():
        run(["npm", "i", "-E", "--no-audit", "--no-fund", PACKAGE], cwd=peer)
    bins = glob.glob(str(peer / "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"))
    if not bins:
        sys.exit("no prebuilt linux-x64 CPU binaries in the npm package")
    bins = pathlib.Path(bins[0])
    exe = bins / "llama-bench"
    if exe.exists():
        return exe
    src = peer / "llama.cpp"
    if not src.exists():
        run(["git", "clone", "-q", pkg / "llama" / "gitRelease.bundle", src])
    libs = [f"-l:{pathlib.Path(p).name}" for p in
            sorted(glob.glob(str(bins / "libllama-common.so")) + glob.glob(str(bins / "libllama.v*.so")) +
                   glob.glob(str(bins / "libggml.v*.so")) + glob.glob(str(bins / "libggml-base.so")))]
    run(["g++", "-std=c++17", "-O2", "-DNDEBUG", f"-I{src}/include", f"-I{src}/ggml/include", f"-I{src}/common",
         f"-I{src}/vendor", f"-I{src}/tools/llama-bench", src / "tools/llama-bench/llama-bench.cpp",
         src / "tools/llama-bench/main.cpp", "-o", exe, f"-L{bins}", *libs, f"-Wl,-rpath,{bins}", "-lpthread"])
    return exe


def llama_bench(exe, model, threads, args):
    out = run([exe, "-m", model, "-t", threads, "-fa", "1", "-r", 1, "-o", "json", *args],
              capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def anchorkv_bench(model, ctx, n, threads, caches, theta, activations):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([ROOT / "build/anchorkv", "bench", "runtime", "-m", model, "--ctx", ctx, "-n", n, "--threads", threads,
             "--caches", ",".join(caches), "--theta", theta, "--reps", 1, "--activations", activations,
             "--json", f.name], capture_output=True)
        return {r["cache"]: r for r in json.load(open(f.name))["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer-dir", required=True, help="scratch folder for the npm package and llama-bench")
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kv", default="f16,q8_0,q4_0", help="llama.cpp KV cache types")
    ap.add_argument("--caches", default="full,anchorkv", help="anchorkv caches")
    ap.add_argument("--theta", type=float, default=0.1)
    ap.add_argument("--activations", default="int8", choices=["int8", "f32"])
    ap.add_argument("--no-prefill", action="store_true", help="decode only (long contexts)")
    ap.add_argument("--json")
    a = ap.parse_args()
    exe = install_peer(pathlib.Path(a.peer_dir).resolve())
    kvs = a.kv.split(",")
    caches = ["full"] + [c for c in a.caches.split(",") if c != "full"]  # full: the fp16 KV bytes
    rows, ratios = [], []
    for model in a.model:
        samples = {}
        for _ in range(a.reps):
            ours = anchorkv_bench(model, a.ctx, a.n, a.threads, caches, a.theta, a.activations)
            for c in caches:
                s = samples.setdefault(("anchorkv", c), {"prefill": [], "decode": [], "bytes": 0})
                s["prefill"].append(ours[c]["prefill_tok_s"])
                s["decode"].append(ours[c]["decode_tok_s"])
                s["bytes"] = ours[c]["bytes_after_prefill"]
            kv_elements = ours["full"]["bytes_after_prefill"] / 2
            for kv in kvs:
                s = samples.setdefault(("llama.cpp", kv), {"prefill": [], "decode": [],
                                                           "bytes": int(kv_elements * KV_BYTES_PER_ELEMENT[kv])})
                kv_args = ["-ctk", kv, "-ctv", kv]
                if not a.no_prefill:
                    s["prefill"].append(llama_bench(exe, model, a.threads, ["-p", a.ctx, "-n", 0, *kv_args]))
                s["decode"].append(llama_bench(exe, model, a.threads, ["-p", 0, "-n", a.n, "-d", a.ctx, *kv_args]))
        for (who, cache), s in samples.items():
            rows.append({"model": os.path.basename(model), "engine": who, "kv": cache, "ctx": a.ctx,
                         "threads": a.threads, "kv_bytes": s["bytes"], "reps": a.reps,
                         "prefill_tok_s": spread(s["prefill"]), "decode_tok_s": spread(s["decode"]),
                         "prefill_samples": s["prefill"], "decode_samples": s["decode"]})
        for c in caches:
            ours = samples[("anchorkv", c)]
            for kv in kvs:
                peer = samples[("llama.cpp", kv)]
                ratios.append({"model": os.path.basename(model), "anchorkv": c, "llama.cpp": kv,
                               "decode": spread([x / y for x, y in zip(ours["decode"], peer["decode"])]),
                               "prefill": spread([x / y for x, y in zip(ours["prefill"], peer["prefill"])])})
    print(f"| model | engine | KV | KV MB at {a.ctx} | prefill tok/s (min / median / max) | "
          "decode tok/s (min / median / max) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['engine']} | {r['kv']} | {r['kv_bytes'] / 1e6:.2f} | "
              f"{show(r['prefill_tok_s'], '.0f')} | {show(r['decode_tok_s'], '.1f')} |")
    print(f"\n| model | anchorkv cache | llama.cpp KV | decode ratio (min / median / max) | "
          f"prefill ratio (min / median / max) |")
    print("|---|---|---|---|---|")
    for r in ratios:
        print(f"| {r['model']} | {r['anchorkv']} | {r['llama.cpp']} | {show(r['decode'], '.2f', 'x')} | "
              f"{show(r['prefill'], '.2f', 'x')} |")
    if a.json:
        json.dump({"activations": a.activations, "theta": a.theta, "rows": rows, "ratios": ratios},
                  open(a.json, "w"), indent=2)


def spread(values):
    """min / median / max of the repetitions (None when there are none)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def show(s, fmt, unit=""):
    if s is None:
        return "-"
    return " / ".join(f"{s[k]:{fmt}}{unit}" for k in ("min", "median", "max"))


if __name__ == "__main__":
    main()
