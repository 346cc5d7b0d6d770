"""test_stream_cache.py — streamed FFN bundles (csrc/cache/cache.c): a context serving its bundles from a resident hot
prefix and an LRU of cold cluster slots read by the flash I/O backends gives logits bit-identical to the mapped
run, for several keeps, cache sizes (a tiny cache that mostly misses, a big one that hits), cluster sizes, backends
and thread counts; its statistics add up; bad parameters and a failing read are refused with a message; streamed
bundles stay out of the page cache. The planner and the CLI flags: test_budget_plan.py."""
from __future__ import annotations

import os

import numpy as np
import pytest
from pagecache import cold_copy, resident_pages
from stream_files import TOKENS, ctx_for, files, run  # noqa: F401 (files: the fixture)

from pi2.engine import CContext, CModel, stream_sizes
from pi2.errors import EngineError, UnsupportedError
from pi2.model.loader import load_model
from pi2.runtime import ffn_rule


@pytest.mark.parametrize("name", ["q8", "f16", "i8"])
@pytest.mark.parametrize("keep", [0.25, 0.5, 1.0])
def test_streamed_equals_mapped(files, name, keep):
    want = run(ctx_for(files[name], keep, 1))
    m = load_model(files[name])
    n_ff, n_layer = m.config.n_ff, m.config.n_layer
    cases = [  # (cluster, slots beyond the minimum, hot neurons per layer, backend, threads)
        (64, 0, [0] * n_layer, "pread", 1),                       # tiny: one layer's clusters, no hot prefix
        (16, 0, [40 + 16 * i for i in range(n_layer)], "pread", 2),  # hot prefixes not on a cluster boundary
        (32, 1000, [64] * n_layer, "aio", 2),                     # big: every cluster stays
        (8, 3, [n_ff] * n_layer, "mmap", 1),                      # everything hot
    ]
    for cluster, extra, hot, io, threads in cases:
        min_slots = stream_sizes(CModel.from_model(m), cluster)["min_slots"]
        c = ctx_for(files[name], keep, threads, dict(cluster=cluster, n_slots=min_slots + extra, n_hot=hot, io=io))
        got = run(c)
        assert np.array_equal(got, want), (cluster, extra, io, threads)
        st = c.cache_stats()
        assert st["tokens"] == 11 and st["layer_loads"] == (0 if hot[0] == n_ff else 2 * n_layer)
        assert st["layer_loads_ahead"] == st["layer_loads"]   # every batch's region submitted before its FFN
        s = c.stream_stats()
        assert s["whole_layer_reads"] == st["layer_loads"] and s["whole_reads_ahead"] == (1.0 if s["whole_layer_reads"]
                                                                                           else 0.0)
        needed = st["hot"] + st["hits"] + st["misses"]
        assert needed > 0
        if hot[0] == n_ff:
            assert st["misses"] == st["hits"] == 0
        elif extra == 0 and hot[0] == 0:
            assert st["misses"] > st["hits"]        # one layer's worth of slots: every layer evicts the last
        elif extra >= 1000:
            assert st["hits"] > st["misses"]
        assert st["bytes_read"] >= st["misses"] * 4096 and st["reads"] >= st["misses"]


@pytest.mark.parametrize("keep", [0.25, 1.0])
def test_early_reads_equal_mapped(files, keep):
    """Clusters read before the layer's attention (n_early) give the same logits; the ones the token did not need
    are counted and reaped with the layer's reads; a count beyond the layer's cold clusters is capped."""
    want = run(ctx_for(files["q8"], keep, 1))
    m = load_model(files["q8"])
    n_layer = m.config.n_layer
    for cluster, extra, hot, early, io, threads in [(16, 0, [0] * n_layer, [2, 100], "pread", 2),
                                                    (64, 1000, [64] * n_layer, [5] * n_layer, "aio", 1),
                                                    (8, 0, [40] * n_layer, [3, 0], "pread", 1)]:
        min_slots = stream_sizes(CModel.from_model(m), cluster)["min_slots"]
        c = ctx_for(files["q8"], keep, threads, dict(cluster=cluster, n_slots=min_slots + extra, n_hot=hot, io=io,
                                                      n_early=early))
        assert np.array_equal(run(c), want), (cluster, extra, early)
        st = c.cache_stats()
        assert st["early_reads"] > 0 and 0 <= st["early_unused"] <= st["early_reads"]
        assert st["misses"] >= st["early_reads"] - st["early_unused"]
        if keep == 1.0:
            assert st["early_unused"] == 0
        if extra >= 1000:                    # every cluster stays cached: early reads only until it is
            assert st["hits"] > st["misses"]
        s = c.stream_stats()
        assert s["early_reads_per_token"] >= 0 and 0 <= s["early_unused"] <= 1


