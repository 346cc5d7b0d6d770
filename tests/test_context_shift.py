"""test_context_shift.py — llama.cpp's context shift (--context-shift): when a decode would fill the context, the
positions after the first n_keep lose their older half and the rest move down with their keys rotated by RoPE. The
C engine equals the reference (ReferenceContext.shift, the specification) bit for bit across many shifts, in each
architecture's RoPE (llama, qwen2's NEOX pairs, gemma3's two bases and sliding window); the shifted cache predicts
what a fresh context given the kept tokens would (the rotation is RoPE's, up to F16 rounding); and `pi2 run` keeps
generating past a full context with the flag and stops without it, as llama-completion."""
import json

import numpy as np
import pytest

from clirun import cli
from fixtures import write_model
from pi2.engine import CContext, CModel
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def model(request, tmp_path_factory):
    arch = request.param
    path = tmp_path_factory.mktemp("shift") / f"{arch}.gguf"
    write_model(path, arch=arch, n_layer=6 if arch == "gemma3" else 2, sliding_window=5, n_ctx=512)
    m = load_model(path)
    return m, CModel.from_model(m)


def test_c_equals_the_reference_across_shifts(model):
    m, cm = model
    c = CContext(cm, 24, n_threads=2, ctx_shift=True, n_keep=3)
    r = ReferenceContext(m, 24, ctx_shift=True, n_keep=3)
    prompt = list(range(5, 25))
    assert np.array_equal(c.decode(prompt), r.decode(prompt))
    seen = set()
    for t in range(40):                       # n_past cycles 23 -> 13 -> 23 ...: four shifts
        a, b = c.decode([(7 * t + 3) % 500]), r.decode([(7 * t + 3) % 500])
        assert np.array_equal(a, b), t
        assert c.n_past == r.n_past
        seen.add(c.n_past)
    assert min(seen) == 3 + (23 - 3) - (23 - 3) // 2 + 1 and max(seen) == 23      # shifted, never full


def test_shifted_keys_are_the_keys_at_the_new_positions(model):
    """After a shift the cache holds the kept tokens at 0..n_keep-1 and the moved ones at the following positions.
    In the first layer a key depends only on its token and position: the rotated keys equal those a fresh context
    computes for the same tokens at the new positions, up to the F16 rounding of the rotation; the values move
    unchanged."""
    m, _ = model
    r = ReferenceContext(m, 64)
    toks = [(11 * i + 1) % 500 for i in range(20)]
    r.decode(toks)
    v_before = r.v[0, 8:20].copy()
    r.shift(2, 6)                              # drop positions 2..7
    assert r.n_past == 14
    fresh = ReferenceContext(m, 64)
    fresh.decode(toks[:2] + toks[8:])
    got, want = r.k[0, :14].astype(np.float32), fresh.k[0, :14].astype(np.float32)
    assert np.array_equal(got[:2], want[:2])
    np.testing.assert_allclose(got[2:], want[2:], rtol=4e-3, atol=4e-3)
    assert np.array_equal(r.v[0, 2:14], v_before)


def test_without_shift_a_full_context_is_refused(model):
    _, cm = model
    c = CContext(cm, 8, n_threads=1)
    c.decode(list(range(8)))
    with pytest.raises(Exception, match="context full"):
        c.decode([1])


def test_run_goes_on_past_a_full_context_with_the_flag(tmp_path):
    path = write_model(tmp_path / "m.gguf", n_ctx=512)
    args = ["run", path, "-p", "Hello there", "-n", "40", "--temp", "0", "--ignore-eos", "-c", "16", "--json"]
    plain = json.loads(cli(*args).out)
    assert plain["stop_reason"] == "context" and len(plain["tokens"]) < 40
    shifted = cli(*args, "--context-shift", "--keep-tokens", "1")
    assert shifted.code == 0, shifted.err
    out = json.loads(shifted.out)
    assert out["stop_reason"] == "length" and len(out["tokens"]) == 40
    assert out["tokens"][:len(plain["tokens"])] == plain["tokens"]      # the same until the first shift
    ref = json.loads(cli(*args, "--context-shift", "--keep-tokens", "1", "--engine", "reference").out)
    assert ref["tokens"] == out["tokens"]
