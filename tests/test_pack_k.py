"""test_pack_k.py — the K-quants' x8 layout (csrc/kernels/pack_k.c) and its kernels (x86_pack_k_body.h) against
the numpy lane.

Checks: pi2_repack_rows of Q4_K and Q6_K rows equals quants.pack_rows byte for byte and unpacks back; each
table's one-token packed kernel equals that table's vec_dot on the plain rows and numpy's x86-order product
(QuantLinear: the repacked GEMV order for Q4_K, vec_dot_q6_K_q8_K's for Q6_K), bit for bit; pi2_matmul on the
packed copy (the four-token packed kernels in the batch orders: Q4_K's GEMM on whole groups of 4 tokens, Q6_K's
tiled order from 8 tokens; single tokens otherwise) equals pi2_matmul on the plain rows and numpy, bit for bit, at
batch sizes around those edges and past a token tile; a row count that is not a multiple of 8 is refused.
"""
import numpy as np
import pytest

import cinternal
from pi2 import engine
from pi2.errors import EngineError
from pi2.reference import quants

Q4_K, Q6_K = 12, 14
SCALE_OFFSETS = {Q4_K: (0, 2), Q6_K: (208,)}


def k_rows(qtype, n_rows, n_blocks, seed):
    """uint8 (n_rows, row_bytes): random codes and scales, fp16 scales of ordinary size; the first block of row 0
    at the extremes (every code and scale at its largest)."""
    rng = np.random.default_rng(seed)
    ts = engine.type_info(qtype).type_size
    blocks = rng.integers(0, 256, (n_rows * n_blocks, ts), dtype=np.uint8)
    blocks[0] = 0xFF
    for off in SCALE_OFFSETS[qtype]:
        scale = (rng.standard_normal(n_rows * n_blocks) * 0.01).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_rows, -1)


def has_packed(qtype, impl):
    n = 256
    raw = k_rows(qtype, 8, 1, 0)
    try:
        engine.matvec_packed(engine.repack_rows(raw, qtype, n), qtype, n,
                             engine.quantize_act(np.ones(n, np.float32), quants.vec_dot_type(qtype)), impl)
    except EngineError:
        return False
    return True


@pytest.fixture(scope="module")
def pool():
    with cinternal.Pool(2) as p:
        yield p


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
@pytest.mark.parametrize("n_rows,n_blocks", [(8, 1), (16, 3), (24, 7)])
def test_pack_matches_numpy_and_unpacks(qtype, n_rows, n_blocks):
    raw = k_rows(qtype, n_rows, n_blocks, n_blocks)
    packed = engine.repack_rows(raw, qtype, 256 * n_blocks)
    assert np.array_equal(packed, quants.pack_rows(raw, qtype))
    assert not np.array_equal(packed, raw)
    assert np.array_equal(engine.repack_rows(packed, qtype, 256 * n_blocks, unpack=True), raw)
    with pytest.raises(EngineError, match="groups of 8"):
        engine.repack_rows(raw[:7], qtype, 256 * n_blocks)


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
@pytest.mark.parametrize("n_blocks", [1, 2, 7, 35])
def test_packed_kernel_is_bit_identical(qtype, n_blocks, impl):
    if not has_packed(qtype, impl):
        pytest.skip("no packed K-quant kernels on this CPU")
    n = 256 * n_blocks
    raw = k_rows(qtype, 16, n_blocks, n_blocks)
    x = np.random.default_rng(n_blocks).standard_normal(n).astype(np.float32) * 3
    x[:256] = np.where(np.arange(256) % 2, 1e3, -1e3)    # q8 at ±127: the largest integer sums
    xq = engine.quantize_act(x, quants.vec_dot_type(qtype))
    got = engine.matvec_packed(engine.repack_rows(raw, qtype, n), qtype, n, xq, impl)
    assert np.array_equal(got.view(np.uint32), engine.matvec(raw, qtype, n, xq, impl).view(np.uint32))
    assert np.array_equal(got.view(np.uint32), quants.QuantLinear(raw, qtype, n)(x[None, :])[0].view(np.uint32))


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
def test_packed_batches_are_bit_identical(pool, qtype, impl):
    if not has_packed(qtype, impl):
        pytest.skip("no packed K-quant kernels on this CPU")
    n_blocks = 3
    n = 256 * n_blocks
    raw = k_rows(qtype, 24, n_blocks, 7)
    packed = engine.repack_rows(raw, qtype, n)
    ql = quants.QuantLinear(raw, qtype, n)
    rng = np.random.default_rng(qtype)
    for n_tok in (2, 4, 5, 7, 8, 9, 13, 33, 70):
        x = rng.standard_normal((n_tok, n), dtype=np.float32)
        got = cinternal.matmul_packed(pool, raw, packed, qtype, n, x, impl)
        plain = cinternal.matmul(pool, raw, qtype, n, x, impl)
        assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), n_tok
        assert np.array_equal(got.view(np.uint32), ql(x).view(np.uint32)), n_tok


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n_rows", [200, 264])
def test_q6k_sixteen_row_batches_are_bit_identical(threads, n_rows, impl):
    """Tasks of 16 to 40 rows: the 16-row kernels (zmm: x86_q6k_z_body.h; AVX2, the base table on an AVX-512 CPU:
    x86_q6k_y16_body.h; up to 32 tokens per call) with and without an 8-row tail, token counts around their
    8/4/1-token passes, against numpy and the plain rows; every row and token distinct, so a swapped lane, group or
    token fails."""
    if not has_packed(Q6_K, impl):
        pytest.skip("no packed K-quant kernels on this CPU")
    n_blocks = 3
    n = 256 * n_blocks
    raw = k_rows(Q6_K, n_rows, n_blocks, n_rows)
    packed = engine.repack_rows(raw, Q6_K, n)
    ql = quants.QuantLinear(raw, Q6_K, n)
    rng = np.random.default_rng(threads)
    with cinternal.Pool(threads) as pool:
        for n_tok in (8, 9, 12, 15, 31, 32, 33, 45, 70):
            x = rng.standard_normal((n_tok, n), dtype=np.float32)
            x[0, :256] = np.where(np.arange(256) % 2, 1e3, -1e3)    # q8 at ±127: the largest integer sums
            got = cinternal.matmul_packed(pool, raw, packed, Q6_K, n, x, impl)
            assert np.array_equal(got.view(np.uint32), ql(x).view(np.uint32)), n_tok
            plain = cinternal.matmul(pool, raw, Q6_K, n, x, impl)
            assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), n_tok
