#!/usr/bin/env python3
"""expert_hit_rates.py — the expert cache's hit rate on a MoE file as a plain LRU and with hot experts learned while
running (csrc/cache/experts_learn.c), for caches holding given shares of the experts. Decodes a text one token at a
time (after a prompt batch of -p tokens) with the experts streamed (pread, routing ahead on) and counts the needed
experts (per layer and token) found resident or in a slot, over the single tokens only. Also prints the file's
expert working set on that text (the share of routed rows the most used quarter of the experts took; 0.25 for
uniform routing): random-weight files route nearly uniformly, so their hit rates are worst cases.
Usage: python3 scripts/expert_hit_rates.py MODEL.gguf [--shares 0.2,0.4,0.6] [-n 200] [-p 32] [-f TEXT]
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
    ap.add_argument("--shares", default="0.2,0.4,0.6")
    ap.add_argument("-n", "--n-tokens", type=int, default=200)
    ap.add_argument("-p", "--n-prompt", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    from pi2.engine import CContext, CModel
    from pi2.errors import Pi2Error
    from pi2.runtime.session import open_model
    try:
        m = open_model(a.model)
        c = m.config
        if not c.n_expert:
            sys.exit(f"pi2: error: {a.model} has no experts ({c.arch})")
        ids = m.tokenizer.encode(Path(a.file).read_text())
        ids = (ids * (1 + (a.n_prompt + a.n_tokens) // max(len(ids), 1)))[:a.n_prompt + a.n_tokens]
        cm = CModel.from_model(m)
        layers = sum(1 for il in range(c.n_layer) if f"blk.{il}.ffn_gate_exps.weight" in m.file.tensors)
        print(f"{Path(a.model).name}: {c.arch}, {layers} layers x {c.n_expert} experts, {c.n_expert_used} per token; "
              f"{a.n_prompt} prompt + {a.n_tokens} single tokens")
        print(f"{'share':>5} {'slots':>6} {'LRU':>7} {'learned':>8} {'pinned':>7}")
        counts = None
        for share in (float(s) for s in a.shares.split(",")):
            slots = max(c.n_expert_used, int(round(share * layers * c.n_expert)))
            row = []
            for learn in (False, True):
                ctx = CContext(cm, len(ids) + 8, a.threads)
                ctx.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=slots, expert_ahead=True,
                               expert_learn=learn)
                if a.n_prompt:
                    ctx.decode(ids[:a.n_prompt])
                before = ctx.cache_stats()
                for t in ids[a.n_prompt:]:
                    ctx.decode([t])
                st = ctx.cache_stats()
                d = {k: st[k] - before[k] for k in ("expert_hot", "expert_hits", "expert_misses")}
                row.append((d["expert_hot"] + d["expert_hits"]) / max(sum(d.values()), 1))
                pinned = st["expert_pinned"]
                counts = ctx.expert_counts
            print(f"{share:>5.2f} {slots:>6} {row[0]:>7.1%} {row[1]:>8.1%} {pinned:>7}", flush=True)
    except Pi2Error as e:
        sys.exit(f"pi2: error: {e}")
    top = [np.sort(r)[::-1][:max(1, c.n_expert // 4)].sum() / max(r.sum(), 1) for r in counts if r.sum()]
    print(f"working set: the most used quarter of the experts took {np.mean(top):.0%} of the rows "
          f"(uniform routing: 25%)")


if __name__ == "__main__":
    main()