def test_early_read_failure_is_an_error_then_recovers(files, tmp_path):
    """A failing early read ends the token with a message; the context still decodes after the file is whole."""
    import shutil
    p = tmp_path / "cut.pi2.gguf"
    shutil.copy(files["q8"], p)
    whole = p.read_bytes()
    m = load_model(p)
    c = CContext(CModel.from_model(m), 32, 1)
    c.set_ffn(ffn_rule.choose_rule(m, 1.0))
    c.set_stream(cluster=64, n_slots=5, io="pread", n_early=[5] * m.config.n_layer)
    c.decode([TOKENS[0]])
    os.truncate(p, m.tensor(f"blk.{m.config.n_layer - 1}.ffn_bundle.weight").offset + 4096)
    with pytest.raises(EngineError, match="bundles"):
        for t in TOKENS[1:4]:
            c.decode([t])
    p.write_bytes(whole)
    ref = ctx_for(p, 1.0, 1)
    ref.decode([TOKENS[0]])
    c2 = ctx_for(p, 1.0, 1, dict(cluster=64, n_slots=5, io="pread", n_early=[5] * m.config.n_layer))
    c2.decode([TOKENS[0]])
    assert np.array_equal(c2.decode([TOKENS[1]], all_logits=True), ref.decode([TOKENS[1]], all_logits=True))
    c.decode([TOKENS[5]])        # the failed context is usable again (its KV cache holds what it holds)


@pytest.mark.parametrize("extra", [0, 1000])
def test_batch_read_ahead_failure_is_an_error_then_recovers(files, tmp_path, extra):
    """A batch whose regions are read ahead (during the layer's attention) on a file cut short: an error naming
    the bundles, no hang; once the file is whole the same context decodes batches equal to a fresh mapped
    context's."""
    import shutil
    p = tmp_path / "cut.pi2.gguf"
    shutil.copy(files["q8"], p)
    whole = p.read_bytes()
    m = load_model(p)
    min_slots = stream_sizes(CModel.from_model(m), 16)["min_slots"]
    c = ctx_for(p, 0.5, 2, dict(cluster=16, n_slots=min_slots + extra, io="aio"))
    os.truncate(p, m.tensor(f"blk.{m.config.n_layer - 1}.ffn_bundle.weight").offset + 4096)
    with pytest.raises(EngineError, match="bundles"):
        c.decode(TOKENS[:8])
    p.write_bytes(whole)
    c.reset()
    ref = ctx_for(p, 0.5, 1)
    assert np.array_equal(c.decode(TOKENS[:8], all_logits=True), ref.decode(TOKENS[:8], all_logits=True))
    assert np.array_equal(c.decode(TOKENS[8:12], all_logits=True), ref.decode(TOKENS[8:12], all_logits=True))


def test_sizes_and_refusals(files, tmp_path):
    m = load_model(files["q8"])
    cm = CModel.from_model(m)
    sz = stream_sizes(cm, 64, 0, 100)
    assert sz["min_slots"] == 5 and sz["slot_bytes"] % 4096 == 0 and sz["bundle_bytes"] % 32 == 0
    assert sz["hot_bytes"] == (-(-64 * sz["bundle_bytes"] // 4096)) * 4096    # 100 neurons -> one cluster of 64
    c = CContext(cm, 32, 1)
    with pytest.raises(EngineError, match="at least 5"):
        c.set_stream(cluster=64, n_slots=4)
    with pytest.raises(EngineError, match="cluster size 24"):
        c.set_stream(cluster=24, n_slots=100)
    g = load_model(files["gud"])
    with pytest.raises(UnsupportedError, match="bundle-ud"):
        CContext(CModel.from_model(g), 32, 1).set_stream(cluster=64, n_slots=100)


def test_failed_read_is_an_error(files, tmp_path):
    """The file shrinks under a streamed context: the read of a cold cluster fails with a message, no wrong answer."""
    import shutil
    p = tmp_path / "cut.pi2.gguf"
    shutil.copy(files["q8"], p)
    m = load_model(p)
    c = CContext(CModel.from_model(m), 32, 1)
    c.set_ffn(ffn_rule.choose_rule(m, 1.0))
    c.set_stream(cluster=64, n_slots=5, io="pread")
    os.truncate(p, m.tensor(f"blk.{m.config.n_layer - 1}.ffn_bundle.weight").offset + 4096)
    with pytest.raises(EngineError, match="bundles"):
        for t in TOKENS[:4]:
            c.decode([t])


def test_streamed_bundles_stay_out_of_the_page_cache(files, tmp_path):
    """A streamed context reads its bundles with O_DIRECT and never through the mapping: after decoding, the pages
    wholly inside the bundle regions are not in the page cache (the mapped run puts them there)."""
    p, m, ranges = cold_copy(files["q8"], tmp_path, "ffn_bundle")
    assert all(e > s for s, e in ranges)
    c = CContext(CModel.from_model(m), 32, 1)
    c.set_ffn(ffn_rule.choose_rule(m, 1.0))
    c.set_stream(cluster=64, n_slots=5, io="pread")      # drops the file's unmapped pages (the copy's)
    for t in TOKENS[:4]:
        c.decode([t])
    c.decode(TOKENS[4:8])                                  # a batch: whole layers read, still not mapped
    assert c.cache_stats()["misses"] > 0
    assert sum(resident_pages(p, s, e) for s, e in ranges) == 0
    d = CContext(CModel.from_model(load_model(p)), 32, 1)  # the mapped run reads them through the mapping
    d.set_ffn(ffn_rule.choose_rule(m, 1.0))
    d.decode(TOKENS[:4])
    assert sum(resident_pages(p, s, e) for s, e in ranges) > 0
