#!/bin/sh
# termux-setup.sh — installs pi2 on Android under Termux: the Termux packages it needs (Python, numpy,
# clang and build tools for its C core), then `pip install .` from this checkout.
# Idempotent: pkg skips what is installed and pip replaces a previous pi2. Stops with a clear message when
# this is not Termux or when there is not enough free space; says how to grant storage access when the
# shared storage (where downloaded models land) is not reachable.
# usage: sh scripts/termux-setup.sh
set -eu
cd "$(dirname "$0")/.."

NEED_MIB=600   # packages, the build and pip's cache; models need their own size on top

if ! command -v pkg >/dev/null 2>&1 || [ -z "${PREFIX:-}" ]; then
    echo "termux-setup: this script is for Termux on Android (no 'pkg' command here)" >&2
    echo "termux-setup: on Linux, run: pip install ." >&2
    exit 1
fi

free_mib=$(df -Pk "$PREFIX" | awk 'NR == 2 { print int($4 / 1024) }')
if [ "$free_mib" -lt "$NEED_MIB" ]; then
    echo "termux-setup: only $free_mib MiB free in $PREFIX; installing pi2 needs about $NEED_MIB MiB" >&2
    echo "termux-setup: free some space (Android settings > Storage) and run this script again" >&2
    exit 1
fi

if [ ! -d "$HOME/storage/shared" ]; then
    echo "termux-setup: note: Termux cannot read shared storage yet (no $HOME/storage/shared)." >&2
    echo "termux-setup: to copy a downloaded model, run 'termux-setup-storage', allow the permission, then" >&2
    echo "termux-setup:   cp ~/storage/downloads/MODEL.gguf ~/   (keep models in \$HOME, not on /sdcard)" >&2
fi

echo "termux-setup: installing packages: python python-pip python-numpy clang make binutils"
pkg install -y python python-pip python-numpy clang make binutils

echo "termux-setup: building and installing pi2 (compiles the C core; takes a minute)"
python3 -m pip install .

echo "termux-setup: done; pi2 is $(command -v pi2)"
pi2 devices
