#!/usr/bin/env bash
# sanitize.sh — pi2's C under AddressSanitizer + UndefinedBehaviorSanitizer (gcc; every report aborts):
#   1. the C self-test (tests/c/kernel_selftest.c and selftest_*.c with the kernels, matmul and ops) built with -fsanitize;
#   2. the extension built with PI2_SANITIZE=address,undefined into a scratch copy of the pi2 package, then a
#      representative part of the suite against it (python is not instrumented: the runtime comes by LD_PRELOAD,
#      leak checks off because the interpreter keeps its memory at exit): golden forward passes, C forward and
#      sparse FFN, streamed runs, PWRI predictors, the NNAPI stand-in, the I/O backends and probe, the fuzz
#      regressions and a fuzz slice, the limits.
# Usage: scripts/sanitize.sh [pytest args...] (default: the files below). Exit status 1 on any report or failure.
set -euo pipefail
cd "$(dirname "$0")/.."
SAN=address,undefined
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

echo "== C self-test, -fsanitize=$SAN"
SRCS=(csrc/pi2.c csrc/kernels/traits.c csrc/kernels/ref.c csrc/kernels/ref_convert.c csrc/kernels/x86.c csrc/kernels/neon.c
      csrc/kernels/axpy.c csrc/kernels/axpy_i8.c csrc/kernels/axpy_qx1.c csrc/kernels/axpy_qx1_pack.c csrc/kernels/lowbit.c csrc/kernels/api.c csrc/kernels/pack.c csrc/threadpool.c csrc/matmul.c
      csrc/ops.c csrc/attn.c csrc/attn_batch.c csrc/attn_batch_avx2.c csrc/attn_decode.c csrc/flash_attn.c csrc/kv_quant.c csrc/kernels/pack_k.c
      tests/c/kernel_selftest.c tests/c/selftest_dots.c tests/c/selftest_axpy.c tests/c/selftest_ops.c tests/c/selftest_packed.c)
gcc -O1 -g -std=c11 -ffp-contract=off -Wall -Icsrc -fsanitize=$SAN -fno-sanitize-recover=all -fno-omit-frame-pointer \
    -o "$OUT/selftest" "${SRCS[@]}" -lm -lpthread
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$OUT/selftest"

echo "== extension, PI2_SANITIZE=$SAN"
mkdir -p "$OUT/site"
cp -r pi2 "$OUT/site/pi2"
rm -f "$OUT"/site/pi2/_pi2*.so
mkdir -p "$OUT/build"      # cffi compiles in the build folder: run from there, the sources' relative paths hold
(cd "$OUT/build" && PI2_SANITIZE=$SAN python3 "$OLDPWD/csrc/ffi_build.py" . > build.log 2>&1) ||
    { tail -30 "$OUT/build/build.log"; exit 1; }
cp "$OUT"/build/pi2/_pi2*.so "$OUT/site/pi2/"
# `import pi2` must find this copy, not the source tree (first on sys.path when run from it) nor an editable install
cat > "$OUT/site/sitecustomize.py" <<'PY'
import importlib.machinery
import os
import sys
SITE = os.path.dirname(os.path.abspath(__file__))
class _SanitizedPi2First:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [SITE]) if name == "pi2" else None
sys.meta_path.insert(0, _SanitizedPi2First)
PY
PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1
where=$(LD_PRELOAD=$PRELOAD PYTHONPATH="$OUT/site" python3 -c 'import pi2._pi2 as m; print(m.__file__)')
[[ "$where" == "$OUT/site/"* ]] || { echo "the sanitized build is not the one imported ($where)" >&2; exit 1; }
if [ $# -eq 0 ]; then
    set -- tests/test_golden.py tests/test_forward_c.py tests/test_ffn_sparse_c.py tests/test_stream_cache.py \
        tests/test_pwri_c.py tests/test_nnapi.py tests/test_io.py tests/test_limits.py tests/test_fuzz.py
fi
LD_PRELOAD=$PRELOAD PYTHONPATH="$OUT/site" PI2_FUZZ_SLICE="${PI2_FUZZ_SLICE:-400}" \
    python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
if grep -qE "(AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|runtime error:)" "$OUT/pytest.log"; then
    echo "sanitize: a sanitizer reported (above)" >&2
    exit 1
fi
exit "$status"
