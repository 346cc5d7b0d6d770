#!/usr/bin/env bash
# fuzz.sh — pi2's fuzzers, long or short:
#   1. the structure-aware GGUF fuzzer (tests/fuzz): mutated synthetic and real model files through info, tokenize,
#      run (both engines), a budgeted run and convert, in 2 worker processes; summary in OUT/summary.json, each
#      finding (traceback, hang, crash, dirty convert) as a replayable file in OUT/findings/;
#   2. the libFuzzer target tests/c/fuzz_model.c (hyper-parameters and tensor descriptors into pi2_model_load,
#      pi2_ctx_init, pi2_decode) built with clang -fsanitize=fuzzer,address,undefined; every report stops it.
# Usage: scripts/fuzz.sh [EXECS [LIBFUZZER_RUNS [SEED [OUT]]]]   default 100000 executions, 1000000 runs, seed 1,
#        OUT fuzz-out. The CI slice is tests/test_fuzz.py plus `scripts/fuzz.sh 0 20000`.
# Needs clang and its runtime (apt-get install clang libclang-rt-14-dev on Debian 12) for part 2.
# Exit status 1 when either part found something.
set -euo pipefail
cd "$(dirname "$0")/.."
EXECS=${1:-100000}
RUNS=${2:-1000000}
SEED=${3:-1}
OUT=${4:-fuzz-out}
mkdir -p "$OUT"
status=0

if [ "$EXECS" -gt 0 ]; then
    echo "== GGUF fuzzer: $EXECS executions, seed $SEED"
    python3 -m tests.fuzz.run --execs "$EXECS" --jobs 2 --seed "$SEED" --out "$OUT/gguf" || status=1
fi

if [ "$RUNS" -gt 0 ]; then
    echo "== libFuzzer, tests/c/fuzz_model.c: $RUNS runs"
    SRCS=$(python3 -c 'import sys; sys.path.insert(0, "csrc"); import ffi_build; print(" ".join("csrc/" + s for s in ffi_build.SOURCES))')
    # shellcheck disable=SC2086
    clang -g -O1 -std=c11 -ffp-contract=off -Icsrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -o "$OUT/fuzz_model" tests/c/fuzz_model.c $SRCS -lm -ldl -lpthread
    mkdir -p "$OUT/corpus" "$OUT/crashes"
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
        "$OUT/fuzz_model" -runs="$RUNS" -seed="$SEED" -max_len=400 -timeout=20 -rss_limit_mb=4096 \
        -artifact_prefix="$OUT/crashes/" "$OUT/corpus" 2>&1 | tail -25 || status=1
    if [ -n "$(ls -A "$OUT/crashes")" ]; then
        echo "fuzz: libFuzzer found: $(ls "$OUT/crashes")" >&2
        status=1
    fi
fi
exit $status
