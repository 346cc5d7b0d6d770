"""test_moe_c.py — the C engine on the Mixture-of-Experts family (csrc/ffn/moe.c, moe_mm.c, kernels/ggml_order.c)
against the numpy reference (pi2/reference/moe.py) and llama.cpp's figures (tests/data/moe-oracle.json).

Checks, on the synthetic files of tests/moe_files.py (every architecture in F32, F16, Q8_0 and Q4_K_M): the logits
of a prompt batch (every row) and of single tokens continuing the cache equal the reference's bit for bit at 1 and
2 threads; a prompt whose logits are only the last row's (the last layer's FFN on that row alone); llama-perplexity's
rows (decode_from); the teacher-forced logits equal llama.cpp's (sha256), its perplexity to the printed digits and
its greedy tokens; the CLI runs MoE files on C by default; bad descriptors are refused.
"""
import hashlib
import json
import platform

import numpy as np
import pytest

from conftest import DATA
from moe_files import ARCHS, WTYPES, loaded_moe, write_moe
from pi2.engine import CContext, CModel
from pi2.model.loader import load_model
from pi2.reference.moe import MoEContext

ORACLE = json.loads((DATA / "moe-oracle.json").read_text())
TEXT = (DATA / "moe-text.txt").read_text()
PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
_files: dict = {}


def loaded(tmp_path_factory, arch, wtype):
    return loaded_moe(tmp_path_factory, _files, arch, wtype)


def first_diff(ref, c, tokens, **kw):
    """The first traced checkpoint where the C engine differs from the reference, for the failure message."""
    seen_r, seen_c = {}, {}
    ref.trace = lambda name, il, x: seen_r.setdefault((name, il), np.asarray(x, np.float32).reshape(-1))
    c.set_trace(lambda name, il, x: seen_c.setdefault((name, il), np.asarray(x, np.float32).reshape(-1).copy()))
    ref.reset()
    c.reset()
    ref.decode(tokens, **kw)
    c.decode(tokens, **kw)
    for key, a in seen_r.items():
        if key in seen_c and (a.shape != seen_c[key].shape or not np.array_equal(a, seen_c[key])):
            return key
    return None


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_reference(tmp_path_factory, arch, wtype):
    _, m, cm = loaded(tmp_path_factory, arch, wtype)
    ref = MoEContext(m, 64)
    want = ref.decode(PROMPT, all_logits=True)
    steps = [ref.decode([t]) for t in (5, 300, 17)]
    for threads in (1, 2):
        c = CContext(cm, 64, n_threads=threads)
        got = c.decode(PROMPT, all_logits=True)
        if not np.array_equal(got, want):
            pytest.fail(f"{arch} {wtype} -t {threads}: prompt logits differ; first checkpoint: "
                        f"{first_diff(MoEContext(m, 64), CContext(cm, 64, n_threads=threads), PROMPT, all_logits=True)}")
        for t, w in zip((5, 300, 17), steps):
            assert np.array_equal(c.decode([t]), w), f"{arch} {wtype} -t {threads}: token {t}"


@pytest.mark.parametrize("arch", ARCHS)
def test_last_row_and_perplexity_rows(tmp_path_factory, arch):
    """A prompt with only the last row's logits, and llama-perplexity's rows (first..): the last layer's FFN runs
    on those rows alone in both engines (Q4_K_M: Q6_K experts switch kernels at 8 rows)."""
    _, m, cm = loaded(tmp_path_factory, arch, "Q4_K_M")
    ref, c = MoEContext(m, 64), CContext(cm, 64, n_threads=2)
    assert np.array_equal(c.decode(PROMPT), ref.decode(PROMPT))
    assert np.array_equal(c.decode_from(PROMPT, 9), ref.decode_from(PROMPT, 9))


def test_batches_split_by_n_batch_equal_one_batch(tmp_path_factory):
    _, m, cm = loaded(tmp_path_factory, "qwen3moe", "Q8_0")
    a = CContext(cm, 64, n_threads=2).decode(PROMPT, all_logits=True)
    b = CContext(cm, 64, n_threads=2, n_batch=7).decode(PROMPT, all_logits=True)
    c = CContext(cm, 64, n_threads=1, n_batch=7).decode_from(PROMPT, 12)
    ref = MoEContext(m, 64)
    rows = [ref.decode(PROMPT[:7], all_logits=True), ref.decode(PROMPT[7:14], all_logits=True),
            ref.decode(PROMPT[14:], all_logits=True)]
    assert np.array_equal(b, np.concatenate(rows))      # each step of n_batch tokens is its own batch
    assert np.array_equal(c, b[12:])
    assert a.shape == b.shape


