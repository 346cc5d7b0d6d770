#!/usr/bin/env python3
"""serve_figures.py — pi2 serve's speed figures on one model: one client streaming (decode tokens/s, from its first
to its last token) against `pi2 bench -p 0 -n N` (tg) with the same threads, and the first token's latency of a
conversation's second turn against its first (a ~1,500-token conversation: the prompt cache evaluates only the
new turn). Starts its own server on 127.0.0.1 and a free port; run it under /work/bin/quiet-style isolation.

    python3 scripts/serve_figures.py MODEL [-t 2] [-n 128] [--rounds 3] [--conv-tokens 1500]

--conv-tokens 0 skips the conversation (streaming figures only).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time


def start(model, threads, ctx, parallel=1):
    p = subprocess.Popen([sys.executable, "-m", "pi2", "serve", model, "--port", "0", "-t", str(threads), "-c",
                          str(ctx), "-np", str(parallel)], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1))
    raise SystemExit("pi2 serve did not start")


def stream(port, path, body):
    """(seconds to the first text chunk, seconds of the first to the last chunk, text chunks, usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    first = last = None
    n, usage, text = 0, None, []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
            if piece:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                n += 1
                text.append(piece)
    c.close()
    return first - t0, last - first, n, usage, "".join(text)


def bench_tg(model, threads, n):
    out = subprocess.run([sys.executable, "-m", "pi2", "bench", model, "-p", "0", "-n", str(n), "-t", str(threads),
                          "-r", "3", "-o", "json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    return rows[0]["avg_ts"]


def conversation(tokens_wanted: int):
    """Messages of at least about tokens_wanted tokens (SmolLM2 and Qwen take ~4.3 characters a token here)."""
    para = ("The history of the printing press begins in the fifteenth century, when movable type changed how "
            "books were made, sold and read across Europe, and scholars argue about its effects to this day. ")
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    while sum(len(m["content"]) for m in msgs) < tokens_wanted * 4.6:
        msgs.append({"role": "user", "content": para * 2 + " What do you think?"})
        msgs.append({"role": "assistant", "content": "It is a rich subject. " + para})
    msgs.append({"role": "user", "content": "Summarise our talk in one sentence."})
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conv-tokens", type=int, default=1500)
    ap.add_argument("--temp", type=float, default=0.8)
    a = ap.parse_args()
    proc, port = start(a.model, a.threads, 4096)
    try:
        body = {"prompt": "Write a long story about a lighthouse keeper.", "max_tokens": a.n, "ignore_eos": True,
                "seed": 1, "temperature": a.temp}
        stream(port, "/v1/completions", {**body, "max_tokens": 8})        # warm-up
        rates, tg = [], []
        for _ in range(a.rounds):         # interleaved: server stream, then bench
            _, dt, n, usage, _ = stream(port, "/v1/completions", {**body, "prompt": body["prompt"] + f" {_}"})
            rates.append((usage["completion_tokens"] - 1) / dt)
            tg.append(bench_tg(a.model, a.threads, a.n))
        if a.conv_tokens > 0:
            msgs = conversation(a.conv_tokens)
            ttft1, _, _, u1, reply = stream(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 32,
                                                                           "seed": 2})
            msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And in a word?"}]
            ttft2, _, _, u2, _ = stream(port, "/v1/chat/completions", {"messages": msgs2, "max_tokens": 8,
                                                                       "seed": 3})
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    stream_ts, tg_ts = statistics.median(rates), statistics.median(tg)
    out = {"model": os.path.basename(a.model), "threads": a.threads, "n": a.n, "temp": a.temp,
           "stream_tokens_per_s": [round(r, 2) for r in rates], "bench_tg_tokens_per_s": [round(r, 2) for r in tg],
           "ratio_median": round(stream_ts / tg_ts, 3)}
    if a.conv_tokens > 0:
        out.update({"conversation_prompt_tokens": u1["prompt_tokens"], "ttft_first_turn_s": round(ttft1, 3),
                    "second_turn_prompt_tokens": u2["prompt_tokens"],
                    "second_turn_cached_tokens": u2["prompt_tokens_details"]["cached_tokens"],
                    "ttft_second_turn_s": round(ttft2, 3), "ttft_ratio": round(ttft1 / ttft2, 1)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
