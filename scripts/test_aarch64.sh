#!/usr/bin/env bash
# test_aarch64.sh — builds pi2's C kernels, matmul and ops with the C self-test (tests/c/kernel_selftest.c and its
# selftest_*.c areas) and runs it: cross-compiled for aarch64 (static) under qemu with -cpu max (NEON + dotprod) and
# -cpu cortex-a72 (NEON only), then natively with $CC (default cc), and natively with clang too when clang is
# installed and $CC is not already clang (-Werror: both compilers must build it warning-free).
# Does not build the Python extension. Needs (Debian): gcc-aarch64-linux-gnu qemu-user-static; clang
# optional. Usage: scripts/test_aarch64.sh [--native-only]. Exit status 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

SRCS=(csrc/pi2.c csrc/kernels/traits.c csrc/kernels/ref.c csrc/kernels/ref_convert.c csrc/kernels/x86.c csrc/kernels/neon.c
      csrc/kernels/axpy.c csrc/kernels/axpy_i8.c csrc/kernels/axpy_qx1.c csrc/kernels/axpy_qx1_pack.c csrc/kernels/lowbit.c csrc/kernels/api.c csrc/kernels/pack.c csrc/threadpool.c csrc/matmul.c
      csrc/ops.c csrc/attn.c csrc/attn_batch.c csrc/attn_batch_avx2.c csrc/attn_decode.c csrc/flash_attn.c csrc/kv_quant.c tests/c/kernel_selftest.c tests/c/selftest_dots.c tests/c/selftest_axpy.c
      tests/c/selftest_ops.c tests/c/selftest_packed.c
      csrc/kernels/pack_k.c)
CFLAGS=(-O2 -std=c11 -ffp-contract=off -Wall -Wextra -Werror -Icsrc)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

if [[ "${1:-}" != "--native-only" ]]; then
    for tool in aarch64-linux-gnu-gcc qemu-aarch64-static; do
        command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y gcc-aarch64-linux-gnu qemu-user-static" >&2; exit 2; }
    done
    aarch64-linux-gnu-gcc "${CFLAGS[@]}" -static -o "$OUT/selftest-a64" "${SRCS[@]}" -lm -lpthread
    for cpu in max cortex-a72; do
        echo "== aarch64 (qemu -cpu $cpu)"
        qemu-aarch64-static -cpu "$cpu" "$OUT/selftest-a64"
    done
fi

echo "== native ($(uname -m), ${CC:-cc})"
"${CC:-cc}" "${CFLAGS[@]}" -o "$OUT/selftest" "${SRCS[@]}" -lm -lpthread
"$OUT/selftest"

if command -v clang >/dev/null && [[ "$(basename "${CC:-cc}")" != clang* ]]; then
    echo "== native ($(uname -m), clang)"
    clang "${CFLAGS[@]}" -o "$OUT/selftest-clang" "${SRCS[@]}" -lm -lpthread
    "$OUT/selftest-clang"
fi
