#!/usr/bin/env python3
"""dense_oracle.py — pi2's dense logits against llama.cpp's on one GGUF, and the record tests/test_dense_oracle.py
replays where llama.cpp is absent (tests/data/<name>.oracle.json).

A development tool (CI never runs it): needs a llama.cpp 0c1e570 build and `moe_oracle` (ORACLE, default
/work/dev/moe-oracle/moe_oracle; described in scripts/moe_oracle.py): for each prompt it decodes the prompt in one
batch with logits for every position, then greedy tokens one at a time as llama-completion --temp 0 does. pi2 does
the same through its C engine (repacked weights, as `pi2 run` loads them) at each thread count of --threads; the
script prints, per prompt and thread count, how many positions' logits are bit for bit llama.cpp's, the largest
|Δ logit| and whether the greedy tokens agree, and exits 1 on any difference.
Usage: python3 scripts/dense_oracle.py MODEL [--threads 1,2] [--n-gen 16] [--out tests/data/NAME.oracle.json]
       [--made "how the file was made"]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ORACLE = os.environ.get("ORACLE", "/work/dev/moe-oracle/moe_oracle")
PROMPTS = ["def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n",
           "The three largest moons of Jupiter are",
           "Once upon a time, in a village by the sea, there lived a fisherman who"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def llama(path: Path, ids: list, n_gen: int, n_vocab: int, work: Path):
    """llama.cpp's (teacher-forced logits (n, n_vocab), greedy ids, greedy step logits (n_gen, n_vocab))."""
    ids_file, out_file = work / "ids.bin", work / "out.bin"
    np.asarray(ids, np.int32).tofile(ids_file)
    subprocess.run([ORACLE, str(path), "1", str(ids_file), str(out_file), str(n_gen)], check=True, capture_output=True)
    raw = np.fromfile(out_file, np.uint8)
    n = len(ids) * n_vocab * 4
    tf = raw[:n].view(np.float32).reshape(len(ids), n_vocab)
    steps = raw[n:].reshape(n_gen, n_vocab * 4 + 4)
    return tf, [int(s[n_vocab * 4:].view(np.int32)[0]) for s in steps], steps[:, :n_vocab * 4].copy().view(np.float32)


def pi2_run(model, ids: list, n_gen: int, threads: int):
    """pi2's teacher-forced logits and greedy ids (argmax, first of equals, as moe_oracle picks)."""
    from pi2.runtime.config import RunConfig
    from pi2.runtime.session import open_session
    ctx = open_session(model, RunConfig(n_ctx=1024, n_threads=threads, engine="c"))
    tf = np.array(ctx.decode(ids, all_logits=True), np.float32)
    ctx.reset()
    logits, gen = ctx.decode(ids), []
    for _ in range(n_gen):
        gen.append(int(np.argmax(logits)))
        logits = ctx.decode([gen[-1]])
    return tf, gen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--made", default="", help="how the model file was made (recorded with --out)")
    args = ap.parse_args()
    from pi2.runtime.session import open_model
    model = open_model(args.model)
    tok, n_vocab = model.tokenizer, model.config.n_vocab
    record, bad = [], 0
    with tempfile.TemporaryDirectory() as work:
        for prompt in PROMPTS:
            ids = tok.encode(prompt)
            tf, gen, steps = llama(args.model, ids, args.n_gen, n_vocab, Path(work))
            top2 = np.sort(steps, axis=1)[:, -2:]
            digest = hashlib.sha256(tf.tobytes()).hexdigest()
            record.append({"prompt": prompt, "prompt_ids": ids, "logits_sha256": digest,
                           "last_top5": [[int(i), float(tf[-1, i])] for i in np.argsort(-tf[-1])[:5]],
                           "ids": gen, "top2_gap": [round(float(b - a), 6) for a, b in top2]})
            for t in (int(x) for x in args.threads.split(",")):
                ptf, pgen = pi2_run(model, ids, args.n_gen, t)
                same = int(np.sum(np.all(ptf.view(np.uint32) == tf.view(np.uint32), axis=1)))
                diff = float(np.max(np.abs(ptf - tf)))
                ok = same == len(ids) and pgen == gen
                bad += not ok
                where = next((i for i, (a, b) in enumerate(zip(pgen, gen)) if a != b), None)
                print(f"-t {t}  {len(ids):3d} positions, {same:3d} bit-identical, max |Δ logit| {diff:.3g}; greedy "
                      f"{'equal' if where is None else f'differs at {where}'}  {prompt[:40]!r}")
    if args.out:
        out = {"kind": "dense_oracle", "model": {"file": args.model.name, "bytes": args.model.stat().st_size,
                                                  "sha256": sha256_file(args.model), "made": args.made},
               "generator": {"llama_cpp_commit": "0c1e570", "tool": "moe_oracle (scripts/moe_oracle.py), 1 thread, "
                             "n_ctx 1024, flash attention off: the prompt in one batch with all logits, then greedy",
                             "command": f"python3 scripts/dense_oracle.py {args.model.name} --n-gen {args.n_gen}",
                             "date": datetime.date.today().isoformat()},
               "prompts": record}
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
