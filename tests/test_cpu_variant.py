"""test_cpu_variant.py — PI2_CPU_VARIANT: the baseline variant forced on a CPU with more (x86-64 `avx2`, aarch64
`neon`), read once per process, so each case runs pi2 in a child process with the variable set.

Checks: `pi2 devices --json` names the forced variant and its reason and reports only the baseline ISA; `auto`
and an empty value keep the CPU's own choice; a value that is no variant of this CPU is a one-line error from
`pi2 devices` and from `pi2 run`; a request after the variant was chosen is refused unless it agrees; the logits
of tiny models of every 32-value block type and of real K-quant models (prompt batch, then single tokens) are bit
for bit those of the CPU's own variant.
"""
import json
import os
import platform
import subprocess
import sys

import pytest

from conftest import model_file
from fixtures import write_model

from pi2.engine.kernels import kernel_info
from pi2.engine.lib import ffi, last_error, lib

BASELINE = {"x86_64": "avx2", "aarch64": "neon"}.get(platform.machine())
pytestmark = pytest.mark.skipif(BASELINE is None, reason="no SIMD baseline variant on this architecture")

# A child's logits: the prompt in one batch (all rows), then four single tokens, as one sha256 per step.
LOGITS = r"""
import hashlib, sys
import numpy as np
from pi2.runtime.config import RunConfig
from pi2.runtime.session import open_model, open_session
threads = int(sys.argv[2])
ctx = open_session(open_model(sys.argv[1]), RunConfig(n_ctx=256, n_threads=threads, engine="c"))
prompt = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
out = [np.ascontiguousarray(ctx.decode(prompt, all_logits=True), np.float32)]
for t in (12, 250, 31, 7):
    out.append(np.ascontiguousarray(ctx.decode([t]), np.float32))
print(" ".join(hashlib.sha256(o.tobytes()).hexdigest()[:16] for o in out))
"""


def child(args, variant, timeout=300):
    env = dict(os.environ)
    env.pop("PI2_CPU_VARIANT", None)
    if variant is not None:
        env["PI2_CPU_VARIANT"] = variant
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def devices(variant):
    r = child(["-m", "pi2", "devices", "--json"], variant)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["cpu"]


def test_the_forced_variant_is_named_with_its_reason():
    own, forced = devices(None), devices(BASELINE)
    assert forced["variant"] == BASELINE and f"PI2_CPU_VARIANT={BASELINE}" in forced["variant_why"]
    assert forced["kernels"] == [BASELINE]
    assert "PI2_CPU_VARIANT" not in own["variant_why"]
    assert devices("auto") == own and devices("") == own


@pytest.mark.parametrize("value", ["avx512", "AVX2", "zen5-zmm", "x" * 300, "neon" if BASELINE == "avx2" else "avx2"])
def test_a_bad_value_is_one_line(value, tmp_path):
    for args in (["devices"], ["run", "-m", str(write_model(tmp_path / "m.gguf")), "-p", "hi", "-n", "1"]):
        r = child(["-m", "pi2", *args], value)
        lines = r.stderr.splitlines()
        assert r.returncode == 1 and not r.stdout and len(lines) == 1, r.stderr
        assert lines[0].startswith(f"pi2: error: PI2_CPU_VARIANT={value[:40]}: ") and "accepted: auto" in lines[0]


def logits(path, variant, threads):
    r = child(["-c", LOGITS, str(path), str(threads)], variant)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("wtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16"])
def test_logits_are_those_of_the_cpus_own_variant(wtype, tmp_path):
    path = write_model(tmp_path / f"{wtype}.gguf", arch="qwen2", wtype=wtype, n_embd=256, n_ff=512, n_head=4)
    for threads in (1, 2):
        assert logits(path, BASELINE, threads) == logits(path, None, threads)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("key", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_model_logits_are_those_of_the_cpus_own_variant(key):
    path = model_file(key)
    assert logits(path, BASELINE, 2) == logits(path, None, 2)


def test_a_request_after_the_variant_was_chosen_is_refused_unless_it_agrees():
    """The core takes the variant as a parameter asked for before its first kernel call (lib.py passes the variable
    at import); once chosen, asking for another is an error and asking for the same one is not."""
    kernel_info()                                             # the variant is chosen by now
    asked = os.environ.get("PI2_CPU_VARIANT", "").encode()
    assert lib.pi2_cpu_variant_request(asked) == 0
    assert lib.pi2_cpu_variant_request(ffi.NULL if not asked else asked) == 0
    other = b"no-such-variant"
    assert lib.pi2_cpu_variant_request(other) == lib.PI2_ERR_INVALID
    assert "already chosen" in last_error()[1]
