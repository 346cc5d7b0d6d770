#!/usr/bin/env python3
"""soak_server.py — a bounded soak of pi2 serve: 4 clients (each its own prompt and seed) stream completions
concurrently for --seconds (default 300) against a server with --parallel 4 that this script starts on 127.0.0.1
and a free port. Passes when no request failed, every client's output equals the same request run alone (taken
first, one client at a time), and the server's RSS grew by at most --max-rss-growth (5 %) from the end of the
warm-up to the end. Reports the aggregate tokens/s of the 4 clients against one client alone. Exit 1 on failure.

    python3 scripts/soak_server.py MODEL [--seconds 300] [-t 2] [--clients 4] [-n 48] [--no-batch]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

PROMPTS = ["Once upon a time, in a village by the sea,", "The three most important rules of cooking are",
           "Here is a short poem about the morning:", "A guide to repairing a bicycle puncture:",
           "The history of the telescope began", "Dear diary, today something strange happened:"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def complete(port: int, prompt: str, seed: int, n: int) -> tuple:
    """(text, completion tokens) of one streamed request; raises on any failure."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": n, "seed": seed,
                                                     "stream": True, "ignore_eos": True,
                                                     "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    text, usage, done = [], None, False
    for raw in r:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"]["message"])
            usage = ev.get("usage") or usage
            text += [ch["text"] for ch in ev.get("choices", [])]
    c.close()
    if not done or usage is None:
        raise RuntimeError("the stream ended early")
    return "".join(text), usage["completion_tokens"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("-n", type=int, default=48, help="tokens per request")
    ap.add_argument("--max-rss-growth", type=float, default=0.05)
    ap.add_argument("--no-batch", action="store_true", help="the server decodes each slot alone")
    a = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-m", "pi2", "serve", a.model, "--port", "0", "-t", str(a.threads),
                             "-c", "1024", "-np", str(a.clients)] + (["--no-batch"] if a.no_batch else []), stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        print("pi2 serve did not start", file=sys.stderr)
        return 1
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()   # drain its log
    jobs = [(PROMPTS[i % len(PROMPTS)], 100 + i) for i in range(a.clients)]
    try:
        t0 = time.perf_counter()
        alone = [complete(port, p, s, a.n) for p, s in jobs]     # also the warm-up: every slot's buffers exist
        one_client_ts = sum(n for _, n in alone) / (time.perf_counter() - t0)
        warm = [threading.Thread(target=complete, args=(port, p, s, a.n)) for p, s in jobs]
        for t in warm:              # a concurrent pass: every slot's context and buffers are touched
            t.start()
        for t in warm:
            t.join()
        rss0 = rss_kib(proc.pid)
        stats = [{"requests": 0, "tokens": 0, "mismatches": 0, "failures": []} for _ in jobs]
        stop_at = time.monotonic() + a.seconds

        def client(i):
            p, s = jobs[i]
            while time.monotonic() < stop_at:
                try:
                    text, n = complete(port, p, s, a.n)
                except Exception as e:   # noqa: BLE001 — counted, reported
                    stats[i]["failures"].append(f"{type(e).__name__}: {e}")
                    continue
                stats[i]["requests"] += 1
                stats[i]["tokens"] += n
                stats[i]["mismatches"] += text != alone[i][0]
        t1 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t1
        rss1 = rss_kib(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
    total = sum(st["tokens"] for st in stats)
    growth = (rss1 - rss0) / rss0
    out = {"model": os.path.basename(a.model), "threads": a.threads, "clients": a.clients, "batched": not a.no_batch, "seconds": round(elapsed, 1),
           "requests": sum(st["requests"] for st in stats), "failed": sum(len(st["failures"]) for st in stats),
           "mismatched_outputs": sum(st["mismatches"] for st in stats),
           "aggregate_tokens_per_s": round(total / elapsed, 2), "one_client_tokens_per_s": round(one_client_ts, 2),
           "rss_start_mib": round(rss0 / 1024, 1), "rss_end_mib": round(rss1 / 1024, 1),
           "rss_growth": round(growth, 4), "server_exit": code,
           "failures": [f for st in stats for f in st["failures"]][:5]}
    print(json.dumps(out, indent=1))
    ok = not out["failed"] and not out["mismatched_outputs"] and growth <= a.max_rss_growth and code == 130
    print("soak: " + ("passed" if ok else "FAILED"), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
