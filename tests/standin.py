"""standin.py — builds the stand-in libneuralnetworks.so (tests/c/nnapi_standin*.c) with the C compiler, and
the fixtures the NNAPI tests share: `libs` (the library and a build without ANeuralNetworksEvent_wait),
`standin` (its control functions, reset around each test) and `nmse`."""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
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
                    str(ROOT / "tests/c/nnapi_standin.c"), str(ROOT / "tests/c/nnapi_standin_exec.c"), "-lpthread", "-lm"],
                   check=True)
    return str(path)


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-30))


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """Paths of the stand-in library and of a build without ANeuralNetworksEvent_wait."""
    d = tmp_path_factory.mktemp("nnapi")
    return {"full": build_standin(d / "full"), "no_wait": build_standin(d / "no_wait", "-DSTANDIN_NO_EVENT_WAIT")}


@pytest.fixture
def standin(libs):
    """The stand-in's control functions (the same loaded copy the delegate opens), reset."""
    so = ctypes.CDLL(libs["full"])
    so.standin_set.argtypes = [ctypes.c_char_p, ctypes.c_int]
    so.standin_graph.restype = ctypes.c_char_p
    so.standin_reset()

    class S:
        path = libs["full"]

        @staticmethod
        def set(**kw):
            for k, v in kw.items():
                assert so.standin_set(k.encode(), v) == 0, k

        @staticmethod
        def graphs() -> list:
            return [json.loads(so.standin_graph(i)) for i in range(so.standin_graph_count())]

        executions = staticmethod(lambda: so.standin_executions())
    yield S
    so.standin_reset()
