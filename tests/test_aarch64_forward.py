"""test_aarch64_forward.py — the C forward pass on aarch64 under qemu against x86-64 and the numpy reference.

tests/c/forward_driver.c is built with the C core for aarch64 (static, aarch64-linux-gnu-gcc) and run under
`qemu-aarch64-static -cpu max` (NEON + dotprod) and `-cpu cortex-a72` (NEON only) on a description file
written here from pi2.engine.c_model_structs: synthetic models of every architecture and several weight
types, then SmolLM2-135M (Q4_1, ~6 s) and Gemma-3-270M (Q4_K, Q6_K, Q5_0, Q8_0, GELU; ~22 s) on a few
tokens (each skipped when absent or slower than REAL_TIMEOUT under qemu). Qwen2.5-0.5B also matches bit for
bit but takes ~25 s, so it is left out.
Checks: the aarch64 logits equal the native C engine's (pi2.engine.CContext, same tokens, same batch and
single-token steps) bit for bit, since the NEON kernels follow x86's float order and the rest of the core
is plain C; and they agree with pi2/reference/forward.py within NMSE_LOGITS with the same argmax per token, the
tolerance of tests/test_forward_c.py (random fixtures amplify 8-bit activation roundings).
Skipped, with the reason, when aarch64-linux-gnu-gcc or qemu-aarch64-static is missing.
"""
import ast
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import model_file
from fixtures import write_model
from pi2 import engine
from pi2.engine import CContext, CModel
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext

ROOT = Path(__file__).resolve().parent.parent
CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64-static")
pytestmark = pytest.mark.skipif(not (CC and QEMU), reason="aarch64 cross tools missing: apt-get install -y "
                                "gcc-aarch64-linux-gnu qemu-user-static")


def _core_sources() -> list:
    """The C core's sources as csrc/ffi_build.py lists them for the extension (read, not imported: no cffi)."""
    tree = ast.parse((ROOT / "csrc" / "ffi_build.py").read_text())
    return next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "SOURCES")


SOURCES = _core_sources()
CPUS = ["max", "cortex-a72"]
NMSE_LOGITS = 1e-3
REAL_TIMEOUT = 60                                    # seconds for one qemu run of a real model
TOKENS = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18]
N_PROMPT = 12                                        # the rest are decoded one at a time


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / max((a ** 2).sum(), 1e-30))


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    out = tmp_path_factory.mktemp("a64") / "forward_driver"
    cmd = [CC, "-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-static", "-pthread",
           f"-I{ROOT / 'csrc'}", "-o", str(out), *[str(ROOT / "csrc" / s) for s in SOURCES],
           str(ROOT / "tests" / "c" / "forward_driver.c"), "-lm", "-ldl"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def write_desc(path: Path, model, tokens, n_prompt: int, n_ctx: int, n_threads: int = 2) -> None:
    """The description file forward_driver.c reads (its header comment has the layout)."""
    params, arr = engine.c_model_structs(model)
    n_tensors = len(engine.tensor_descs(model))
    mpath = str(model.path).encode()
    head = struct.pack("<4s3I6iI", b"PI2D", 1, engine.ffi.sizeof("pi2_model_params"),
                       engine.ffi.sizeof("pi2_tensor_desc"), n_tensors, len(tokens), n_prompt, n_ctx, n_threads,
                       engine.IMPLS["auto"], len(mpath))
    body = bytes(engine.ffi.buffer(params)) + bytes(engine.ffi.buffer(arr))[:n_tensors * engine.ffi.sizeof("pi2_tensor_desc")]
    path.write_bytes(head + mpath + body + np.asarray(tokens, "<i4").tobytes())


def run_a64(driver, desc: Path, cpu: str, n_vocab: int, n_tok: int, timeout=None) -> np.ndarray:
    out = desc.with_suffix(f".{cpu}.logits")
    subprocess.run([QEMU, "-cpu", cpu, str(driver), str(desc), str(out)], check=True, capture_output=True,
                   timeout=timeout)
    return np.fromfile(out, "<f4").reshape(n_tok, n_vocab)


def steps(ctx, tokens, n_prompt: int) -> np.ndarray:
    """Logits of every token: the first n_prompt as one batch, then one token at a time (as the driver)."""
    rows = [ctx.decode(tokens[:n_prompt], all_logits=True)]
    rows += [ctx.decode([t])[None] for t in tokens[n_prompt:]]
    return np.concatenate(rows)


CASES = [("llama", "Q8_0"), ("llama", "Q4_0"), ("llama", "F16"), ("qwen2", "Q4_1"), ("qwen2", "Q5_0"),
         ("qwen2", "F32"), ("gemma3", "Q5_1"), ("gemma3", "BF16")]


@pytest.mark.parametrize("arch,wtype", CASES)
def test_synthetic_models(driver, tmp_path, arch, wtype):
    path = write_model(tmp_path / f"{arch}-{wtype}.gguf", arch=arch, wtype=wtype,
                       n_layer=6 if arch == "gemma3" else 2, sliding_window=5)
    m = load_model(path)
    n_ctx = 64
    native = steps(CContext(CModel.from_model(m), n_ctx, n_threads=1), TOKENS, N_PROMPT)
    ref = steps(ReferenceContext(m, n_ctx), TOKENS, N_PROMPT)
    desc = tmp_path / "model.desc"
    write_desc(desc, m, TOKENS, N_PROMPT, n_ctx)
    for cpu in CPUS:
        got = run_a64(driver, desc, cpu, m.config.n_vocab, len(TOKENS))
        assert np.array_equal(got.view(np.uint32), native.view(np.uint32)), \
            f"-cpu {cpu}: differs from x86-64 (NMSE {nmse(native, got):.2e})"
        assert nmse(ref, got) <= NMSE_LOGITS and (ref.argmax(-1) == got.argmax(-1)).all(), f"-cpu {cpu}"


@pytest.mark.model
@pytest.mark.parametrize("key,n_tok,n_prompt", [("smollm2-135m", 6, 4), ("gemma3-270m", 10, 9)])
def test_real_models(driver, tmp_path, key, n_tok, n_prompt):
    """Real files, K-quants included: 9-token prompts run Q4_K's groups-of-4 order and Q6_K's tiled order."""
    m = load_model(model_file(key))
    tokens, n_ctx = TOKENS[:n_tok], 16
    native = steps(CContext(CModel.from_model(m), n_ctx, n_threads=1), tokens, n_prompt)
    desc = tmp_path / f"{key}.desc"
    write_desc(desc, m, tokens, n_prompt, n_ctx)
    try:
        got = run_a64(driver, desc, "max", m.config.n_vocab, len(tokens), timeout=REAL_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{key} takes more than {REAL_TIMEOUT} s under qemu here")
    assert np.array_equal(got.view(np.uint32), native.view(np.uint32)), f"NMSE {nmse(native, got):.2e}"
