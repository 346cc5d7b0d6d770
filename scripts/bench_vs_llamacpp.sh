#!/usr/bin/env bash
# bench_vs_llamacpp.sh — pi2 bench and llama.cpp's llama-bench on the same GGUF, side by side.
#
# Owns: building llama-bench once from the llama-cpp-python sdist on PyPI into a cache directory outside
# the repo, and the interleaved comparison: each round runs both tools once (-r 1, warm-up included,
# order alternating between rounds) with the same tests and threads, records `uptime` load with every
# run, then prints both tables (mean ± sample sd over the rounds) and pi2/llama.cpp ratios of medians.
#
# usage: scripts/bench_vs_llamacpp.sh MODEL [-p 512] [-n 128] [-pg PP,TG] [-t 1] [-r 5] [--engine E]
#   -p/-n/-pg/-t go to both tools (-t 1 by default; -t 1,2 compares both thread counts), -r is the number
#   of rounds, --engine (or PI2_ENGINE) picks pi2's engine. llama-bench always runs with -fa off.
# environment: PI2_LCPP_DIR (default ~/.cache/pi2/lcpp), PYTHON (default python3, with pi2 installed),
#   LCPP_VERSION (llama-cpp-python sdist version, default 0.3.36), JOBS (build jobs, default 2); pi2 reads its own
#   (PI2_CPU_VARIANT=avx2 runs its AVX2 kernels; the report names the variant that ran).
set -eu

die() { echo "bench_vs_llamacpp: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: $0 MODEL [-p N] [-n N] [-pg PP,TG] [-t LIST] [-r ROUNDS] [--engine E]"
MODEL=$1
shift
[ -f "$MODEL" ] || die "no such model file: $MODEL"

LCPP_DIR=${PI2_LCPP_DIR:-$HOME/.cache/pi2/lcpp}
LCPP_VERSION=${LCPP_VERSION:-0.3.36}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-2}
ROUNDS=5
THREADS=1
ENGINE=${PI2_ENGINE:-auto}
TESTS=()
while [ $# -gt 0 ]; do
    case $1 in
        -p|--n-prompt|-n|--n-gen|-pg)
            [ $# -ge 2 ] || die "$1 needs a value"
            TESTS+=("$1" "$2"); shift 2 ;;
        -t|--threads)
            [ $# -ge 2 ] || die "$1 needs a value"
            THREADS=$2; shift 2 ;;
        -r|--repetitions)
            [ $# -ge 2 ] || die "$1 needs a value"
            ROUNDS=$2; shift 2 ;;
        --engine)
            [ $# -ge 2 ] || die "$1 needs a value"
            ENGINE=$2; shift 2 ;;
        *) die "unknown argument '$1' (the script takes -p -n -pg -t -r --engine)" ;;
    esac
done
case $ROUNDS in ''|*[!0-9]*|0) die "-r must be a positive number of rounds, got '$ROUNDS'" ;; esac

# ---- llama-bench, built once ---------------------------------------------------------------------
LLAMA_BENCH=$LCPP_DIR/build/bin/llama-bench

build_llama_bench() {
    mkdir -p "$LCPP_DIR/sdist"
    local src=$LCPP_DIR/sdist/llama_cpp_python-$LCPP_VERSION
    if [ ! -d "$src/vendor/llama.cpp" ]; then
        echo "bench_vs_llamacpp: downloading the llama-cpp-python==$LCPP_VERSION sdist" >&2
        "$PYTHON" -m pip download --no-deps --no-binary=llama-cpp-python --no-build-isolation \
            "llama-cpp-python==$LCPP_VERSION" -d "$LCPP_DIR/sdist" >&2
        tar xzf "$LCPP_DIR/sdist/llama_cpp_python-$LCPP_VERSION.tar.gz" -C "$LCPP_DIR/sdist"
    fi
    local gen=()
    if command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
    echo "bench_vs_llamacpp: building llama-bench in $LCPP_DIR/build (about 10-15 minutes on 2 cores)" >&2
    cmake -S "$src/vendor/llama.cpp" -B "$LCPP_DIR/build" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_OPENSSL=OFF >"$LCPP_DIR/cmake.log" 2>&1 || { tail -20 "$LCPP_DIR/cmake.log" >&2; exit 1; }
    cmake --build "$LCPP_DIR/build" -j "$JOBS" --target llama-bench >"$LCPP_DIR/build.log" 2>&1 \
        || { tail -20 "$LCPP_DIR/build.log" >&2; exit 1; }
}

