#!/usr/bin/env python3
"""expert_working_set.py — how a MoE model routes a text: per layer, the experts used and how concentrated the
routing is. Runs pi2's reference (llama.cpp's routing bit for bit) over the text in chunks of -c tokens, each a
fresh sequence as llama-perplexity evaluates them, and counts the (token, expert) rows routed to each expert.

Per layer: used = experts that got a row; top-k = share of rows the k most used experts took (k = experts per
token: what a cache holding k fixed experts would hit); top 25% = share of the most used quarter; max = the single
hottest expert's share. Synthetic files route far more evenly than trained models: their figures are worst cases.
Usage: python3 scripts/expert_working_set.py MODEL.gguf [-f TEXT] [-c 128] [--chunks 2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("-f", "--file", default=str(ROOT / "tests" / "data" / "moe-text.txt"))
    ap.add_argument("-c", "--ctx-size", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=2)
    a = ap.parse_args()
    from pi2.errors import Pi2Error
    from pi2.reference.moe import MoEContext
    from pi2.runtime import open_model
    try:
        m = open_model(a.model)
    except Pi2Error as e:
        sys.exit(f"pi2: error: {e}")
    c = m.config
    if not c.n_expert:
        sys.exit(f"pi2: error: {a.model} has no experts ({c.arch})")
    ids = m.tokenizer.encode(Path(a.file).read_text())
    n = min(a.chunks, len(ids) // a.ctx_size)
    if n < 1:
        sys.exit(f"pi2: error: the text has {len(ids)} tokens, fewer than one chunk of {a.ctx_size}")
    ctx = MoEContext(m, a.ctx_size)
    ctx.w.output = lambda x: np.zeros((len(x), 1), np.float32)      # routing only: the logits are not needed
    for i in range(n):
        ctx.reset()
        ctx.decode(ids[i * a.ctx_size:(i + 1) * a.ctx_size], all_logits=True)
        print(f"chunk {i + 1}/{n} done", file=sys.stderr, flush=True)
    k, E = c.n_expert_used, c.n_expert
    print(f"{Path(a.model).name}: {c.arch}, {E} experts, {k} per token; {n} chunks of {a.ctx_size} tokens "
          f"({n * a.ctx_size * k} routed rows per layer)")
    print(f"{'layer':>5} {'used':>7} {'top-k':>6} {'top 25%':>8} {'max':>6}")
    shares = []
    for il, cnt in enumerate(ctx.expert_counts):
        x = np.sort(cnt)[::-1].astype(np.float64)
        tot = x.sum()
        row = (int((x > 0).sum()), x[:k].sum() / tot, x[:max(1, E // 4)].sum() / tot, x[0] / tot)
        shares.append(row)
        print(f"{il:>5} {row[0]:>3}/{E:<3} {row[1]:>6.2f} {row[2]:>8.2f} {row[3]:>6.2f}")
    s = np.array(shares)
    print(f"{'mean':>5} {s[:, 0].mean():>7.1f} {s[:, 1].mean():>6.2f} {s[:, 2].mean():>8.2f} {s[:, 3].mean():>6.2f}"
          f"   (uniform routing: top-k {k / E:.2f}, top 25% 0.25, max {1 / E:.2f})")


if __name__ == "__main__":
    main()
