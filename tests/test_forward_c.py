"""test_forward_c.py — the C forward pass (csrc/forward.c through pi2.engine.CContext) against pi2/reference/forward.py.

Checks: logits of every architecture and writable weight type against the reference (prompt batch, then
single tokens continuing the KV cache); every traced checkpoint, naming the first that diverges; bit-identical
results for 1, 2 and 3 threads; pi2_abort and Ctrl-C; descriptors that do not fit the file or the model;
real models (SmolLM2, Qwen2.5, Gemma-3) on a 32-token prompt.
Tolerances: the engines agree bit for bit where the C kernels follow ggml's float order as the reference
emulates it (most fixtures); elsewhere a float-order difference may flip an activation's 8-bit rounding,
which random fixtures amplify, so logits must agree to NMSE_LOGITS with equal argmax.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from conftest import model_file
from fixtures import write_model
from pi2 import engine
from pi2.engine import CContext, CModel, tensor_descs
from pi2.errors import EngineError, ModelFormatError, UnsupportedError, UsageError
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext

ARCHS = ["llama", "qwen2", "gemma3"]
WTYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "F32", "BF16"]
NMSE_LOGITS = 1e-3        # fixtures: float-order differences amplified by 8-bit activation roundings
NMSE_CHECKPOINT = 1e-9    # Q8_0 fixtures: the engines agree bit for bit; this only absorbs a rare flip
NMSE_REAL = 5e-3          # real models: K-quant kernel float order; GELU table from libm tanhf (numpy in the reference)
PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / max((a ** 2).sum(), 1e-30))


_models = {}


def fixture_model(tmp_path_factory, arch, wtype="Q8_0"):
    """A tiny model per (arch, wtype); gemma3 gets 6 layers so that layer 5 attends globally."""
    if (arch, wtype) not in _models:
        path = tmp_path_factory.mktemp("fwd") / f"{arch}-{wtype}.gguf"
        write_model(path, arch=arch, wtype=wtype, n_layer=6 if arch == "gemma3" else 2, sliding_window=5)
        m = load_model(path)
        _models[(arch, wtype)] = (m, CModel.from_model(m))
    return _models[(arch, wtype)]


def traced(ctx, tokens):
    """{(name, layer): float32 values} of every checkpoint of one decode, and its logits."""
    seen = {}
    hook = lambda name, layer, x: seen.__setitem__((name, layer), np.asarray(x, np.float32).reshape(-1))  # noqa: E731
    if isinstance(ctx, CContext):
        ctx.set_trace(hook)
    else:
        ctx.trace = hook
    logits = ctx.decode(tokens, all_logits=True)
    return seen, logits


def first_divergence(ref: dict, got: dict, tol: float):
    """The first checkpoint (reference order) whose NMSE exceeds tol, as (name, layer, nmse), else None."""
    for key, a in ref.items():
        if key in got and nmse(a, got[key]) > tol:
            return key[0], key[1], nmse(a, got[key])
    return None


# ---------------------------------------------------------------- against the reference

@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_reference(tmp_path_factory, arch, wtype):
    m, cm = fixture_model(tmp_path_factory, arch, wtype)
    ref, c = ReferenceContext(m, 64), CContext(cm, 64, n_threads=1)
    a, b = ref.decode(PROMPT, all_logits=True), c.decode(PROMPT, all_logits=True)
    assert b.shape == a.shape == (len(PROMPT), m.config.n_vocab)
    assert nmse(a, b) <= NMSE_LOGITS, f"prompt logits NMSE {nmse(a, b):.2e}"
    assert (a.argmax(-1) == b.argmax(-1)).all()
    for tok in (7, 300):   # single tokens continue the cache
        a, b = ref.decode([tok]), c.decode([tok])
        assert b.shape == (m.config.n_vocab,)
        assert nmse(a, b) <= NMSE_LOGITS and a.argmax() == b.argmax()
    assert c.n_past == ref.n_past == len(PROMPT) + 2


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoints_match_reference(tmp_path_factory, arch):
    """Every checkpoint both engines trace agrees; a failure names the first diverging layer and checkpoint."""
    m, cm = fixture_model(tmp_path_factory, arch)
    ref, c = ReferenceContext(m, 64), CContext(cm, 64, n_threads=1)
    R, _ = traced(ref, PROMPT)
    C, _ = traced(c, PROMPT)
    names = {k[0] for k in C}
    assert {"attn_norm", "Qcur", "Kcur", "Vcur", "Qcur.rope", "Kcur.rope", "kqv_out", "attn_out", "ffn_inp",
            "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out", "l_out", "result_norm",
            "result_output"} <= names
    common = [k for k in R if k in C]
    assert len(common) >= 15 * m.config.n_layer, f"only {len(common)} checkpoints in common"
    for k in common:
        assert C[k].size == R[k].size, f"{k}: {C[k].size} values, reference has {R[k].size}"
    bad = first_divergence(R, C, NMSE_CHECKPOINT)
    assert bad is None, "first divergence at layer {1}, checkpoint {0} (NMSE {2:.2e})".format(*bad)


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_continuity(tmp_path_factory, arch):
    """A prompt in pieces (batch, single tokens, batch) gives the reference's logits for the same pieces,
    and reset() starts over."""
    m, cm = fixture_model(tmp_path_factory, arch)
    ref, c = ReferenceContext(m, 64), CContext(cm, 64, n_threads=1)
    for piece in (PROMPT[:8], PROMPT[8:9], PROMPT[9:10], PROMPT[10:]):
        a, b = ref.decode(piece, all_logits=True), c.decode(piece, all_logits=True)
        assert nmse(a, b) <= NMSE_CHECKPOINT and (a.argmax(-1) == b.argmax(-1)).all()
    assert c.n_past == len(PROMPT)
    c.reset()
    assert c.n_past == 0
    assert np.array_equal(c.decode(PROMPT[:8], all_logits=True), CContext(cm, 64, 1).decode(PROMPT[:8], all_logits=True))


def test_long_context_attention(tmp_path):
    """150 positions: whole groups of 16 and 64 keys in the lane order of both F16 dot products, and a
    sliding window that starts mid-group (gemma3 layer 0, checked at its attention output)."""
    for arch, window in (("llama", None), ("gemma3", 40)):
        m = load_model(write_model(tmp_path / f"{arch}.gguf", arch=arch, n_layer=6 if arch == "gemma3" else 2,
                                   sliding_window=window, n_ctx=512))
        ref, c = ReferenceContext(m, 256), CContext(CModel.from_model(m), 256, n_threads=2)
        tokens = list(np.random.default_rng(1).integers(0, m.config.n_vocab, 150))
        for piece in (tokens, [5], [9], [77]):
            R, a = traced(ref, piece)
            C, b = traced(c, piece)
            assert nmse(R[("kqv_out", 0)], C[("kqv_out", 0)]) <= NMSE_CHECKPOINT
            assert nmse(a, b) <= NMSE_LOGITS and (a.argmax(-1) == b.argmax(-1)).all()


def test_batches_longer_than_n_batch(tmp_path_factory):
    """A decode longer than n_batch runs in steps and matches the reference's rows."""
    m, cm = fixture_model(tmp_path_factory, "llama")
    c = CContext(cm, 64, n_threads=1, n_batch=8)
    a = ReferenceContext(m, 64).decode(PROMPT, all_logits=True)
    b = c.decode(PROMPT, all_logits=True)
    assert nmse(a, b) <= NMSE_LOGITS and (a.argmax(-1) == b.argmax(-1)).all()
    assert np.array_equal(CContext(cm, 64, n_threads=1, n_batch=8).decode(PROMPT), b[-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_thread_count_is_bit_identical(tmp_path_factory, arch):
    m, cm = fixture_model(tmp_path_factory, arch, "Q4_1")
    runs = []
    for n_threads in (1, 2, 3):
        c = CContext(cm, 64, n_threads=n_threads)
        trace, prompt = traced(c, PROMPT)
        runs.append((trace, prompt, c.decode([5]), c.decode([6])))
    for trace, prompt, t1, t2 in runs[1:]:
        assert np.array_equal(prompt, runs[0][1]) and np.array_equal(t1, runs[0][2]) and np.array_equal(t2, runs[0][3])
        assert all(np.array_equal(v, runs[0][0][k]) for k, v in trace.items())


# ---------------------------------------------------------------- abort and Ctrl-C

def test_abort_stops_at_a_layer_and_keeps_the_cache(tmp_path_factory):
    m, cm = fixture_model(tmp_path_factory, "llama")
    c = CContext(cm, 64, n_threads=2)
    c.decode(PROMPT[:4])
    layers = []

    def hook(name, layer, x):
        layers.append(layer)
        if name == "l_out" and layer == 0:
            engine.lib.pi2_abort(c._h)
    c.set_trace(hook)
    with pytest.raises(KeyboardInterrupt):
        c.decode(PROMPT[4:])
    assert max(layers) == 0 and c.n_past == 4            # stopped before layer 1; cache as before
    c.set_trace(None)
    fresh = CContext(cm, 64, n_threads=1)
    fresh.decode(PROMPT[:4])
    assert np.array_equal(c.decode(PROMPT[4:]), fresh.decode(PROMPT[4:]))


def test_ctrl_c_interrupts_a_long_decode(tmp_path, monkeypatch):
    """SIGINT during a decode run from the main thread stops it early and raises KeyboardInterrupt."""
    # long enough (~0.7 s here) that the signal at 0.2 s lands inside the decode
    path = write_model(tmp_path / "long.gguf", n_embd=256, n_ff=512, n_layer=8, n_head=4, n_head_kv=4, n_ctx=2048)
    cm = CModel.from_model(load_model(path))
    monkeypatch.setattr(engine.context, "_LONG_DECODE_BYTES", 0)
    c = CContext(cm, 2048, n_threads=1)
    tokens = list(np.arange(2000) % 500)
    # under nohup or in a background job SIGINT is ignored and Python installs no handler: install Python's own
    # for the test, so the signal becomes a KeyboardInterrupt as at a terminal
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.perf_counter()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            c.decode(tokens)
        interrupted = time.perf_counter() - t0
        timer.cancel()
    finally:
        signal.signal(signal.SIGINT, saved)
    assert c.n_past == 0
    t0 = time.perf_counter()
    c.decode(tokens)
    assert interrupted < 0.5 * (time.perf_counter() - t0) + 0.2


def test_ctrl_c_test_works_when_sigint_is_ignored(tmp_path):
    """The test above, run in a process that inherits SIGINT ignored (as under nohup): it still passes."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{__file__}::test_ctrl_c_interrupts_a_long_decode"], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(__file__)), timeout=300,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


# ---------------------------------------------------------------- bad input

def _descs(m):
    return tensor_descs(m)


def _with(descs, role, layer=-1, **changes):
    out = list(descs)
    i = next(i for i, (r, l, _) in enumerate(out) if r == role and l == layer)
    out[i] = (role, layer, replace(out[i][2], **changes))
    return out


def test_bad_descriptors_are_refused(tmp_path_factory):
    m, _ = fixture_model(tmp_path_factory, "llama")
    descs = _descs(m)
    size = os.path.getsize(m.path)
    q = next(t for r, l, t in descs if r == 5 and l == 0)
    cases = [
        (_with(descs, 5, 0, offset=size - 16), ModelFormatError, "past the end of the file"),
        (_with(descs, 5, 0, offset=2**63), ModelFormatError, "past the end of the file"),
        (_with(descs, 5, 0, nbytes=q.nbytes + 34), ModelFormatError, "bytes"),
        (_with(descs, 5, 0, ne=(q.ne[0], q.ne[1] + 1)), ModelFormatError, "shape"),
        (_with(descs, 5, 0, offset=q.offset + 1), ModelFormatError, "aligned"),
        (_with(descs, 4, 0, type=1, nbytes=m.config.n_embd * 2), UnsupportedError, "type"),
        (_with(descs, 5, 0, type=15), UnsupportedError, "type"),
        ([d for d in descs if not (d[0] == 18 and d[1] == 1)], ModelFormatError, "missing"),
        (descs + [descs[-1]], ModelFormatError, "twice"),
        (descs + [(9, 0, q)], ModelFormatError, "not read"),
        (descs + [(4, 7, descs[4][2])], ModelFormatError, "layer"),
        (descs + [(99, -1, q)], ModelFormatError, "role"),
    ]
    for bad, exc, words in cases:
        with pytest.raises(exc, match=words):
            CModel.from_model(m, bad)


def test_bad_calls_are_refused(tmp_path_factory):
    m, cm = fixture_model(tmp_path_factory, "llama")
    c = CContext(cm, 8, n_threads=1)
    with pytest.raises(EngineError, match="outside the vocabulary"):
        c.decode([m.config.n_vocab])
    with pytest.raises(UsageError, match="nothing"):
        c.decode([])
    with pytest.raises(UsageError, match="context full"):
        c.decode(list(range(9)))
    assert c.n_past == 0
    with pytest.raises(EngineError, match="thread count"):
        CContext(cm, 8, n_threads=10_000)
    with pytest.raises(EngineError, match="cannot open"):
        CModel.from_model(replace_path(m, "/nonexistent/model.gguf"))


def replace_path(m, path):
    from copy import copy
    m2 = copy(m)
    m2.path = path
    return m2


# ---------------------------------------------------------------- real models

@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("key", ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_real_model_matches_reference(key):
    m = load_model(model_file(key))
    tok = m.tokenizer
    ids = tok.encode("The water cycle moves water between the oceans, the air and the land. It starts when "
                     "the sun heats the surface of the sea and turns some of it into vapour.", parse_special=True)[:32]
    assert len(ids) == 32
    ref, c = ReferenceContext(m, 64), CContext(CModel.from_model(m), 64, n_threads=2)
    R, a = traced(ref, ids)
    C, b = traced(c, ids)
    where = first_divergence(R, C, 1e-12)
    detail = "" if where is None else " (first divergence at layer {1}, checkpoint {0}: NMSE {2:.2e})".format(*where)
    assert nmse(a, b) <= NMSE_REAL, f"logits NMSE {nmse(a, b):.2e}{detail}"
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9, f"top-1 agreement {(a.argmax(-1) == b.argmax(-1)).mean():.0%}{detail}"
    assert np.array_equal(ref.decode([ids[0]]).argmax(), c.decode([ids[0]]).argmax())
