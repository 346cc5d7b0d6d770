"""test_flash_attn.py — flash attention (-fa on) and the quantized V cache (-ctv): the C engine (csrc/flash_attn.c)
against pi2/reference/flash_attn.py bit for bit (one-row batches and decodes, tiled batches of 64 tokens or more,
sliding windows, F16 / Q8_0 / 4- and 5-bit K and V, context shifts, several threads, multi-context steps), the -fa
and -ctv options of run, perplexity, bench, plan and the API, the memory counted, and llama.cpp's own outputs with
-fa on (tests/data/fa-llamacpp-*.json: greedy text and perplexity figures on SmolLM2 and Qwen2.5-0.5B)."""
import json
from pathlib import Path

import numpy as np
import pytest

import cinternal
from clirun import cli
from pi2.engine import CContext, ctx_sizes
from pi2.engine.multi import decode_multi
from pi2.errors import EngineError, UsageError
from pi2.reference.forward import ReferenceContext
from pi2.runtime.config import RunConfig
from test_kv_cache import PROMPT, model   # the same tiny models (rotated keys)

F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 = 1, 8, 2, 3, 6, 7
LONG = [(37 * i + 11) % 500 for i in range(70)]       # >= 64 tokens: ggml's tiled loop
DATA = Path(__file__).parent / "data"
GOLDENS = {f"{k}-{v}": json.loads((DATA / f"fa-llamacpp-{k}-{v}.json").read_text())
           for k, v in (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q4_1", "q4_1"), ("q5_0", "q5_0"),
                        ("q5_1", "q5_1"))}
GREEDY = ("f16-f16", "q8_0-q8_0")     # greedy text for these; perplexity figures for every kind


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("prompt", [PROMPT, LONG], ids=["one-row", "tiled"])
def test_c_equals_reference_bit_for_bit(tmp_path_factory, arch, threads, prompt):
    m, cm = model(tmp_path_factory, arch)
    ref = ReferenceContext(m, 128, flash_attn=True)
    c = CContext(cm, 128, threads, flash_attn=True)
    a, b = ref.decode(prompt, all_logits=True), c.decode(prompt, all_logits=True)
    assert np.array_equal(a, b)
    off = CContext(cm, 128, threads)
    assert not np.array_equal(b, off.decode(prompt, all_logits=True))    # flash attention's own numbers
    for t in (5, 9, 13):
        assert np.array_equal(ref.decode([t]), c.decode([t]))
    assert np.array_equal(ref.decode(PROMPT[:7], all_logits=True), c.decode(PROMPT[:7], all_logits=True))


@pytest.mark.parametrize("type_k,type_v", [(Q8_0, Q8_0), (F16, Q8_0), (Q8_0, F16), (Q4_0, Q4_0), (Q4_1, Q4_1),
                                           (Q5_0, Q5_0), (Q5_1, Q5_1)])
def test_quantized_values_c_equals_reference(tmp_path_factory, type_k, type_v):
    m, cm = model(tmp_path_factory, "llama")
    ref = ReferenceContext(m, 128, flash_attn=True, type_k=type_k, type_v=type_v)
    c = CContext(cm, 128, 2, flash_attn=True, type_k=type_k, type_v=type_v)
    for prompt in (LONG, PROMPT):
        assert np.array_equal(ref.decode(prompt, all_logits=True), c.decode(prompt, all_logits=True))
    for t in (5, 9):
        assert np.array_equal(ref.decode([t]), c.decode([t]))


def test_gemma_window_with_quantized_values(tmp_path_factory):
    m, cm = model(tmp_path_factory, "gemma3")
    ref = ReferenceContext(m, 128, flash_attn=True, type_k=Q8_0, type_v=Q8_0)
    c = CContext(cm, 128, 1, flash_attn=True, type_k=Q8_0, type_v=Q8_0)
    assert np.array_equal(ref.decode(LONG, all_logits=True), c.decode(LONG, all_logits=True))
    assert np.array_equal(ref.decode([3]), c.decode([3]))


@pytest.mark.parametrize("type_v", [F16, Q8_0, Q4_1])
def test_context_shift_with_flash_attention(tmp_path_factory, type_v):
    m, cm = model(tmp_path_factory, "llama")
    ref = ReferenceContext(m, 24, ctx_shift=True, n_keep=3, flash_attn=True, type_k=Q8_0 if type_v != F16 else F16,
                           type_v=type_v)
    c = CContext(cm, 24, 2, ctx_shift=True, n_keep=3, flash_attn=True, type_k=Q8_0 if type_v != F16 else F16,
                 type_v=type_v)
    assert np.array_equal(ref.decode(PROMPT), c.decode(PROMPT))
    for i in range(16):
        t = (7 * i + 1) % 400
        assert np.array_equal(ref.decode([t]), c.decode([t])), f"token {i}"
    assert ref.n_past == c.n_past < 24


