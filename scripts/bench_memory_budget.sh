#!/usr/bin/env bash
# bench_memory_budget.sh — the side-by-side curve over budgets: pi2 streaming a pi2 file under --memory-budget and
# llama.cpp's llama-bench on the source GGUF, each inside a memory cgroup of the budget's size, page cache dropped
# before every run (scripts/bench_budget.sh runs each point), at 0.4, 0.5, 0.6, 0.8 and 1.0 x the source's size.
# Budgets below pi2's floor are refused by pi2 with the minimum it needs (printed as that point's line).
# usage: scripts/bench_memory_budget.sh MODEL.pi2.gguf [SOURCE.gguf] [N_GEN] [THREADS]
#   SOURCE: default the file the pi2 file was converted from (pi2.source.file) beside MODEL or in
#   ~/.cache/pi2/models; a plain MoE GGUF (its experts stream) is its own source. env: FRACTIONS (default "0.4 0.5 0.6 0.8 1.0"), ROUNDS, PI2_FLAGS as bench_budget.sh.
# needs root (cgroup v1 memory controller, /proc/sys/vm/drop_caches) and llama-bench (scripts/bench_vs_llamacpp.sh
# builds it); prints a table of tokens/s and the ratio at the end.
set -euo pipefail
MODEL=${1:?usage: bench_memory_budget.sh MODEL.pi2.gguf [SOURCE.gguf] [N_GEN] [THREADS]}
SOURCE=${2:-}; NGEN=${3:-8}; THREADS=${4:-2}
FRACTIONS=${FRACTIONS:-"0.4 0.5 0.6 0.8 1.0"}
[ -f "$MODEL" ] || { echo "bench_memory_budget.sh: no such file: $MODEL" >&2; exit 1; }
if [ -z "$SOURCE" ] && python3 -c "import sys; from pi2.model.loader import load_model; c = load_model(sys.argv[1]).config; sys.exit(0 if c.moe_family and c.n_expert and not c.pi2 else 1)" "$MODEL"; then
    SOURCE=$MODEL   # a plain MoE GGUF: pi2 streams its experts, llama.cpp maps the same file
fi
if [ -z "$SOURCE" ]; then
    name=$(python3 -c "import sys; from pi2.model.gguf_file import GGUFFile; print(GGUFFile(sys.argv[1]).kv.get('pi2.source.file', ''))" "$MODEL")
    for dir in "$(dirname "$MODEL")" "$HOME/.cache/pi2/models"; do
        if [ -n "$name" ] && [ -f "$dir/$name" ]; then SOURCE=$dir/$name; break; fi
    done
    [ -n "$SOURCE" ] || { echo "bench_memory_budget.sh: cannot find the source GGUF ${name:-?}; pass it as SOURCE" >&2; exit 1; }
fi
SIZE=$(stat -c %s "$SOURCE")
BUDGETS=""
for f in $FRACTIONS; do
    BUDGETS="$BUDGETS $(python3 -c "print(int($f * $SIZE / 2**20))")M"
done
echo "source $SOURCE ($((SIZE >> 20)) MiB); budgets:$BUDGETS; -n $NGEN -t $THREADS"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
MAPPED=0 bash "$(dirname "$0")/bench_budget.sh" "$MODEL" "${BUDGETS# }" "$NGEN" "$THREADS" auto "$SOURCE" | tee "$OUT"
python3 - "$OUT" <<'PY'
import re, sys, statistics as st
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(streamed --memory-budget|llama\.cpp in a) (\S+?)( cgroup)?\s+([\d.]+) tok/s", line)
    if m:
        runs.setdefault(m.group(2), {}).setdefault("pi2" if m.group(1).startswith("streamed") else "llama", []).append(float(m.group(4)))
print("\n| budget | llama.cpp tok/s | pi2 tok/s | ratio |\n|---|---:|---:|---:|")
for b, r in runs.items():
    lc, p = (st.median(r[k]) if r.get(k) else None for k in ("llama", "pi2"))
    ratio = f"{p / lc:.2f}x" if lc and p else "-"
    print(f"| {b} | {f'{lc:.2f}' if lc is not None else '-'} | {f'{p:.2f}' if p is not None else 'refused/failed'} "
          f"| {ratio} |")
PY
