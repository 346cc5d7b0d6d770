"""test_moe_convert.py — `pi2 convert` of a MoE file with ReLU experts (smallthinker): the profile of each expert's
neurons (csrc/ffn/moe_neurons.c), the hot-first order and up/down bundles it writes (pi2/convert/moe.py,
pi2/model/expert_bundles.py), and the converted file computed by the C engine (down rows: csrc/ffn/moe_down_rows.c)
against the numpy reference bit for bit, at 1, 2 and 3 threads, prompt batches and single tokens, dense and relu
rules. Permuting neurons re-quantizes down along the neuron axis and changes its summation order, so the converted
file's logits are close to the source's, not equal: that is checked as a bound.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import cli
from moe_files import write_moe

from pi2.convert import convert
from pi2.engine import CContext, CModel, expert_clusters
from pi2.model.expert_bundles import layout
from pi2.model.loader import load_model
from pi2.reference.moe import MoEContext
from pi2.reference.quants import dequantize
from pi2.runtime.ffn_rule import FFNRule

PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
NEXT = [5, 9, 300, 41]
_files: dict = {}


def converted(tmp_path_factory, exp_type: str, ffn_type: str = "auto"):
    """(source model, converted model, report) of the synthetic smallthinker file with exp_type experts."""
    key = (exp_type, ffn_type)
    if key not in _files:
        d = tmp_path_factory.mktemp("moeconv")
        src = write_moe(d / f"st.{exp_type}.gguf", "smallthinker", "F32", exp_type=exp_type)
        rep = convert(src, d / "st.pi2.gguf", calib_tokens=256, progress=False, n_threads=2, ffn_type=ffn_type)
        _files[key] = (load_model(src), load_model(rep.output), rep)
    return _files[key]


def rows3(m, name):
    t = m.file.tensors[name]
    return m.file.raw(name).reshape(int(t.ne[2]), int(t.ne[1]), t.row_bytes)


@pytest.mark.parametrize("exp_type", ["Q4_0", "F32"])
def test_layout_is_the_source_permuted(tmp_path_factory, exp_type):
    src, dst, rep = converted(tmp_path_factory, exp_type)
    cfg = src.config
    assert dst.config.expert_bundles and rep.layout == "bundle-ud"
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        perm = dst.raw(b + "ffn_perm_exps.weight").view(np.int32).reshape(cfg.n_expert, cfg.n_ff_exp)
        freq = dst.raw(b + "ffn_freq_exps.weight").view(np.float32).reshape(cfg.n_expert, cfg.n_ff_exp)
        assert all(np.array_equal(np.sort(p), np.arange(cfg.n_ff_exp)) for p in perm)
        assert np.all(np.diff(freq, axis=1) <= 0) and freq.max() <= 1 and freq.min() >= 0
        lay = layout(dst, il)
        gate = np.take_along_axis(rows3(src, b + "ffn_gate_exps.weight"), perm[:, :, None], axis=1)
        assert np.array_equal(rows3(dst, b + "ffn_gate_exps.weight"), gate)
        rec = dst.raw(b + "ffn_bundle_exps.weight").view(np.uint8).reshape(cfg.n_expert, cfg.n_ff_exp, -1)
        up = np.take_along_axis(rows3(src, b + "ffn_up_exps.weight"), perm[:, :, None], axis=1)
        assert np.array_equal(rec[:, :, :up.shape[2]], up)
        down_src = rows3(src, b + "ffn_down_exps.weight")
        for e in (0, cfg.n_expert - 1):
            want = dequantize(down_src[e], src.tensor(b + "ffn_down_exps.weight").type, cfg.n_ff_exp).T[perm[e]]
            raw = rec[e, :, lay["down_offset"]:]
            if exp_type == "F32":   # float rows: the source's values, exactly
                got = raw[:, :cfg.n_embd * 4].copy().view(np.float32)
                assert np.array_equal(got, want)
            else:                   # int8 rows with row and column scales
                r = dst.raw(b + "ffn_down_scale_exps.weight").view(np.float32).reshape(cfg.n_expert, -1)[e]
                c = dst.raw(b + "ffn_down_colscale_exps.weight").view(np.float32).reshape(cfg.n_expert, -1)[e]
                got = raw[:, :cfg.n_embd].view(np.int8).astype(np.float32) * r[:, None] * c[None, :]
                assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.01


def test_profile_counts_the_open_neurons(tmp_path_factory):
    """Single tokens under the relu rule count their open (row, neuron) pairs per layer (moe_relu.c); the profile's
    per-neuron counts of the same steps add up to them, and its routed rows to the routing counts."""
    src, _, _ = converted(tmp_path_factory, "Q4_0")
    cfg = src.config
    c = CContext(CModel.from_model(src), 64, 2)
    c.set_ffn(FFNRule("relu"))
    counts = np.zeros((cfg.n_layer, cfg.n_expert, cfg.n_ff_exp), np.int64)
    expert_clusters.count_neurons(c, counts)
    for t in PROMPT[:12]:
        c.decode([t])
    tokens, active = c.ffn_counts()
    assert tokens == 12 and np.array_equal(counts.sum(axis=(1, 2)), active)
    assert np.all(counts <= c.expert_counts[:, :, None])
    expert_clusters.count_neurons(c, None)
    c.decode([7])
    assert counts.sum(axis=(1, 2)).tolist() == active.tolist()     # stopped
    # clusters of one neuron are the neurons; of eight, at most that many and at least an eighth
    for cluster, lo in ((1, 1.0), (8, 1 / 8)):
        counts[:], cl = 0, np.zeros(cfg.n_layer, np.int64)
        expert_clusters.count_neurons(c, counts, cl, cluster)
        for t in NEXT:
            c.decode([t])
        per = counts.sum(axis=(1, 2))
        assert np.all(cl <= per) and np.all(cl >= np.ceil(per * lo)) if cluster > 1 else np.array_equal(cl, per)


def run(ctx) -> list:
    return [ctx.decode(PROMPT, all_logits=True)] + [ctx.decode([t]) for t in NEXT]


@pytest.mark.parametrize("exp_type,ffn_type", [("Q4_0", "auto"), ("F32", "auto"), ("Q4_0", "q4_1")])
def test_converted_file_c_equals_reference(tmp_path_factory, exp_type, ffn_type):
    """Down rows I8 (quantized sources), F32 (float sources, exact values) and Q4_1 (--ffn-type q4_1)."""
    src, dst, rep = converted(tmp_path_factory, exp_type, ffn_type)
    assert rep.down_types == [{"auto": "I8" if exp_type == "Q4_0" else "F32", "q4_1": "Q4_1"}[ffn_type]] * 3
    want = run(MoEContext(dst, 64))
    cm = CModel.from_model(dst)
    for threads in (1, 2, 3):
        for rule in ("dense", "relu"):
            ctx = CContext(cm, 64, threads)
            ctx.set_ffn(FFNRule(rule))
            for i, (a, b) in enumerate(zip(want, run(ctx))):
                assert np.array_equal(a, b), f"{exp_type} -t {threads} {rule}: step {i} differs"
    # close to the source: only down's storage and summation order differ
    base = run(MoEContext(src, 64))
    for a, b in zip(base, want):
        bound = 1e-4 if exp_type == "F32" else 0.05 if ffn_type == "auto" else 0.5   # 4-bit rows of 4-bit columns
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < bound


def test_cli_convert_and_run(tmp_path_factory, tmp_path):
    src, dst, _ = converted(tmp_path_factory, "Q4_0")
    res = cli("convert", src.path, "-o", str(tmp_path / "c.gguf"), "--calib-tokens", "128", "-t", "1")
    assert res.code == 0, res.err
    assert "hot-first neuron order" in res.out and "open neurons per routed row" in res.out
    args = ("-p", "hello world", "-n", "8", "--temp", "0", "-c", "128", "--ignore-eos")
    run1, run2 = cli("run", str(tmp_path / "c.gguf"), *args), cli("run", dst.path, *args)
    assert run1.code == 0 and run1.out == run2.out and run1.out, run1.err
    verbose = cli("run", dst.path, *args, "--verbose")
    assert verbose.out == run2.out and "of the bundle clusters open per routed row" in verbose.err
    bench = cli("bench", dst.path, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "-o", "json")
    b = json.loads(bench.out)[0]
    assert 0.4 < b["pi2_expert_open_clusters"] < 1
    assert 0 < b["pi2_expert_bytes_per_token_open_clusters"] < b["pi2_expert_bytes_per_token_whole"]
    again = cli("convert", str(tmp_path / "c.gguf"), "-o", str(tmp_path / "d.gguf"))
    assert again.code == 2 and "already converted" in again.err


def test_cli_convert_refuses_swiglu_experts(tmp_path):
    src = write_moe(tmp_path / "q.gguf", "qwen3moe", "F32")
    res = cli("convert", str(src), "-o", str(tmp_path / "q.pi2.gguf"))
    assert res.code == 1 and "ReLU-family" in res.err
    assert not (tmp_path / "q.pi2.gguf").exists()
