"""test_pack_q5k.py — Q5_K's SIMD kernels (csrc/kernels/x86_q5k_body.h) and its x8 layout (pack_k.c) against the
numpy lane.

Checks: pi2_repack_rows of Q5_K rows equals quants.pack_rows byte for byte and unpacks back; each table's plain
vec_dot and tiled kernel, and its one-token packed kernel, equal numpy's x86-order products (QuantLinear:
ggml_vec_dot_q5_K_q8_K's order below 8 tokens, the tiled kernel's from 8) bit for bit; pi2_matmul on the packed
copy and on the plain rows, with one to three threads, equals numpy bit for bit at batch sizes around the tiled
kernel's edge (8 tokens), its four-token passes and past a token tile (32), on row counts that leave the 16-row zmm
kernel (x86_q5k_z_body.h) an 8-row tail or none.
"""
import numpy as np
import pytest

import cinternal
from pi2 import engine
from pi2.errors import EngineError
from pi2.reference import quants

Q5_K = 13


def q5k_rows(n_rows, n_blocks, seed):
    """uint8 (n_rows, row_bytes): random codes, 5th bits and 6-bit scales and mins, fp16 d and dmin of ordinary
    size; the first block of row 0 at the extremes (every code, scale and min at its largest)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n_rows * n_blocks, 176), dtype=np.uint8)
    for off in (0, 2):
        scale = (rng.standard_normal(n_rows * n_blocks) * 0.01).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    blocks[0, 4:] = 0xFF
    return blocks.reshape(n_rows, -1)


def has_packed(impl):
    n = 256
    raw = q5k_rows(8, 1, 0)
    try:
        engine.matvec_packed(engine.repack_rows(raw, Q5_K, n), Q5_K, n,
                             engine.quantize_act(np.ones(n, np.float32), quants.vec_dot_type(Q5_K)), impl)
    except EngineError:
        return False
    return True


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("n_rows,n_blocks", [(8, 1), (16, 3), (24, 7)])
def test_pack_matches_numpy_and_unpacks(n_rows, n_blocks):
    raw = q5k_rows(n_rows, n_blocks, n_blocks)
    packed = engine.repack_rows(raw, Q5_K, 256 * n_blocks)
    assert np.array_equal(packed, quants.pack_rows(raw, Q5_K))
    assert not np.array_equal(packed, raw)
    assert np.array_equal(engine.repack_rows(packed, Q5_K, 256 * n_blocks, unpack=True), raw)
    with pytest.raises(EngineError, match="groups of 8"):
        engine.repack_rows(raw[:7], Q5_K, 256 * n_blocks)


def test_simd_tables_install_q5k():
    info = engine.kernel_info()
    if not info["isa"] or "avx2" not in info["isa"]:
        pytest.skip("no x86 SIMD kernels on this CPU")
    assert engine.type_info(Q5_K, "auto").vec_dot_impl in ("avx2", "avx512vnni")
    assert engine.type_info(Q5_K, "base").vec_dot_impl == "avx2"
    assert "Q5_K" in info["packed"]


@pytest.mark.parametrize("impl", ["auto", "base", "ref"])
@pytest.mark.parametrize("n_blocks", [1, 2, 7, 35])
def test_one_token_is_bit_identical(n_blocks, impl):
    n = 256 * n_blocks
    raw = q5k_rows(16, n_blocks, n_blocks)
    x = np.random.default_rng(n_blocks).standard_normal(n).astype(np.float32) * 3
    x[:256] = np.where(np.arange(256) % 2, 1e3, -1e3)    # q8 at ±127: the largest integer sums
    xq = engine.quantize_act(x, quants.vec_dot_type(Q5_K))
    want = quants.QuantLinear(raw, Q5_K, n)(x[None, :])[0]
    assert np.array_equal(bits(engine.matvec(raw, Q5_K, n, xq, impl)), bits(want))
    if impl != "ref" and has_packed(impl):
        got = engine.matvec_packed(engine.repack_rows(raw, Q5_K, n), Q5_K, n, xq, impl)
        assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("n_rows", [24, 200, 264])
def test_batches_are_bit_identical(threads, impl, n_rows):
    """24 rows: tasks of 8 rows (the 8-row kernels only); 200 and 264: tasks of 16 to 40 rows, so the 16-row kernel
    (zmm: x86_q5k_z_body.h; AVX2, the base table on an AVX-512 CPU: x86_q5k_y16_body.h) runs with and without an
    8-row tail in a task."""
    n_blocks = 3
    n = 256 * n_blocks
    raw = q5k_rows(n_rows, n_blocks, 7)
    ql = quants.QuantLinear(raw, Q5_K, n)
    packed = engine.repack_rows(raw, Q5_K, n) if has_packed(impl) else None
    rng = np.random.default_rng(threads)
    with cinternal.Pool(threads) as pool:
        for n_tok in (1, 2, 4, 5, 7, 8, 9, 12, 13, 33, 70):
            x = rng.standard_normal((n_tok, n), dtype=np.float32)
            x[0, :256] = np.where(np.arange(256) % 2, 1e3, -1e3)
            want = bits(ql(x))
            assert np.array_equal(bits(cinternal.matmul(pool, raw, Q5_K, n, x, impl)), want), n_tok
            if packed is not None:
                got = cinternal.matmul_packed(pool, raw, packed, Q5_K, n, x, impl)
                assert np.array_equal(bits(got), want), n_tok
