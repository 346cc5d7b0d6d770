#!/bin/sh
# termux-run.sh — runs pi2 on a model file the user points at (nothing is downloaded), with a memory
# budget of 3/4 of the phone's MemAvailable (Android kills apps that take the rest). The budget is passed
# as --memory-budget only when `pi2 run --help` lists that flag; otherwise the run says so and pi2 keeps
# the whole model in memory.
# usage: sh scripts/termux-run.sh MODEL.gguf [pi2 run options, e.g. -p "Hello" -n 64]
set -eu

if [ $# -lt 1 ]; then
    echo "usage: $0 MODEL.gguf [pi2 run options, e.g. -p \"Hello\" -n 64]" >&2
    exit 2
fi
model=$1
shift
if [ ! -r "$model" ]; then
    echo "termux-run: cannot read the model file '$model'" >&2
    exit 1
fi

avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
budget_mib=$((avail_kib * 3 / 4 / 1024))

if pi2 run --help 2>/dev/null | grep -q -- '--memory-budget'; then
    echo "termux-run: memory budget ${budget_mib} MiB (3/4 of MemAvailable)" >&2
    exec pi2 run "$model" --memory-budget "${budget_mib}M" "$@"
fi
echo "termux-run: this pi2 has no --memory-budget yet: the model is held in memory" \
     "($((avail_kib / 1024)) MiB available)" >&2
exec pi2 run "$model" "$@"
