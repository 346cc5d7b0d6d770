"""standin.py — builds the stand-in libneuralnetworks.so (tests/c/nnapi_standin.c) with the C compiler."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build_standin(dest: Path, *flags: str) -> str:
    """Compile the stand-in into dest/libneuralnetworks.so (skips the test without a compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libneuralnetworks.so")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "libneuralnetworks.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *flags, f"-I{ROOT / 'csrc'}", "-o", str(path),
                    str(ROOT / "tests/c/nnapi_standin.c"), "-lpthread", "-lm"], check=True)
    return str(path)
