"""test_q5_1_kernels.py — Q5_1's SIMD kernels beyond one row and one token (csrc/kernels/x86_q5_1_body.h) and its
x8 packed kernel against the numpy lane.

llama.cpp multiplies Q5_1 on x86 by ggml_vec_dot_q5_1_q8_1 alone (no repacked layout, no batch kernel), and the
reference (pi2/reference/qdot.py dot_q4_1_q8_1, through quants.QuantLinear) follows its float order. Checks: each
table's one-token kernel and packed kernel equal the reference bit for bit; pi2_matmul on plain rows (row counts
that leave 4-, 2- and 1-row remainders) and on the packed copy, at 1 and 2 threads, equals it bit for bit at batch
sizes 1–70 (the 4- and 8-token passes and their remainders); a Q5_1 model decodes the reference's logits bit for
bit, prompt batches and single tokens, plain and repacked at load, at -t 1 and -t 2.
"""
import numpy as np
import pytest

import cinternal
from decode_seq import run
from fixtures import write_model
from pi2 import engine
from pi2.engine import CContext, CModel
from pi2.errors import EngineError, UnsupportedError
from pi2.model.loader import load_model
from pi2.reference import quants
from pi2.reference.forward import ReferenceContext

Q5_1 = 7


def q5_1_rows(n_rows, n_blocks, seed):
    """uint8 (n_rows, row_bytes): random codes and 5th bits, fp16 d and m of ordinary size; the first block of
    row 0 at the extremes (every code 31)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n_rows * n_blocks, 24), dtype=np.uint8)
    for off in (0, 2):
        scale = (rng.standard_normal(n_rows * n_blocks) * 0.01).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    blocks[0, 4:] = 0xFF
    return blocks.reshape(n_rows, -1)


def has_packed(impl):
    raw = q5_1_rows(8, 1, 0)
    try:
        engine.matvec_packed(engine.repack_rows(raw, Q5_1, 32), Q5_1, 32,
                             engine.quantize_act(np.ones(32, np.float32), quants.vec_dot_type(Q5_1)), impl)
    except (EngineError, UnsupportedError):
        return False
    return True


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_x86_tables_pack_q5_1():
    info = engine.kernel_info()
    if not info["isa"] or "avx2" not in info["isa"]:
        pytest.skip("no x86 SIMD kernels on this CPU")
    assert "Q5_1" in info["packed"]
    assert has_packed("auto") and has_packed("base") and not has_packed("ref")


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("n_blocks", [1, 7, 28, 152])
def test_one_token_is_bit_identical(n_blocks, impl):
    n = 32 * n_blocks
    raw = q5_1_rows(16, n_blocks, n_blocks)
    x = np.random.default_rng(n_blocks).standard_normal(n).astype(np.float32) * 3
    x[:32] = np.where(np.arange(32) % 2, 1e3, -1e3)    # q8 at ±127: the largest integer sums
    xq = engine.quantize_act(x, quants.vec_dot_type(Q5_1))
    want = bits(quants.QuantLinear(raw, Q5_1, n)(x[None, :])[0])
    assert np.array_equal(bits(engine.matvec(raw, Q5_1, n, xq, impl)), want)
    if has_packed(impl):
        got = engine.matvec_packed(engine.repack_rows(raw, Q5_1, n), Q5_1, n, xq, impl)
        assert np.array_equal(bits(got), want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("impl", ["auto", "base"])
def test_batches_are_bit_identical(threads, impl):
    n_blocks = 28                                      # 896 values: Qwen2.5-0.5B's rows
    n = 32 * n_blocks
    raw = q5_1_rows(31, n_blocks, 3)                   # 31 rows: four-row passes, then 2 and 1 rows left
    ql = quants.QuantLinear(raw, Q5_1, n)
    raw8, ql8 = raw[:24], quants.QuantLinear(raw[:24], Q5_1, n)
    packed = engine.repack_rows(raw8, Q5_1, n) if has_packed(impl) else None
    rng = np.random.default_rng(threads)
    with cinternal.Pool(threads) as pool:
        for n_tok in (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 33, 70):
            x = rng.standard_normal((n_tok, n), dtype=np.float32)
            x[0, :32] = np.where(np.arange(32) % 2, 1e3, -1e3)
            assert np.array_equal(bits(cinternal.matmul(pool, raw, Q5_1, n, x, impl)), bits(ql(x))), n_tok
            if packed is not None:
                got = cinternal.matmul_packed(pool, raw8, packed, Q5_1, n, x, impl)
                assert np.array_equal(bits(got), bits(ql8(x))), n_tok


def test_model_decodes_the_reference_bits(tmp_path):
    path = tmp_path / "m-q5_1.gguf"
    write_model(path, arch="llama", wtype="Q5_1", n_layer=2)
    m = load_model(path)
    want = run(ReferenceContext(m, 64))
    plain, packed = CModel.from_model(m), CModel.from_model(m)
    if has_packed("auto"):
        assert packed.repack(ffn=True) > 0
    for threads in (1, 2):
        for cm in (plain, packed):
            assert np.array_equal(run(CContext(cm, 64, n_threads=threads)), want), threads
