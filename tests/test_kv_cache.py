"""test_kv_cache.py — the K cache types (-ctk f16 | q8_0): pi2/reference/kv_cache.py against a plain Hadamard
product, the C engine (csrc/kv_quant.c) against the reference bit for bit (prompt batches, single tokens, the context
shift, several threads, multi-context steps), the memory a context counts, the errors, `pi2 bench -ctk`, and
llama.cpp's own outputs with -ctk q8_0 -fa off on SmolLM2 and Qwen2.5-0.5B (tests/data/kvcache-llamacpp.json)."""
import json
from pathlib import Path

import numpy as np
import pytest

import cinternal
from clirun import cli
from fixtures import write_model
from pi2.engine import CContext, CModel, ctx_sizes
from pi2.engine.multi import decode_multi
from pi2.errors import EngineError, UnsupportedError, UsageError
from pi2.model.loader import load_model
from pi2.reference import kv_cache
from pi2.reference.forward import ReferenceContext
from pi2.runtime.config import RunConfig, cache_type

F16, Q8_0 = 1, 8
PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
GOLDEN = json.loads((Path(__file__).parent / "data" / "kvcache-llamacpp.json").read_text())
_models = {}


def model(tmp_path_factory, arch):
    """A tiny model whose heads are 64 (llama, qwen2) or 128 (gemma3) values long: Q8_0 keys are rotated."""
    if arch not in _models:
        path = tmp_path_factory.mktemp("kv") / f"{arch}.gguf"
        write_model(path, arch=arch, wtype="Q8_0", n_embd=256, n_head=4, head_dim=128 if arch == "gemma3" else 64,
                    n_layer=6 if arch == "gemma3" else 2, sliding_window=5)
        m = load_model(path)
        _models[arch] = (m, CModel.from_model(m))
    return _models[arch]


def test_rotation_is_the_orthonormal_hadamard_product():
    rng = np.random.default_rng(0)
    for n in (64, 128, 256):
        h = np.array([[1.0]])
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        x = rng.standard_normal((5, 2 * n)).astype(np.float32)
        want = (x.astype(np.float64).reshape(5, 2, n) @ h.T / np.sqrt(n)).reshape(5, 2 * n)
        y = kv_cache.fwht(x, n)
        assert y.dtype == np.float32 and np.allclose(y, want, rtol=0, atol=1e-5)
        assert np.allclose(kv_cache.fwht(y, n), x, atol=1e-5)      # its own inverse
    assert [kv_cache.rot_size(d) for d in (64, 128, 192, 256, 80, 32)] == [64, 128, 64, 256, 0, 0]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("threads", [1, 2])
def test_c_equals_reference_bit_for_bit(tmp_path_factory, arch, threads):
    m, cm = model(tmp_path_factory, arch)
    ref, c = ReferenceContext(m, 64, type_k=Q8_0), CContext(cm, 64, threads, type_k=Q8_0)
    f16 = CContext(cm, 64, threads)
    a, b = ref.decode(PROMPT, all_logits=True), c.decode(PROMPT, all_logits=True)
    assert np.array_equal(a, b)
    assert not np.array_equal(b[-1], f16.decode(PROMPT))        # Q8_0 keys are not the F16 cache
    for t in (5, 9, 13, 21):
        assert np.array_equal(ref.decode([t]), c.decode([t]))


@pytest.mark.parametrize("arch,qtype", [("llama", Q8_0), ("gemma3", Q8_0), ("llama", 2), ("llama", 7)])
def test_context_shift_with_quantized_keys(tmp_path_factory, arch, qtype):
    """A full context shifts as llama.cpp does on a quantized cache (dequantize, rotate back, RoPE, rotate, quantize):
    C equals the reference after several shifts (Q8_0, and Q4_0 / Q5_1 keys)."""
    m, cm = model(tmp_path_factory, arch)
    ref = ReferenceContext(m, 24, ctx_shift=True, n_keep=3, type_k=qtype)
    c = CContext(cm, 24, 2, ctx_shift=True, n_keep=3, type_k=qtype)
    assert np.array_equal(ref.decode(PROMPT), c.decode(PROMPT))
    for i in range(20):
        t = (7 * i + 1) % 400
        assert np.array_equal(ref.decode([t]), c.decode([t])), f"token {i}"
    assert ref.n_past == c.n_past < 24


def test_multi_context_step_with_quantized_keys(tmp_path_factory):
    m, cm = model(tmp_path_factory, "qwen2")
    ctxs = [CContext(cm, 64, 2, type_k=Q8_0) for _ in range(3)]
    alone = [CContext(cm, 64, 2, type_k=Q8_0) for _ in range(3)]
    for i, (c, d) in enumerate(zip(ctxs, alone)):
        c.decode(PROMPT[: 5 + i])
        d.decode(PROMPT[: 5 + i])
    rows = decode_multi(ctxs, [11, 12, 13])
    for r, d, t in zip(rows, alone, [11, 12, 13]):
        assert np.array_equal(r, d.decode([t]))
    with pytest.raises(EngineError, match="different K cache types"):
        decode_multi([CContext(cm, 64, 1, type_k=Q8_0), CContext(cm, 64, 1)], [1, 2])