if [ ! -x "$LLAMA_BENCH" ]; then
    build_llama_bench
fi
[ -x "$LLAMA_BENCH" ] || die "llama-bench was not built (see $LCPP_DIR/build.log)"

# ---- interleaved rounds --------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench_vs_llamacpp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOADS=$WORK/loads.txt
: >"$LOADS"

load_avg() { uptime | sed 's/.*load average[s]*: *//'; }

run_llamacpp() {
    local load
    load=$(load_avg)
    "$LLAMA_BENCH" -m "$MODEL" ${TESTS[@]+"${TESTS[@]}"} -t "$THREADS" -r 1 -fa off -o jsonl \
        >>"$WORK/llamacpp.jsonl" 2>>"$WORK/llamacpp.log" || { tail -5 "$WORK/llamacpp.log" >&2; exit 1; }
    printf 'round %d  llama.cpp  load %s\n' "$1" "$load" >>"$LOADS"
}

run_pi2() {
    local load
    load=$(load_avg)
    "$PYTHON" -m pi2 bench -m "$MODEL" ${TESTS[@]+"${TESTS[@]}"} -t "$THREADS" -r 1 --engine "$ENGINE" -o jsonl \
        >>"$WORK/pi2.jsonl" 2>>"$WORK/pi2.log" || { tail -5 "$WORK/pi2.log" >&2; exit 1; }
    printf 'round %d  pi2        load %s\n' "$1" "$load" >>"$LOADS"
}

echo "bench_vs_llamacpp: $ROUNDS rounds on $(basename "$MODEL"), threads $THREADS, tests: ${TESTS[*]:-defaults}" >&2
for round in $(seq 1 "$ROUNDS"); do
    echo "bench_vs_llamacpp: round $round/$ROUNDS" >&2
    if [ $((round % 2)) -eq 1 ]; then
        run_llamacpp "$round"; run_pi2 "$round"
    else
        run_pi2 "$round"; run_llamacpp "$round"
    fi
done

# ---- report --------------------------------------------------------------------------------------
echo "load average (1, 5, 15 min) when each run started:"
cat "$LOADS"
echo
"$PYTHON" - "$WORK/llamacpp.jsonl" "$WORK/pi2.jsonl" <<'EOF'
import json
import statistics
import sys

from pi2.runtime import bench_report as report


def merged(path):
    """One record per test, with the per-round samples pooled (llama-bench's statistics over rounds)."""
    rows = {}
    for line in open(path, encoding="utf-8"):
        if not line.strip():
            continue
        r = json.loads(line)
        key = (r["n_threads"], r["n_prompt"], r["n_gen"])          # the same model file for both
        if key not in rows:
            rows[key] = dict(r, samples_ts=[])
        rows[key]["samples_ts"] += r["samples_ts"]
    for r in rows.values():
        ts = r["samples_ts"]
        r["avg_ts"], r["stddev_ts"] = statistics.mean(ts), statistics.stdev(ts) if len(ts) > 1 else 0.0
    return rows


lcpp, ours = merged(sys.argv[1]), merged(sys.argv[2])
engines = sorted({r.get("pi2_engine", "?") for r in ours.values()})
print(f"llama.cpp (llama-bench {next(iter(lcpp.values()))['build_commit']}, -fa off):")
print(report.markdown_rows(list(lcpp.values()), report.markdown_columns()))
first = next(iter(ours.values()))
variants = sorted({r.get("pi2_kernel_variant", "?") for r in ours.values()})
print(f"\npi2 ({first['pi2_version']}, build {first['build_commit']}, engine {', '.join(engines)}, "
      f"kernels {', '.join(variants)}, "
      f"peak RSS {max(r['pi2_peak_rss'] for r in ours.values()) / 2**20:.1f} MiB):")
print(report.markdown_rows(list(ours.values()), report.markdown_columns(engine=True)))
print("\npi2 / llama.cpp (medians of the per-round t/s):")
print("| threads |            test | llama.cpp t/s |   pi2 t/s |  ratio |")
print("| ------: | --------------: | ------------: | --------: | -----: |")
for key, a in lcpp.items():
    b = ours.get(key)
    if b is None:
        continue
    ma, mb = statistics.median(a["samples_ts"]), statistics.median(b["samples_ts"])
    print(f"| {key[0]:>7} | {report.test_name(a):>15} | {ma:>13.2f} | {mb:>9.2f} | {mb / ma:>5.2f}x |")
EOF
