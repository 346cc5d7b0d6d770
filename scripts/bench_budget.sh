#!/usr/bin/env bash
# bench_budget.sh — decode speed of a pi2 file (or a plain MoE GGUF: its experts) streamed under --memory-budget, each run inside a memory
# cgroup (v1) of the same size, against the same file fully mapped (in a cgroup of each size, and unlimited).
# Prints one line per run: mode, budget, tokens/s, the group's peak and failcnt, and pi2's cache figures.
# With SOURCE (the GGUF the pi2 file was converted from) llama.cpp's llama-bench runs on it in a cgroup of each
# size too ($LLAMA_BENCH, default ~/.cache/pi2/lcpp/build/bin/llama-bench, as scripts/bench_vs_llamacpp.sh builds).
# usage: scripts/bench_budget.sh MODEL.pi2.gguf "850M 1000M 1200M" [N_GEN] [THREADS] [IO] [SOURCE.gguf]
# env: PI2_FLAGS (more `pi2 bench` flags for every pi2 run, e.g. "--predictor"), ROUNDS (repeat the whole
# sequence, interleaved, default 1), MAPPED=0 (skip the fully mapped runs), PROFILE=0 (do not profile the device
# first: with no cached profile the planner falls back to its fixed cluster rule), LLAMA_FLAGS (more llama-bench flags,
# default "--repack 0": llama.cpp's CPU repacking copies the weights into anonymous memory, which a cgroup smaller
# than the model cannot hold, so it is OOM-killed; without it the weights stay mapped and can be re-read).
# needs root (cgroup v1 at /sys/fs/cgroup/memory, /proc/sys/vm/drop_caches); the page cache is dropped before
# every run so each run starts from flash; llama-bench's one-token warm-up runs before the timed tokens. The device
# is profiled first (`pi2 profile-io`, cached), as the planner's cluster size and predicted speed come from it.
set -euo pipefail
MODEL=$1; BUDGETS=${2:-"850M 1000M 1200M"}; NGEN=${3:-32}; THREADS=${4:-2}; IO=${5:-auto}; SOURCE=${6:-}
LLAMA_BENCH=${LLAMA_BENCH:-$HOME/.cache/pi2/lcpp/build/bin/llama-bench}
read -r -a EXTRA <<< "${PI2_FLAGS:-}"; ROUNDS=${ROUNDS:-1}; MAPPED=${MAPPED:-1}
read -r -a LLAMA_EXTRA <<< "${LLAMA_FLAGS---repack 0}"
PARENT=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
[ -d "$PARENT" ] || { echo "bench_budget.sh: no cgroup v1 memory controller at $PARENT" >&2; exit 1; }

bytes() { python3 -c "from pi2.runtime.config import parse_size; print(parse_size('$1'))"; }