def test_kv_bytes_follow_the_type(tmp_path_factory):
    m, cm = model(tmp_path_factory, "llama")
    cfg = m.config
    kd, vd = cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    f16, s16 = ctx_sizes(cm, 256, 1, type_k=F16)
    q8, s8 = ctx_sizes(cm, 256, 1, type_k=Q8_0)
    ld = cinternal.lib.pi2_kv_k_ld(256)                       # the F16 keys' rows (test_kv_leading_dim.py)
    assert f16 == cfg.n_layer * (kd * ld + vd * 256) * 2      # F16 values as IEEE halves, 2 bytes each
    assert q8 == cfg.n_layer * 256 * (kd // 32 * 34 + vd * 2)
    assert s16 == s8


def test_types_pi2_does_not_compute_are_refused(tmp_path_factory, tmp_path):
    assert cache_type("-ctk", "Q8_0") == Q8_0 and cache_type("-ctv", "f16") == F16
    with pytest.raises(UsageError, match="needs flash attention"):
        RunConfig(cache_type_v="q8_0", flash_attn="off")
    with pytest.raises(UsageError, match="known to llama.cpp but not computed"):
        RunConfig(cache_type_k="iq4_nl")
    path = tmp_path / "small-heads.gguf"
    write_model(path, head_dim=16)
    with pytest.raises(UnsupportedError, match="does not divide head_dim 16"):
        CContext(CModel.from_model(load_model(path)), 32, 1, type_k=Q8_0)
    for flags, text in ((["-ctv", "q8_0", "-fa", "off"], "needs flash attention"), (["-ctk", "bf16"], "not computed by pi2"),
                        (["-ctk", "nope"], "not a cache type")):
        res = cli("run", path, "-p", "hi", "-n", "1", *flags)
        assert res.code == 2 and text in res.err and "Traceback" not in res.err
    res = cli("run", path, "-p", "hi", "-n", "1", "-ctk", "q8_0")
    assert res.code == 1 and "does not divide head_dim 16" in res.err


def test_run_and_bench_take_ctk(tmp_path_factory):
    m, _ = model(tmp_path_factory, "llama")
    res = cli("run", m.path, "-p", "hello", "-n", "4", "--temp", "0", "-ctk", "q8_0", "--engine", "c")
    ref = cli("run", m.path, "-p", "hello", "-n", "4", "--temp", "0", "-ctk", "q8_0", "--engine", "reference")
    assert res.code == 0 and ref.code == 0 and res.out == ref.out
    res = cli("bench", m.path, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-ctk", "f16,q8_0", "-o", "json", timeout=120)
    assert res.code == 0, res.err
    rows = json.loads(res.out)
    assert [(r["type_k"], r["type_v"], r["n_prompt"]) for r in rows] == \
        [("f16", "f16", 8), ("f16", "f16", 0), ("q8_0", "f16", 8), ("q8_0", "f16", 0)]
    md = cli("bench", m.path, "-p", "0", "-n", "2", "-r", "1", "-t", "1", "-ctk", "q8_0", timeout=120)
    assert md.code == 0 and "| type_k |" in md.out and "|   q8_0 |" in md.out


def test_golden_provenance():
    prov = GOLDEN["provenance"]
    assert prov["llama.cpp"].startswith("0c1e570") and "-ctk q8_0 -fa off" in prov["greedy"]


@pytest.mark.model
@pytest.mark.parametrize("key", sorted(GOLDEN["models"]))
def test_greedy_text_is_llama_cpps(key):
    """`pi2 run -ctk q8_0` writes llama-completion's greedy text with -ctk q8_0 -fa off."""
    from conftest import model_file
    for case in GOLDEN["models"][key]["greedy"]:
        res = cli("run", model_file(key), "-p", case["prompt"], "-n", "48", "--temp", "0", "-t", "1", "-c", "256",
                  "-ctk", "q8_0", timeout=300)
        assert res.code == 0, res.err
        assert res.out.rstrip("\n") == case["text"]


@pytest.mark.model
@pytest.mark.parametrize("key", sorted(GOLDEN["models"]))
def test_perplexity_is_llama_cpps(key):
    """`pi2 perplexity -ctk q8_0` prints llama-perplexity's chunk figures (-c 128, -ctk q8_0 -fa off)."""
    from conftest import model_file
    text = Path(__file__).parent / "data" / "moe-text.txt"
    res = cli("perplexity", model_file(key), "-f", text, "-c", "128", "--chunks", "3", "-t", "1", "-ctk", "q8_0",
              timeout=300)
    assert res.code == 0, res.err
    want = GOLDEN["models"][key]["ppl_text"]
    assert "".join(f"[{i + 1}]{v}," for i, v in enumerate(want)) in res.out + res.err
