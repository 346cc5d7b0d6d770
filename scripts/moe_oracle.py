#!/usr/bin/env python3
"""moe_oracle.py — regenerate tests/data/moe-oracle.json: llama.cpp's figures on the synthetic MoE files.

A development tool (CI never runs it): needs a llama.cpp 0c1e570 build (LLAMA_BIN, default /work/llama/build/bin)
and `moe_oracle`, a ~70-line C program linked against that build's libllama (MOE_ORACLE): given a model, a
thread count, a file of int32 prompt ids and N, it decodes the prompt in one batch with logits for every position,
writes them (float32), then decodes the prompt again with only the last output and N greedy tokens one at a time,
writing each step's logits and chosen id — what llama-completion --temp 0 does.
For every architecture and type it writes the file with tests/moe_files.py, checks that `llama-quantize F32 OUT
TYPE` gives the same bytes, runs `llama-perplexity -fa off -c 128 --chunks 3` on tests/data/moe-text.txt, the
greedy continuations of PROMPTS, the sha256 of the teacher-forced logits of PROMPTS[0], and each file's expert
working set over the text (pi2's reference, which equals llama.cpp bit for bit on these files).
Usage: python3 scripts/moe_oracle.py [--out tests/data/moe-oracle.json] [--work DIR] [--arch A] [--type T]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from moe_files import ARCHS, WTYPES, write_moe  # noqa: E402

LLAMA_BIN = Path(os.environ.get("LLAMA_BIN", "/work/llama/build/bin"))
MOE_ORACLE = os.environ.get("MOE_ORACLE", "/work/dev/moe-oracle/moe_oracle")
TEXT = ROOT / "tests" / "data" / "moe-text.txt"
PROMPTS = ["A lighthouse keeper", "def count_ships(log):", "Storms came in groups of three, and the"]
N_GEN, N_CTX, CHUNKS, NEAR_TIE = 16, 128, 3, 0.05


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def perplexity(path: Path) -> dict:
    cmd = [str(LLAMA_BIN / "llama-perplexity"), "-m", str(path), "-f", str(TEXT), "-fa", "off", "-c", str(N_CTX),
           "--chunks", str(CHUNKS), "-t", "2"]
    # this build's logger thread can lose the last lines at exit (more often with output on a pipe): run under a
    # pseudo-terminal and again until the Final estimate line is there
    for _ in range(10):
        r = subprocess.run(["script", "-qc", " ".join(cmd), "/dev/null"], capture_output=True, text=True, check=True,
                           stdin=subprocess.DEVNULL)
        out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)
        final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        if final:
            break
    chunks = re.findall(r"\[(\d+)\]([0-9.]+),", out)
    return {"command": " ".join(["llama-perplexity", "-m", path.name] + cmd[3:]).replace(str(TEXT), "moe-text.txt"),
            "chunks": [c for _, c in chunks], "ppl": final.group(1), "stderr": final.group(2)}


def oracle(path: Path, ids: list, n_gen: int, work: Path):
    """(teacher-forced logits (n, n_vocab), [(step logits, id)])."""
    ids_file, out_file = work / "ids.bin", work / "out.bin"
    np.asarray(ids, np.int32).tofile(ids_file)
    subprocess.run([MOE_ORACLE, str(path), "1", str(ids_file), str(out_file), str(n_gen)], check=True,
                   capture_output=True)
    raw = np.fromfile(out_file, np.uint8)
    return raw, len(ids)


def greedy(path: Path, tok, work: Path, n_vocab: int) -> tuple[list, str]:
    out, logits_sha = [], ""
    for i, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt)
        raw, n = oracle(path, ids, N_GEN, work)
        tf = raw[:n * n_vocab * 4]
        if i == 0:
            logits_sha = hashlib.sha256(tf.tobytes()).hexdigest()
        rest = raw[n * n_vocab * 4:]
        step = n_vocab * 4 + 4
        gen, gaps = [], []
        for s in range(N_GEN):
            chunk = rest[s * step:(s + 1) * step]
            lg = chunk[:n_vocab * 4].view(np.float32)
            top2 = np.sort(lg)[-2:]
            gaps.append(round(float(top2[1] - top2[0]), 6))
            gen.append(int(chunk[n_vocab * 4:].view(np.int32)[0]))
        tie = next((j for j, g in enumerate(gaps) if g < NEAR_TIE), None)
        out.append({"prompt": prompt, "prompt_ids": ids, "ids": gen, "top2_gap": gaps, "first_near_tie_index": tie})
    return out, logits_sha


def working_set(path: Path) -> list:
    """Per layer over the text's first CHUNKS chunks (one chunk per pass): experts used, the share of routed rows
    that the top quarter of experts takes, and the largest single share."""
    from pi2.reference.moe import MoEContext
    from pi2.runtime import open_model
    m = open_model(path)
    if not m.config.n_expert:
        return []
    ids = m.tokenizer.encode(TEXT.read_text())
    ctx = MoEContext(m, N_CTX)
    for c in range(CHUNKS):
        ctx.reset()
        ctx.decode(ids[c * N_CTX:(c + 1) * N_CTX], all_logits=True)
    rows = []
    for cnt in ctx.expert_counts:
        x = np.sort(cnt)[::-1]
        q = max(1, len(x) // 4)
        rows.append({"used": int((x > 0).sum()), "of": len(x), "top_quarter_share": round(float(x[:q].sum() / x.sum()), 3),
                     "max_share": round(float(x[0] / x.sum()), 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "moe-oracle.json"))
    ap.add_argument("--work", default="/tmp/pi2-moe-oracle")
    ap.add_argument("--arch", action="append")
    ap.add_argument("--type", action="append")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    from pi2.runtime import open_model
    old = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
    files = old.get("files", {})
    for arch in a.arch or ARCHS:
        base = write_moe(work / f"{arch}.F32.gguf", arch, "F32")
        for wtype in a.type or WTYPES:
            path = write_moe(work / f"{arch}.{wtype}.gguf", arch, wtype)
            rec = {"sha256": sha256(path), "bytes": path.stat().st_size}
            if wtype != "F32":
                lq = work / f"llama-quantize.{arch}.{wtype}.gguf"
                subprocess.run([str(LLAMA_BIN / "llama-quantize"), str(base), str(lq), wtype, "2"], check=True,
                               capture_output=True)
                rec["llama_quantize_sha256"] = sha256(lq)
                if rec["llama_quantize_sha256"] != rec["sha256"]:
                    sys.exit(f"{path.name}: llama-quantize writes different bytes")
            m = open_model(path)
            rec["perplexity"] = perplexity(path)
            rec["greedy"], rec["logits_sha256"] = greedy(path, m.tokenizer, work, m.config.n_vocab)
            if wtype == "F32":
                rec["expert_working_set"] = working_set(path)
            files[f"{arch}.{wtype}"] = rec
            print(f"{arch}.{wtype}: PPL {rec['perplexity']['ppl']}", flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    doc = {
        "provenance": {
            "llama.cpp": "0c1e570 (vendor/llama.cpp of llama-cpp-python 0.3.36), CPU backend, GGML_NATIVE (-march=native), "
                         "repack on (default), flash attention off",
            "cpu": f"{cpu} ({platform.machine()}, AVX-512 VNNI), 2 threads for llama-perplexity, 1 for the greedy runs",
            "date": datetime.date.today().isoformat(),
            "generator": "scripts/moe_oracle.py (files from tests/moe_files.py, seed 0)",
            "text": f"tests/data/moe-text.txt (sha256 {sha256(TEXT)})",
            "greedy": f"moe_oracle helper: prompt decoded with only the last output, then {N_GEN} tokens one at a "
                      "time, argmax (llama-completion --temp 0); top2_gap = best minus second logit at each step",
            "logits_sha256": "sha256 of the float32 logits of every position of PROMPTS[0] decoded in one batch",
        },
        "n_ctx": N_CTX, "chunks": CHUNKS, "files": dict(sorted(files.items())),
    }
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
