#!/bin/sh
# termux-bench.sh — one shareable report of pi2 on this phone: the system, `pi2 devices`, `pi2 plan` at 3/4
# of MemAvailable (for a pi2 file; otherwise why not) and `pi2 bench` (with NNAPI on and off when NNAPI is
# available), written to one file.
# A step that fails is recorded in the report with its exit status; the others still run.
# usage: sh scripts/termux-bench.sh MODEL.gguf [REPORT_FILE]   (default: pi2-report-DATE.md here)
set -eu

if [ $# -lt 1 ]; then
    echo "usage: $0 MODEL.gguf [REPORT_FILE]" >&2
    exit 2
fi
model=$1
report=${2:-pi2-report-$(date +%Y%m%d-%H%M%S).md}
if [ ! -r "$model" ]; then
    echo "termux-bench: cannot read the model file '$model'" >&2
    exit 1
fi

step() {   # step TITLE COMMAND...: a section with the command, its output and a failure note
    title=$1
    shift
    printf '\n## %s\n\n```\n$ %s\n' "$title" "$*"
    rc=0
    "$@" 2>&1 || rc=$?
    printf '```\n'
    if [ "$rc" -ne 0 ]; then
        printf '(exit status %s)\n' "$rc"
    fi
}

{
    printf '# pi2 report, %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    step "system" uname -a
    if command -v getprop >/dev/null 2>&1; then
        step "phone" getprop ro.product.model
        step "android" getprop ro.build.version.release
    fi
    step "pi2 devices" pi2 devices -m "$model"
    avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    budget="$((avail_kib * 3 / 4 / 1024))M"
    if ! pi2 plan --help >/dev/null 2>&1; then
        printf '\n## pi2 plan\n\nthis pi2 has no plan command yet\n'
    elif pi2 plan -m "$model" --memory-budget "$budget" -c 2048 >/dev/null 2>&1; then
        step "pi2 plan" pi2 plan -m "$model" --memory-budget "$budget" -c 2048
    else
        printf '\n## pi2 plan\n\nno plan for %s at %s (3/4 of MemAvailable): %s\n' "$model" "$budget" \
            "$(pi2 plan -m "$model" --memory-budget "$budget" -c 2048 2>&1 | head -1)"
    fi
    step "pi2 bench" pi2 bench -m "$model" -p 128 -n 32 -r 3 -o md --npu auto
    if pi2 devices --json 2>/dev/null | grep -q '"available": true'; then
        step "pi2 bench, NNAPI off" pi2 bench -m "$model" -p 128 -n 32 -r 3 -o md --npu off
        step "pi2 bench, NNAPI on (any device)" pi2 bench -m "$model" -p 128 -n 0 -r 3 -o json --npu nnapi
    fi
} > "$report"

echo "termux-bench: report written to $report"
