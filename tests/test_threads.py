"""test_threads.py — thread-count independence of the C forward pass under the pool's choices.
Checks: with another process holding a core, 2 and 3 threads give the same logits as 1 thread, bit for
bit, over prompt batches of odd sizes (row tasks of uneven length), batches split by n_batch and a run
of single tokens long enough for the pool to time layers shared and alone and switch between them.
"""
import subprocess
import sys

import numpy as np
import pytest

from pi2.engine import CContext
from test_forward_c import PROMPT, fixture_model

STEPS = [PROMPT[:1], PROMPT[1:4], PROMPT[4:17]] + [[t] for t in range(40, 64)]


def run(cm, n_threads, n_batch=512):
    c = CContext(cm, 128, n_threads=n_threads, n_batch=n_batch)
    return [c.decode(s, all_logits=len(s) > 1).copy() for s in STEPS]


@pytest.fixture
def busy_core():
    """A competing process spinning on one core for the duration of a test."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bit_identical_with_a_busy_core(tmp_path_factory, busy_core, arch):
    _, cm = fixture_model(tmp_path_factory, arch, "Q4_1")
    one = run(cm, 1)
    for n_threads, n_batch in ((2, 512), (3, 512), (2, 5)):
        got = run(cm, n_threads, n_batch)
        assert all(np.array_equal(a, b) for a, b in zip(one, got)), (n_threads, n_batch)
