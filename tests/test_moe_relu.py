"""test_moe_relu.py — ReLU experts (smallthinker's ReGLU) under the FFN rule relu (csrc/ffn/moe_relu.c): gate first,
up rows only for the neurons some routed row's gate opened. The logits are bit-identical to the dense experts' (rule
dense) for Q4_0 experts (packed x8 layout and the file's), F32 and F16, the scalar and the SIMD kernels, prompt batches
and single tokens, 1, 2 and 3 threads; the active share is counted; `pi2 run` computes them so by default and
`--dense` every row, the same text. Random weights close about half of the gates: a trained ReLU model closes more.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import cli
from moe_files import write_moe

from pi2.engine import CContext, CModel
from pi2.model.loader import load_model
from pi2.runtime.ffn_rule import FFNRule

PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
NEXT = [5, 9, 300, 41]
_files: dict = {}


def closed_rows(a: np.ndarray) -> np.ndarray:
    """Gate rows of 7 in 8 neurons zeroed (a zero gate is closed; ~94 % closed in all, more than a trained ReLU
    expert's ~85 %), so that the open rows are gathered rather than their groups computed whole."""
    keep = np.random.default_rng(3).random(a.shape[:-1]) < 1 / 8
    return a * keep[..., None]


def st_file(tmp_path_factory, exp_type: str, sparse: bool = False):
    key = (exp_type, sparse)
    if key not in _files:
        alter = {f"blk.{il}.ffn_gate_exps.weight": closed_rows for il in range(3)} if sparse else None
        path = write_moe(tmp_path_factory.mktemp("relu") / f"st.{exp_type}.{int(sparse)}.gguf", "smallthinker",
                         "F32", exp_type=exp_type, alter=alter)
        _files[key] = (path, load_model(path))
    return _files[key]


def run(c) -> list:
    return [c.decode(PROMPT, all_logits=True)] + [c.decode([t]) for t in NEXT]


def relu_ctx(cm, threads: int, impl: str = "auto") -> CContext:
    c = CContext(cm, 256, threads, impl=impl)
    c.set_ffn(FFNRule("relu"))
    return c


@pytest.mark.parametrize("exp_type,sparse", [("Q4_0", False), ("Q4_0", True), ("F32", False), ("F16", True)])
def test_relu_experts_equal_dense(tmp_path_factory, exp_type, sparse):
    path, m = st_file(tmp_path_factory, exp_type, sparse)
    cfg = m.config
    layouts = {"file": CModel.from_model(m)}
    if exp_type == "Q4_0":
        packed = CModel.from_model(m)
        if packed.repack(ffn=True):       # x8 copies where this CPU has the kernel
            layouts["packed"] = packed
    for name, cm in layouts.items():
        want = run(CContext(cm, 256, 1))
        for threads in (1, 2, 3):
            c = relu_ctx(cm, threads)
            got = run(c)
            for i, (a, b) in enumerate(zip(want, got)):
                assert np.array_equal(a, b), f"{exp_type} {name} -t {threads}: step {i} differs"
            tokens, active = c.ffn_counts()
            assert tokens == len(NEXT)           # single tokens; a prompt batch computes its experts whole
            # the last layer computes only the rows whose logits are wanted: the other layers see every token
            share = active[:-1].sum() / (tokens * (cfg.n_layer - 1) * cfg.n_expert_used * cfg.n_ff_exp)
            lo, hi = (0.03, 0.1) if sparse else (0.4, 0.6)   # random weights: about half of the gates open
            assert lo < share < hi, share
        if exp_type == "Q4_0":                   # the scalar kernel (reference table, other CPUs)
            assert all(np.array_equal(a, b) for a, b in zip(want, run(relu_ctx(cm, 2, impl="ref"))))


def test_relu_rule_on_other_experts_is_refused_or_dense(tmp_path_factory):
    """Up types without a one-row kernel here (Q8_0) compute every row under the rule: the same logits; a SwiGLU
    MoE file has no relu rule."""
    path = write_moe(tmp_path_factory.mktemp("relu") / "st.q8.gguf", "smallthinker", "Q8_0")
    cm = CModel.from_model(load_model(path))
    assert all(np.array_equal(a, b) for a, b in zip(run(CContext(cm, 256, 2)), run(relu_ctx(cm, 2))))
    swiglu = CModel.from_model(load_model(write_moe(tmp_path_factory.mktemp("relu") / "q.gguf", "qwen3moe", "F32")))
    with pytest.raises(Exception, match="relu"):
        relu_ctx(swiglu, 1)


def test_cli_relu_experts_by_default(tmp_path_factory):
    path, _ = st_file(tmp_path_factory, "Q4_0")
    args = (str(path), "-p", "hello world", "-n", "16", "--temp", "0", "-c", "256", "--ignore-eos")
    sparse, dense = cli("run", *args), cli("run", *args, "--dense")
    assert sparse.code == 0 and dense.code == 0, sparse.err + dense.err
    assert sparse.out == dense.out and sparse.out
    verbose = cli("run", *args, "--verbose")
    assert verbose.out == sparse.out and "neurons active per token" in verbose.err
    assert "neurons active" not in cli("run", *args, "--dense", "--verbose").err
    bench = cli("bench", str(path), "-p", "0", "-n", "8", "-r", "1", "-t", "1", "-o", "json")
    assert bench.code == 0, bench.err
    assert 0.4 < json.loads(bench.out)[0]["pi2_expert_neurons_active"] < 0.6
    res = cli("run", *args, "--keep", "0.5")
    assert res.code == 2 and "--keep does not apply" in res.err