@pytest.mark.slow
@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_against_llama_cpp(tmp_path_factory, arch, wtype):
    rec = ORACLE["files"][f"{arch}.{wtype}"]
    path, m, cm = loaded(tmp_path_factory, arch, wtype)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == rec["sha256"]
    c = CContext(cm, 256, n_threads=2)
    g0 = rec["greedy"][0]
    logits = c.decode(g0["prompt_ids"], all_logits=True)
    assert hashlib.sha256(np.ascontiguousarray(logits, np.float32).tobytes()).hexdigest() == rec["logits_sha256"]

    from pi2.runtime.perplexity import perplexity
    tokens = m.tokenizer.encode(TEXT, add_special=None, parse_special=False)
    res = perplexity(lambda chunk: c.decode_from(chunk, len(chunk) // 2), tokens, ORACLE["n_ctx"],
                     n_chunks=ORACLE["chunks"], bos_id=m.tokenizer.bos_id, add_bos=m.tokenizer.add_bos)
    assert [f"{p:.4f}" for p in res.chunk_ppls] == rec["perplexity"]["chunks"]
    assert (f"{res.ppl:.4f}", f"{res.stderr:.5f}") == (rec["perplexity"]["ppl"], rec["perplexity"]["stderr"])
    for g in rec["greedy"]:
        n = min(10, len(g["ids"]))
        c.reset()
        lg, got = c.decode(g["prompt_ids"]), []
        for _ in range(n):
            got.append(int(np.argmax(lg)))
            lg = c.decode([got[-1]])
        assert got == g["ids"][:n], g["prompt"]


@pytest.mark.parametrize("arch", ["qwen3moe", "smallthinker"])
def test_q4_0_experts_equal_reference(tmp_path, monkeypatch, arch):
    """Q4_0 experts and attention (the benchmark file's experts): the repacked GEMV's order, batch and decode, with
    the experts in the file's layout and copied into the x8 layout."""
    import moe_files
    plain = moe_files.quantized_type

    def q4_0(wtype, names, shapes, n_layer, n_expert):
        t = plain("F32", names, shapes, n_layer, n_expert)
        return {n: "Q4_0" if ("_exps" in n or "attn_" in n) and n.endswith("weight") and len(shapes[n]) > 1 else v
                for n, v in t.items()}
    monkeypatch.setattr(moe_files, "quantized_type", q4_0)
    m = load_model(write_moe(tmp_path / f"{arch}.Q4_0.gguf", arch, "F32"))
    ref = MoEContext(m, 64)
    want = ref.decode(PROMPT, all_logits=True)
    step = ref.decode([5])
    packed = CModel.from_model(m)
    n_packed = packed.repack(ffn=True)      # the experts in the x8 layout (ffn/moe_pack.c), where x86 kernels exist
    assert n_packed > 0 or platform.machine() not in ("x86_64", "AMD64")
    for cm in (CModel.from_model(m), packed):
        for threads in (1, 2):
            c = CContext(cm, 64, n_threads=threads)
            assert np.array_equal(c.decode(PROMPT, all_logits=True), want)
            assert np.array_equal(c.decode([5]), step)


@pytest.mark.parametrize("arch, wtype", [("qwen3moe", "Q4_K_M"), ("olmoe", "Q4_K_M"), ("smallthinker", "Q4_K_M"),
                                         ("qwen3moe", "Q8_0")])
def test_packed_k_experts_equal_reference(tmp_path, arch, wtype):
    """Q4_K_M experts (gate and up Q4_K, down Q4_K or Q6_K by layer) and Q8_0 experts copied into the x8 layout
    (ffn/moe_pack.c): the packed GEMV equals the reference, batch and decode, -t 1 and -t 2; a context on the
    reference table (not ggml's float order for every type) reads the packed groups unpacked, and one on the base
    table runs its AVX2 packed kernels, each with the bits it has on the file's layout."""
    m = load_model(write_moe(tmp_path / f"{arch}.{wtype}.gguf", arch, wtype))

    def run(cm, threads, impl):
        c = CContext(cm, 64, n_threads=threads, impl=impl)
        return [c.decode(PROMPT, all_logits=True)] + [c.decode([t]) for t in (5, 300)]

    ref = MoEContext(m, 64)
    want = {"auto": [ref.decode(PROMPT, all_logits=True)] + [ref.decode([t]) for t in (5, 300)],
            "ref": run(CModel.from_model(m), 2, "ref"), "base": run(CModel.from_model(m), 2, "base")}
    dense_only = CModel.from_model(m).repack(ffn=False)
    packed = CModel.from_model(m)
    n_packed = packed.repack(ffn=True)
    expert_bytes = sum(t.nbytes for n, t in m.file.tensors.items()
                       if "_exps" in n and t.type_name in ("Q4_K", "Q6_K", "Q8_0"))
    if platform.machine() in ("x86_64", "AMD64"):
        assert expert_bytes and n_packed - dense_only >= expert_bytes   # the experts are in the copy
    for threads, impl in ((1, "auto"), (2, "auto"), (2, "ref"), (2, "base")):   # base: the AVX2 kernels
        for what, got, w in zip(("batch", "token 5", "token 300"), run(packed, threads, impl), want[impl]):
            assert np.array_equal(got, w), f"{arch} {wtype} -t {threads} {impl}: {what}"


@pytest.mark.parametrize("arch", ["qwen3moe", "smallthinker"])
def test_packed_q6_k_down_experts_equal_reference(tmp_path, monkeypatch, arch):
    """Q4_K_M experts with every layer's down experts Q6_K (llama-quantize gives Q6_K to some layers' down) copied
    into the x8 layout: an expert's rows of a batch in vec_dot's order below 8 rows and the tiled order from 8 (the
    prompt routes both to some expert of every layer), decode in vec_dot's, -t 1 and -t 2, on the auto, base and
    reference tables (the reference table reads the packed groups unpacked)."""
    import moe_files
    plain = moe_files.quantized_type

    def q6_down(wtype, names, shapes, n_layer, n_expert):
        t = plain(wtype, names, shapes, n_layer, n_expert)
        return {n: "Q6_K" if "ffn_down_exps" in n else v for n, v in t.items()}
    monkeypatch.setattr(moe_files, "quantized_type", q6_down)
    m = load_model(write_moe(tmp_path / f"{arch}.Q6_K-down.gguf", arch, "Q4_K_M"))
    assert {t.type_name for n, t in m.file.tensors.items() if "ffn_down_exps" in n} == {"Q6_K"}
    prompt = (PROMPT * 2)[:36]

    def run(cm, threads, impl):
        c = CContext(cm, 64, n_threads=threads, impl=impl)
        out = [c.decode(prompt, all_logits=True)]
        rows = c.expert_counts
        assert all((r >= 8).any() and ((r > 1) & (r < 8)).any() for r in rows), rows   # both orders in each layer
        return out + [c.decode([t]) for t in (5, 300)]

    ref = MoEContext(m, 64)
    want = {"auto": [ref.decode(prompt, all_logits=True)] + [ref.decode([t]) for t in (5, 300)],
            "ref": run(CModel.from_model(m), 2, "ref"), "base": run(CModel.from_model(m), 2, "base")}
    dense_only = CModel.from_model(m).repack(ffn=False)
    packed = CModel.from_model(m)
    n_packed = packed.repack(ffn=True)
    down = sum(t.nbytes for n, t in m.file.tensors.items() if "ffn_down_exps" in n)
    gate_up = sum(t.nbytes for n, t in m.file.tensors.items() if "_exps" in n and "down" not in n)
    if platform.machine() in ("x86_64", "AMD64"):
        assert n_packed - dense_only >= down + gate_up   # the Q6_K down experts are in the copy
    for threads, impl in ((1, "auto"), (2, "auto"), (1, "base"), (2, "ref")):
        for what, got, w in zip(("batch", "token 5", "token 300"), run(packed, threads, impl), want[impl]):
            assert np.array_equal(got, w), f"{arch} Q6_K down -t {threads} {impl}: {what}"
