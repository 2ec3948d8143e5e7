#!/usr/bin/env python3
"""A multi-turn chat through `anchorkv serve` on loopback: per turn the prompt's
tokens, those restored from the pool (`cached_tokens`), the bytes the turn
added to the pool (`anchorkv_prefix_pool_bytes`) against the fp16 K/V of the
tokens it prefilled, and the pool's total against one fp16 copy of the
conversation. Greedy answers of --answer tokens.

    bench/chat_session.py --cli build/anchorkv -m ../shared/models/anchorkv-d128.gguf \\
        --cache anchorkv_tight:pre:obs:auto --turns 10 --json out.json

The fp16 bytes per token (every layer's K and V) come from --fp16-per-token
(default: 4 layers x 1 KV head x head dim 128 x 2 x 2 bytes = 2048, the shared
d128 model; the tiny model's 4 x 2 x 64 x 4 is also 2048).
"""
import argparse
import json
import signal
import socket
import subprocess
import time

import requests

QUESTIONS = [
    "Tell me about the beginning of the world.",
    "What did God create on the second day?",
    "And what came after the waters were gathered?",
    "Who was given dominion over the fish of the sea?",
    "What was made to rule the night?",
    "Describe the garden that was planted in the east.",
    "What happened on the seventh day?",
    "Which rivers went out of the garden?",
    "What was the man told not to eat?",
    "How did the story of that garden end?",
    "Tell me one more thing about the firmament.",
    "What is the moral of it all?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(url):
    text = requests.get(url + "/metrics", timeout=5).text
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/anchorkv")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--cache", default="anchorkv_tight:pre:obs:auto")
    ap.add_argument("--theta", type=float, default=0.05)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--answer", type=int, default=60)
    ap.add_argument("--fp16-per-token", type=int, default=2048)
    ap.add_argument("--json")
    a = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([a.cli, "serve", "-m", a.model, "--port", str(port), "--cache", a.cache, "--theta",
                             str(a.theta), "--chat-template", "chatml", "--threads", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):
            try:
                if requests.get(url + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
        messages, rows, pool_before = [], [], 0.0
        print(f"{a.cache} theta {a.theta}: {a.turns} turns, {a.answer}-token greedy answers\n")
        print(f"  {'turn':>4} {'prompt':>7} {'cached':>7} {'added B':>10} {'fp16 B':>10} {'ratio':>7} {'pool B':>10} "
              f"{'pool vs one fp16 copy':>22}")
        for turn in range(a.turns):
            messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            r = requests.post(url + "/v1/chat/completions",
                              json={"messages": messages, "max_tokens": a.answer, "temperature": 0}, timeout=300)
            if r.status_code == 400:  # the conversation no longer fits the model's context
                print(f"  turn {turn}: {r.json()['error']['message']}")
                break
            r.raise_for_status()
            j = r.json()
            messages.append({"role": "assistant", "content": j["choices"][0]["message"]["content"]})
            prompt = j["usage"]["prompt_tokens"]
            cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            pool = metrics(url)["anchorkv_prefix_pool_bytes"]
            added, fp16 = pool - pool_before, (prompt - cached) * a.fp16_per_token
            rows.append({"turn": turn, "prompt_tokens": prompt, "cached_tokens": cached, "added_bytes": added,
                         "added_fp16_bytes": fp16, "added_ratio": fp16 / added if added > 0 else None,
                         "pool_bytes": pool, "pool_vs_fp16_copy": pool / (prompt * a.fp16_per_token)})
            print(f"  {turn:>4} {prompt:>7} {cached:>7} {added:>10.0f} {fp16:>10} {fp16 / max(added, 1):>6.1f}x "
                  f"{pool:>10.0f} {pool / (prompt * a.fp16_per_token):>21.2f}x")
            pool_before = pool
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"model": a.model, "cache": a.cache, "theta": a.theta, "answer_tokens": a.answer,
                           "turns": rows}, f, indent=2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


if __name__ == "__main__":
    main()
