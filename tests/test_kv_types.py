"""test_kv_types.py — the 4- and 5-bit K cache types (-ctk q4_0 | q4_1 | q5_0 | q5_1): the reference's keys
(pi2/reference/kv_cache.py BlockKeys) against the float product they approximate, the C engine (csrc/kv_quant.c)
against the reference bit for bit (prompt batches, single tokens, threads, the context shift), the bytes a context
counts, `pi2 run` and `pi2 bench -ctk`, and llama.cpp's own outputs with -ctk TYPE -fa off on SmolLM2 and
Qwen2.5-0.5B (tests/data/kvcache-llamacpp-TYPE.json, scripts/kv_goldens.py)."""
import json
from pathlib import Path

import numpy as np
import pytest

from clirun import cli
from test_kv_cache import PROMPT, model   # the same tiny models (rotated keys)
from pi2.engine import CContext, ctx_sizes
from pi2.reference import kv_cache
from pi2.reference.forward import ReferenceContext
from pi2.reference.quants import dequantize, quantize_act

TYPES = {"q4_0": (2, 18), "q4_1": (3, 20), "q5_0": (6, 22), "q5_1": (7, 24)}   # ggml id, bytes per 32 keys
DATA = Path(__file__).parent / "data"
GOLDEN = {t: json.loads((DATA / f"kvcache-llamacpp-{t}.json").read_text()) for t in TYPES
          if (DATA / f"kvcache-llamacpp-{t}.json").exists()}


@pytest.mark.parametrize("name", sorted(TYPES))
def test_reference_keys_approximate_the_float_product(name):
    qtype = TYPES[name][0]
    rng = np.random.default_rng(qtype)
    keys = kv_cache.make_keys(qtype, 1, 16, 2, 64)
    k = rng.standard_normal((16, 2, 64)).astype(np.float32)
    keys.store(0, slice(0, 16), k)
    assert keys.raw.shape == (1, 16, 2, 2 * TYPES[name][1]) and np.abs(keys.values(0, slice(0, 16)) - k).max() < 0.5
    q = rng.standard_normal((2, 3, 64)).astype(np.float32)
    got = keys.kq(0, q, 16)
    vals = keys.values(0, slice(0, 16))
    want = np.einsum("hmd,nhd->hmn", q.astype(np.float64), vals.astype(np.float64))
    assert got.shape == (2, 3, 16) and np.allclose(got, want, rtol=0, atol=0.3)
    raw = keys.raw[0, :, 0]
    assert np.array_equal(dequantize(raw, qtype, 64), vals[:, 0])
    assert quantize_act(q[0], kv_cache._DOT[qtype][1])[0].shape == (3, 2)


@pytest.mark.parametrize("name", sorted(TYPES))
@pytest.mark.parametrize("arch, threads", [("llama", 1), ("llama", 2), ("gemma3", 2)])
def test_c_equals_reference_bit_for_bit(tmp_path_factory, name, arch, threads):
    m, cm = model(tmp_path_factory, arch)
    qtype = TYPES[name][0]
    ref, c = ReferenceContext(m, 64, type_k=qtype), CContext(cm, 64, threads, type_k=qtype)
    a, b = ref.decode(PROMPT, all_logits=True), c.decode(PROMPT, all_logits=True)
    assert np.array_equal(a, b)
    q8 = CContext(cm, 64, threads, type_k=8)
    assert not np.array_equal(b[-1], q8.decode(PROMPT))       # not the Q8_0 cache
    for t in (5, 9, 13, 21):
        assert np.array_equal(ref.decode([t]), c.decode([t]))


def test_kv_bytes_follow_the_type(tmp_path_factory):
    m, cm = model(tmp_path_factory, "llama")
    cfg = m.config
    kd, vd = cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    for name, (qtype, size) in TYPES.items():
        kv, _ = ctx_sizes(cm, 256, 1, type_k=qtype)
        assert kv == cfg.n_layer * 256 * (kd // 32 * size + vd * 2), name


def test_run_and_bench_take_the_types(tmp_path_factory):
    m, _ = model(tmp_path_factory, "llama")
    for name in TYPES:
        res = cli("run", m.path, "-p", "hello", "-n", "4", "--temp", "0", "-ctk", name, "--engine", "c")
        ref = cli("run", m.path, "-p", "hello", "-n", "4", "--temp", "0", "-ctk", name, "--engine", "reference")
        assert res.code == 0 and ref.code == 0 and res.out == ref.out, name
    res = cli("bench", m.path, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-ctk", "q4_0,q5_1", "-o", "jsonl")
    assert res.code == 0, res.err
    assert [json.loads(line)["type_k"] for line in res.out.splitlines()] == ["q4_0", "q5_1"]


def test_goldens_cover_every_type():
    assert sorted(GOLDEN) == sorted(TYPES)
    for name, g in GOLDEN.items():
        prov = g["provenance"]
        assert prov["llama.cpp"].startswith("0c1e570") and f"-ctk {name} -fa off" in prov["greedy"]


CASES = [(t, k) for t in sorted(GOLDEN) for k in sorted(GOLDEN[t]["models"])]


@pytest.mark.model
@pytest.mark.parametrize("name, key", CASES)
def test_greedy_text_is_llama_cpps(name, key):
    from conftest import model_file
    for case in GOLDEN[name]["models"][key]["greedy"]:
        res = cli("run", model_file(key), "-p", case["prompt"], "-n", "48", "--temp", "0", "-t", "1", "-c", "256",
                  "-ctk", name, timeout=300)
        assert res.code == 0, res.err
        assert res.out.rstrip("\n") == case["text"].removesuffix(" [end of text]")   # llama-completion's EOS mark


@pytest.mark.model
@pytest.mark.parametrize("name, key", CASES)
def test_perplexity_is_llama_cpps(name, key):
    from conftest import model_file
    res = cli("perplexity", model_file(key), "-f", DATA / "moe-text.txt", "-c", "128", "--chunks", "3", "-t", "1",
              "-ctk", name, timeout=300)
    assert res.code == 0, res.err
    want = GOLDEN[name]["models"][key]["ppl_text"]
    assert "".join(f"[{i + 1}]{v}," for i, v in enumerate(want)) in res.out + res.err