def test_multi_context_step_with_flash_attention(tmp_path_factory):
    m, cm = model(tmp_path_factory, "qwen2")
    ctxs = [CContext(cm, 64, 2, flash_attn=True, type_v=Q8_0) for _ in range(3)]
    alone = [CContext(cm, 64, 2, flash_attn=True, type_v=Q8_0) for _ in range(3)]
    for i, (c, d) in enumerate(zip(ctxs, alone)):
        c.decode(PROMPT[: 5 + i])
        d.decode(PROMPT[: 5 + i])
    rows = decode_multi(ctxs, [11, 12, 13])
    for r, d, t in zip(rows, alone, [11, 12, 13]):
        assert np.array_equal(r, d.decode([t]))


def test_values_memory_and_refusals(tmp_path_factory):
    m, cm = model(tmp_path_factory, "llama")
    cfg = m.config
    kd, vd = cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    f16, s16 = ctx_sizes(cm, 256, 1)
    q8, s8 = ctx_sizes(cm, 256, 1, type_k=Q8_0, type_v=Q8_0)
    ld = cinternal.lib.pi2_kv_k_ld(256)                        # the F16 keys' rows (test_kv_leading_dim.py)
    assert f16 == cfg.n_layer * (kd * ld + vd * 256) * 2       # F16: 2 bytes per value (IEEE halves)
    assert q8 == cfg.n_layer * 256 * (kd + vd) // 32 * 34 and s16 == s8
    with pytest.raises(EngineError, match="type_v 8"):
        CContext(cm, 64, 1, type_v=Q8_0)                     # a quantized V without flash attention
    with pytest.raises(UsageError, match="needs flash attention"):
        RunConfig(cache_type_v="q4_0", flash_attn="off")
    with pytest.raises(UsageError, match="expected on, off or auto"):
        RunConfig(flash_attn="maybe")
    assert not RunConfig().flash and RunConfig(flash_attn="1").flash and RunConfig(cache_type_v="q8_0").flash
    assert not RunConfig(flash_attn="on", cache_type_v="f16").type_v != F16


def test_cli_and_api_take_fa(tmp_path_factory):
    import pi2
    m, _ = model(tmp_path_factory, "llama")
    args = ("run", m.path, "-p", "hello there", "-n", "4", "--temp", "0")
    on = cli(*args, "-fa", "on", "-ctv", "q8_0", "--engine", "c")
    ref = cli(*args, "-fa", "on", "-ctv", "q8_0", "--engine", "reference")
    auto = cli(*args, "-ctv", "q8_0", "--engine", "c")
    assert on.code == ref.code == auto.code == 0 and on.out == ref.out == auto.out
    bad = cli(*args, "-fa", "off", "-ctv", "q8_0")
    assert bad.code == 2 and "needs flash attention" in bad.err and "Traceback" not in bad.err
    assert cli(*args, "-fa", "sometimes").code == 2
    api = pi2.load(m.path, flash_attn="on", cache_type_v="q8_0", engine="c")
    assert api.run.flash
    res = cli("bench", m.path, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-fa", "0,1", "-o", "json", timeout=120)
    assert res.code == 0, res.err
    rows = json.loads(res.out)
    assert [(r["flash_attn"], r["n_prompt"]) for r in rows] == [(0, 8), (0, 0), (1, 8), (1, 0)]
    md = cli("bench", m.path, "-p", "0", "-n", "2", "-r", "1", "-t", "1", "-fa", "1", "-ctv", "q8_0", timeout=120)
    assert md.code == 0 and "|  fa |" in md.out and "|   1 |" in md.out, md.out


def test_golden_provenance():
    for g in GOLDENS.values():
        prov = g["provenance"]
        assert prov["llama.cpp"].startswith("0c1e570") and "-fa on" in prov["greedy"] and "-ctv" in prov["greedy"]


CASES = [(k, key) for k in sorted(GOLDENS) for key in sorted(GOLDENS[k]["models"])]
GREEDY_CASES = [(k, key) for k, key in CASES if k in GREEDY]


def _flags(kind: str) -> list:
    k, v = kind.split("-")
    return ["-fa", "on", "-ctk", k, "-ctv", v]


@pytest.mark.model
@pytest.mark.parametrize("kind,key", GREEDY_CASES)
def test_greedy_text_is_llama_cpps(kind, key):
    """`pi2 run -fa on` writes llama-completion's greedy text with -fa on (F16, and Q8_0 K and V)."""
    from conftest import model_file
    for case in GOLDENS[kind]["models"][key]["greedy"]:
        res = cli("run", model_file(key), "-p", case["prompt"], "-n", "48", "--temp", "0", "-t", "1", "-c", "256",
                  *_flags(kind), timeout=300)
        assert res.code == 0, res.err
        assert res.out.rstrip("\n") == case["text"]


@pytest.mark.model
@pytest.mark.parametrize("kind,key", CASES)
def test_perplexity_is_llama_cpps(kind, key):
    """`pi2 perplexity -fa on` prints llama-perplexity's chunk figures (-c 128: batches of 128, the tiled loop)."""
    from conftest import model_file
    text = DATA / "moe-text.txt"
    res = cli("perplexity", model_file(key), "-f", text, "-c", "128", "--chunks", "3", "-t", "1", *_flags(kind),
              timeout=300)
    assert res.code == 0, res.err
    want = GOLDENS[kind]["models"][key]["ppl_text"]
    assert "".join(f"[{i + 1}]{v}," for i, v in enumerate(want)) in res.out + res.err
