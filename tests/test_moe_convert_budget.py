"""test_moe_convert_budget.py — `pi2 convert` of a MoE file within a memory budget (pi2/convert/moe_budget.py): the
profile routes the calibration text through the streamed engine (experts read from flash into the expert cache)
instead of the file mapped whole, and the converted file is byte for byte the one the mapped profile gives, from a
cache too small for one layer's experts to one holding them all, at 1 and 2 threads; the automatic budget (a file
larger than what the process may use) streams too; `--memory-budget` on the CLI, and bad values as one-line errors.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from clirun import assert_error, cli
from fixtures import write_model
from moe_files import write_moe

from pi2.convert import convert, moe, moe_budget
from pi2.plan import budget as budget_mod
from pi2.model.loader import load_model
from pi2.plan import devices
from pi2.runtime.config import RunConfig
from pi2.runtime.plan import plan_run

N_EXPERT, N_LAYER = 48, 4       # more experts than the smallest budget's slots: a layer's experts come in chunks
_files: dict = {}


def source(tmp_path_factory):
    """(the synthetic smallthinker file, the converted file's bytes with the profile mapped at 1 thread)."""
    if "src" not in _files:
        d = tmp_path_factory.mktemp("moebudget")
        src = write_moe(d / "st.gguf", "smallthinker", "F32", exp_type="Q4_0", n_expert=N_EXPERT, n_layer=N_LAYER)
        rep = convert(src, d / "mapped.gguf", calib_tokens=256, progress=False, n_threads=1)
        assert rep.budget is None
        _files["src"] = (src, open(rep.output, "rb").read())
    return _files["src"]


@pytest.fixture(autouse=True)
def steady_runtime(monkeypatch):
    """The planner's runtime (this process's RSS) held at its value when the test starts: the budgets below sit a MiB
    above the floor, and a test run's RSS may grow more than that between planning a budget and converting under it
    (the earlier tests' heap), which would refuse the budget the test means to use."""
    rss = budget_mod.runtime_rss()
    monkeypatch.setattr(budget_mod, "runtime_rss", lambda model=None: rss)


def plan_at(src, budget):
    """The expert cache's split the profile's context takes at budget (as moe_budget.profile_context plans it)."""
    return plan_run(load_model(src), RunConfig(n_ctx=257, memory_budget=budget, repack=False, expert_profile=False,
                                               npu="off")).cache


def budgets(src) -> list:
    """The smallest budget (fewer slots than one layer's experts), one with a few layers' experts, and one far
    larger than the file."""
    low = plan_at(src, 1 << 40).minimum + (1 << 20)     # a MiB for the process's RSS growing between plans
    return [low, low + 2 * N_EXPERT * plan_at(src, low).slot_bytes, 1 << 34]


def test_budgets_cover_small_to_large(tmp_path_factory):
    """The test's budgets do what they claim: at the smallest the cache holds fewer slots than a layer's experts
    (every layer's experts come in chunks, read again for each chunk of text); at the largest every expert."""
    src, _ = source(tmp_path_factory)
    small, _mid, large = (plan_at(src, b) for b in budgets(src))
    assert small.n_slots < N_EXPERT
    assert large.n_slots + large.n_hot >= N_EXPERT * N_LAYER


@pytest.mark.parametrize("threads", [1, 2])
def test_budgeted_profile_writes_the_same_bytes(tmp_path_factory, tmp_path, threads):
    src, want = source(tmp_path_factory)
    for i, b in enumerate(budgets(src)):
        rep = convert(src, tmp_path / f"b{i}.gguf", calib_tokens=256, progress=False, n_threads=threads,
                      memory_budget=b)
        assert rep.budget == b
        assert open(rep.output, "rb").read() == want, f"budget {b} at -t {threads}"


def test_budgeted_profile_counts_as_the_mapped_one(tmp_path_factory):
    """The counts themselves, and that the streamed context did read its experts from the file (misses at the
    smallest budget): the same counts are not the mapped run's by accident."""
    src, _ = source(tmp_path_factory)
    m = load_model(src)
    routed, counts, n_tok, sha, budget = moe.profile_neurons(m, None, 512, 2)
    assert budget is None and counts.sum() > 0
    low = budgets(src)[0]
    routed_b, counts_b, n_tok_b, sha_b, budget_b = moe.profile_neurons(m, None, 512, 2, low)
    assert budget_b == low and (n_tok_b, sha_b) == (n_tok, sha)
    assert np.array_equal(routed_b, routed) and np.array_equal(counts_b, counts)
    ctx, b = moe_budget.profile_context(m, 257, 2, low)
    assert b == low
    misses = []
    for _ in range(2):       # the second pass reads every expert again: the cache holds less than a layer's
        ctx.reset()
        ctx.decode(list(range(3, 259)), all_logits=True)
        st = ctx.cache_stats()
        misses.append(st["expert_misses"] - sum(misses))
    assert st["bytes_read"] > 0 and misses[1] >= misses[0] - N_LAYER > 0


def test_automatic_budget_when_the_file_does_not_fit(tmp_path_factory, tmp_path, monkeypatch):
    """No --memory-budget, and the process may hold less than the file needs: the profile streams within that
    limit (a note says so), and the output is the same."""
    src, want = source(tmp_path_factory)
    limit = budgets(src)[1]
    monkeypatch.setattr(devices, "memory_limit", lambda meminfo=None: limit)
    rep = convert(src, tmp_path / "auto.gguf", calib_tokens=256, progress=False, n_threads=2)
    assert rep.budget == limit
    assert open(rep.output, "rb").read() == want


def test_cli_memory_budget(tmp_path_factory, tmp_path):
    src, want = source(tmp_path_factory)
    b = f"{(budgets(src)[1] >> 20) + 64}M"     # room for what loading the CLI adds to the process's RSS
    res = cli("convert", src, "-o", tmp_path / "c.gguf", "--calib-tokens", "256", "-t", "2", "--memory-budget", b)
    assert res.code == 0, res.err
    assert "experts streamed within a" in res.out
    assert (tmp_path / "c.gguf").read_bytes() == want


@pytest.mark.parametrize("value,words", [("abc", "invalid memory size 'abc'"), ("0", "it must be positive"),
                                         ("-5M", "invalid memory size"),
                                         ("1M", "is below what this model needs")])
def test_cli_bad_budget_is_one_line(tmp_path_factory, tmp_path, value, words):
    src, _ = source(tmp_path_factory)
    res = cli("convert", src, "-o", tmp_path / "c.gguf", "--calib-tokens", "256", "--memory-budget", value)
    assert_error(res, 2, re.escape(words))
    assert not (tmp_path / "c.gguf").exists()


def test_cli_memory_budget_is_for_moe_files(tmp_path):
    src = write_model(tmp_path / "dense.gguf", wtype="Q4_1", n_embd=64, n_ff=128, n_layer=2)
    res = cli("convert", src, "-o", tmp_path / "c.gguf", "--memory-budget", "1G")
    assert_error(res, 2, "--memory-budget is for MoE files")


def test_automatic_budget_below_the_streamed_minimum_maps(tmp_path_factory, tmp_path, monkeypatch, capsys):
    """What the process may use is less than the file and less than the streamed engine's minimum: the profile maps
    the file (as before budgets: slow where it does not fit, but it runs), with a note; the output is the same."""
    src, want = source(tmp_path_factory)
    limit = budgets(src)[0] // 2
    monkeypatch.setattr(devices, "memory_limit", lambda meminfo=None: limit)
    rep = convert(src, tmp_path / "low.gguf", calib_tokens=256, progress=False, n_threads=2)
    assert rep.budget is None
    assert "too little to stream its experts" in capsys.readouterr().err
    assert open(rep.output, "rb").read() == want