# run LIMIT_BYTES LABEL BUDGET_FLAGS...: one pi2 bench in a fresh cgroup of LIMIT_BYTES (0: no limit)
run() {
    local limit=$1 label=$2; shift 2
    local cg=$PARENT/pi2budget.$$ out
    mkdir "$cg"
    [ "$limit" != 0 ] && echo "$limit" > "$cg/memory.limit_in_bytes"
    sync; echo 1 > /proc/sys/vm/drop_caches || true
    out=$(bash -c "echo \$\$ > $cg/cgroup.procs; exec python3 -m pi2 bench -m \"\$0\" -p 0 -n $NGEN -r 1 -t $THREADS -o json \"\$@\"" \
          "$MODEL" "$@" ${EXTRA[@]+"${EXTRA[@]}"} 2>/tmp/bench_budget.$$.err) \
        || { echo "$label: failed: $(grep -m1 'error:' /tmp/bench_budget.$$.err || tail -1 /tmp/bench_budget.$$.err)"; }
    local peak fail
    peak=$(cat "$cg/memory.max_usage_in_bytes"); fail=$(cat "$cg/memory.failcnt")
    rmdir "$cg"
    [ -n "${out:-}" ] && python3 - "$label" "$peak" "$fail" "$out" <<'PY'
import json, sys
label, peak, fail, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])[0]
extra = ""
if "pi2_cache_hit_rate" in out:
    extra = (f" hit {out['pi2_cache_hit_rate']:.1%} flash {out['pi2_flash_bytes_per_token'] / 2**20:.1f} MiB/tok"
             f" read {out['pi2_read_mbps']:.0f} MB/s io-wait {out['pi2_io_wait_share']:.0%}"
             f" hot {out['pi2_hot_bytes'] / 2**20:.0f} MiB")
    if "pi2_expert_hit_rate" in out:   # a MoE file's expert cache
        extra += f" experts {out['pi2_experts_loaded_per_token']:.2f}/tok/layer"
        if out.get("pi2_expert_ahead_hit_rate"):
            extra += f" ahead {out['pi2_expert_ahead_hit_rate']:.0%} right"
        if out.get("pi2_cluster_hit_rate"):   # a converted file: partial hits, clusters found in the slots
            extra += (f" partial {out['pi2_expert_partial_hit_rate']:.1%} clusters found "
                      f"{out['pi2_cluster_hit_rate']:.1%} held {out['pi2_expert_held_bytes'] / 2**20:.0f} MiB "
                      f"in {out['pi2_experts_held']} experts")
    if out.get("pi2_early_reads_per_token"):
        extra += f" early {out['pi2_early_reads_per_token']:.0f}/tok ({out['pi2_early_unused']:.0%} unused)"
print(f"{label:28s} {out['avg_ts']:7.2f} tok/s  cgroup peak {peak / 2**20:7.1f} MiB failcnt {fail}"
      f"  rss {out['pi2_peak_rss'] / 2**20:.0f} MiB{extra}")
PY
    rm -f /tmp/bench_budget.$$.err
}

# run_llama LIMIT_BYTES LABEL: llama-bench on SOURCE in a fresh cgroup of LIMIT_BYTES
run_llama() {
    local limit=$1 label=$2 cg=$PARENT/pi2budget.$$ out peak fail
    mkdir "$cg"
    echo "$limit" > "$cg/memory.limit_in_bytes"
    sync; echo 1 > /proc/sys/vm/drop_caches || true
    out=$(bash -c "echo \$\$ > $cg/cgroup.procs; exec \"\$0\" -m \"\$1\" -p 0 -n $NGEN -r 1 -t $THREADS -o jsonl \"\${@:2}\"" \
          "$LLAMA_BENCH" "$SOURCE" ${LLAMA_EXTRA[@]+"${LLAMA_EXTRA[@]}"} 2>/dev/null | tail -1) || true
    peak=$(cat "$cg/memory.max_usage_in_bytes"); fail=$(cat "$cg/memory.failcnt")
    local oom
    oom=$(awk '$1=="oom_kill"{print $2}' "$cg/memory.oom_control")
    rmdir "$cg"
    if [ -n "$out" ]; then
        printf '%-28s %7.2f tok/s  cgroup peak %7.1f MiB failcnt %s\n' "$label" \
            "$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['avg_ts'])" "$out")" \
            "$(python3 -c "print($peak / 2**20)")" "$fail"
    else
        echo "$label: failed$([ "${oom:-0}" != 0 ] && echo " (OOM-killed in the cgroup)")"
    fi
}

# the device's read profile (cached per device): the planner sizes clusters and predicts tokens/s from it
if [ "${PROFILE:-1}" = 1 ]; then
    python3 -m pi2 profile-io "$MODEL" --io "$IO" >/dev/null || echo "bench_budget.sh: no device profile" >&2
fi

for _ in $(seq "$ROUNDS"); do
    if [ "$MAPPED" = 1 ]; then run 0 "mapped, no limit"; fi
    for b in $BUDGETS; do
        lim=$(bytes "$b")
        run "$lim" "streamed --memory-budget $b" --memory-budget "$b" --io "$IO"
        if [ "$MAPPED" = 1 ]; then run "$lim" "mapped in a $b cgroup"; fi
        if [ -n "$SOURCE" ]; then run_llama "$lim" "llama.cpp in a $b cgroup"; fi
    done
done
