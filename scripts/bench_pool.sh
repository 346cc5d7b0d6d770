#!/usr/bin/env bash
# bench_pool.sh — the thread pool's cost per job (tests/c/pool_bench.c): wake-up, task claims and the final wait,
# for jobs of trivial tasks, at 1..THREADS threads. Run it alone (it times spinning threads).
# usage: scripts/bench_pool.sh [THREADS (default 2)] [TASKS per job (default 16)]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"${CC:-cc}" -O2 -std=c11 -Wall -Icsrc -o "$OUT/pool_bench" tests/c/pool_bench.c csrc/threadpool.c csrc/pi2.c -lpthread -lm
"$OUT/pool_bench" "${1:-2}" "${2:-16}"
