"""test_kernels.py — the C kernels (csrc/kernels, csrc/matmul.c, csrc/ops.c) against the numpy lane
(pi2.reference.quants, pi2.reference.qdot, pi2.reference, pi2.reference.ggml_order).

Checks, at the issue's odd sizes SIZES (values of F32/F16/BF16 rows, activations and ops; blocks per row
for block types, at most K_MAX_BLOCKS of the 256-value types; output rows and batch tokens):
- dequantization and activation quantization: bit for bit;
- vec_dot (pi2_matvec) and the batch/tile products (pi2_matmul over a thread pool): for the types numpy
  computes in ggml's x86 float order (quants.QuantLinear.exact: Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) every
  fast table equals numpy bit for bit, one token and batches; the others within NMSE_NUMPY of numpy's
  float32 BLAS product, and every fast table within NMSE_FAST[type] of the reference table;
- RMSNorm, both RoPEs, SiLU/GELU/ReLU and attention (with its softmax): bit for bit with reference/forward.py;
- argument errors; real tensors from fetched models.
Does not: time anything (scripts/bench_kernels.py) or run on aarch64 (tests/c/kernel_selftest.c does the
same checks there, against x86's order; scripts/test_aarch64.sh).
"""
import numpy as np
import pytest

import cinternal
from pi2 import engine
from pi2.reference import quants
from pi2.reference import forward as reference
from pi2.reference import ggml_order as go
from pi2.errors import EngineError, UnsupportedError

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q4_K, Q5_K, Q6_K, Q8_K, BF16 = 12, 13, 14, 15, 30
WEIGHT_TYPES = [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
ACT_TYPES = [F32, F16, BF16, Q8_0, Q8_1, Q8_K]
SIZES = [1, 7, 31, 32, 33, 255, 256, 4096 + 32]   # the odd sizes
K_MAX_BLOCKS = 256                            # 256-value types: at most 65536 values per row
TOKENS = [1, 7, 31, 32, 33]                   # batch sizes for pi2_matmul (Q4_K: groups of 4; Q6_K: 8+ tiled)
FLOAT_COLS = [1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023]
# fast vs ref: both sum exact integers per block, so only float32 summation order differs (F32/F16/BF16:
# the reference sums in double, the fast kernels in float32 lanes)
NMSE_FAST = {F32: 1e-11, F16: 1e-11, BF16: 1e-11, Q4_0: 1e-10, Q4_1: 1e-10, Q5_0: 1e-10,
             Q5_1: 1e-10, Q8_0: 1e-10, Q4_K: 1e-10, Q5_K: 1e-10, Q6_K: 1e-10}
NMSE_NUMPY = 1e-10                            # C vs QuantLinear's float32 BLAS product (types not in qdot)
SCALE_OFFSETS = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,),
                 Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}


def nmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-30))


def random_rows(qtype, n_rows, n_cols, rng):
    """uint8 (n_rows, row_bytes): random quant bytes with sane fp16 scales, or random float values."""
    if qtype == F32:
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint8)
    if qtype == F16:
        return rng.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    if qtype == BF16:
        return quants.bf16_bits(rng.standard_normal((n_rows, n_cols), dtype=np.float32)).view(np.uint8)
    ti = engine.type_info(qtype)
    nb = n_rows * n_cols // ti.block_size
    blocks = rng.integers(0, 256, (nb, ti.type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        scale = (rng.standard_normal(nb) * 0.01).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(n_rows, -1)


def pack_act(parts, vdt):
    """quants.quantize_act's tuple -> the bytes of ggml's block layout."""
    if vdt in (F32, F16, BF16):
        return np.ascontiguousarray(parts[0]).view(np.uint8).reshape(-1)
    if vdt == Q8_K:
        d, q, bsums = parts
        return np.concatenate([d.astype("<f4").reshape(-1, 1).view(np.uint8), q.reshape(-1, 256).view(np.uint8),
                               bsums.astype("<i2").reshape(-1, 16).view(np.uint8)], axis=1).reshape(-1)
    fields = [p.astype("<f2").reshape(-1, 1).view(np.uint8) for p in parts[:-1]]
    return np.concatenate(fields + [parts[-1].reshape(-1, 32).view(np.uint8)], axis=1).reshape(-1)


def cols_for(qtype, size):
    """Values per row for `size`: size values (F32/F16/BF16), else size blocks (256-value types capped)."""
    bs = engine.type_info(qtype).block_size
    return size if bs == 1 else min(size, K_MAX_BLOCKS if bs == 256 else size) * bs


def shapes(qtype):
    """(n_rows, n_cols) pairs: every size as blocks per row (3 rows), and as rows (of 3 blocks or 33 values)."""
    return [(3, cols_for(qtype, s)) for s in SIZES] + [(s, cols_for(qtype, 33 if qtype in (F32, F16, BF16) else 3))
                                                         for s in SIZES]


def test_kernel_info():
    info = engine.kernel_info()
    assert set(info["vec_dot"]) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}
    assert all(v["ref"] == "ref" for v in info["vec_dot"].values())
    fast = {"avx2", "avx512vnni", "neon", "dotprod"}
    if info["isa"]:
        for name in ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"):
            assert info["vec_dot"][name]["auto"] in fast and info["vec_dot"][name]["base"] in fast
    for t in WEIGHT_TYPES:
        assert engine.type_info(t).vec_dot_type == quants.vec_dot_type(t)
        assert engine.type_info(t).has_vec_dot
    assert not engine.type_info(Q8_1).has_vec_dot and not engine.type_info(Q8_K).has_vec_dot


@pytest.mark.parametrize("qtype", WEIGHT_TYPES)
def test_dequantize_bit_exact(qtype):
    rng = np.random.default_rng(qtype)
    extra = [(3, n) for n in FLOAT_COLS] if qtype in (F32, F16, BF16) else []
    for n_rows, n_cols in shapes(qtype) + extra:
        raw = random_rows(qtype, n_rows, n_cols, rng)
        got = engine.dequantize(raw, qtype, n_cols)
        want = quants.dequantize(raw, qtype, n_cols)
        assert got.dtype == np.float32 and got.shape == (n_rows, n_cols)
        assert np.array_equal(got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32)), n_cols
        assert np.array_equal(engine.dequantize(raw, qtype, n_cols, impl="ref"), got)


@pytest.mark.parametrize("vdt", ACT_TYPES)
def test_quantize_act_bit_exact(vdt):
    rng = np.random.default_rng(100 + vdt)
    for size in SIZES:
        n = cols_for(vdt, size)
        x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 300.0], n)).astype(np.float32)
        m = min(n, 256) // 32 * 32                                      # first block: exact ties,
        x[:m] = np.tile(np.arange(-16, 16, dtype=np.float32) + 0.5, m // 32)  # amax 127 -> q = k + 0.5
        x[0] = 127.0
        if n >= 64:
            x[32:64] = 0.0                                              # an all-zero block
        got = engine.quantize_act(x, vdt)
        want = pack_act(quants.quantize_act(x, vdt), vdt)
        assert got.shape == want.shape and np.array_equal(got, want), (vdt, size)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES)
def test_vec_dot_ref_matches_numpy(qtype):
    rng = np.random.default_rng(200 + qtype)
    for n_rows, n_cols in shapes(qtype):
        raw = random_rows(qtype, n_rows, n_cols, rng)
        x = rng.standard_normal(n_cols, dtype=np.float32)
        got = engine.matvec(raw, qtype, n_cols, x, impl="ref")
        want = quants.QuantLinear(raw, qtype, n_cols)(x)
        assert nmse(got, want) <= NMSE_NUMPY, (n_rows, n_cols, nmse(got, want))


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("qtype", WEIGHT_TYPES)
def test_fast_matches_ref_and_numpy(qtype, impl):
    """Every fast vec_dot: within NMSE_FAST of the reference table; bit for bit with numpy's x86 order
    where numpy has it (QuantLinear.exact)."""
    rng = np.random.default_rng(300 + qtype)
    for n_rows, n_cols in shapes(qtype):
        raw = random_rows(qtype, n_rows, n_cols, rng)
        x = rng.standard_normal(n_cols, dtype=np.float32)
        xq = engine.quantize_act(x, engine.type_info(qtype).vec_dot_type)
        ref = engine.matvec(raw, qtype, n_cols, xq, impl="ref")
        fast = engine.matvec(raw, qtype, n_cols, xq, impl=impl)
        assert nmse(fast, ref) <= NMSE_FAST[qtype], (engine.type_info(qtype, impl).vec_dot_impl, n_cols, nmse(fast, ref))
        ql = quants.QuantLinear(raw, qtype, n_cols)
        if ql.exact:
            assert np.array_equal(fast.view(np.uint32), ql(x).view(np.uint32)), (n_rows, n_cols)


@pytest.fixture(scope="module")
def pool():
    with cinternal.Pool(2) as p:
        yield p


@pytest.mark.parametrize("qtype", WEIGHT_TYPES)
def test_matmul_batches(pool, qtype):
    """pi2_matmul (row tasks on 2 threads, token tiles, four-token, two-row and batch-order kernels) at
    every size as output rows (9 tokens) and at TOKENS tokens (7 rows): each token's row equals the
    one-token pi2_matvec of the same table bit for bit, unless the type has a batch order (Q4_K in groups
    of 4, Q5_K and Q6_K from 8 tokens); numpy's x86 order bit for bit where numpy has it; else NMSE_NUMPY."""
    rng = np.random.default_rng(400 + qtype)
    n_in = cols_for(qtype, 33 if qtype in (F32, F16, BF16) else 3)
    for n_out, n_tok in [(s, 9) for s in SIZES] + [(7, t) for t in TOKENS]:
        raw = random_rows(qtype, n_out, n_in, rng)
        x = rng.standard_normal((n_tok, n_in), dtype=np.float32)
        ql = quants.QuantLinear(raw, qtype, n_in)
        want = ql(x)
        for impl in ("auto", "base", "ref"):
            got = cinternal.matmul(pool, raw, qtype, n_in, x, impl)
            if ql.exact and impl != "ref":
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (impl, n_out, n_tok)
            else:
                assert nmse(got, want) <= NMSE_NUMPY, (impl, n_out, n_tok, nmse(got, want))
            if qtype not in (Q4_K, Q5_K, Q6_K):
                one = np.stack([engine.matvec(raw, qtype, n_in, x[t], impl=impl) for t in range(n_tok)])
                assert np.array_equal(got.view(np.uint32), one.view(np.uint32)), (impl, n_out, n_tok)


def bits_equal(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("n", SIZES)
def test_ops_match_reference(pool, n):
    """RMSNorm, RoPE (NORM and NEOX on n_rot = n rounded up to even), the FFN activations, and attention
    over n cached positions (one query: ggml_vec_dot_f16's order; three: tinyBLAS's), softmax included:
    bit for bit with pi2/reference/forward.py."""
    rng = np.random.default_rng(500 + n)
    x, w = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    assert bits_equal(cinternal.rms_norm(x, w, 1e-6), reference.rms_norm(x[None], w, 1e-6)[0])
    assert bits_equal(cinternal.rms_norm(x, None, 1e-5), reference.rms_norm(x[None], None, 1e-5)[0])
    g = (rng.standard_normal(n) * 4).astype(np.float32)
    assert bits_equal(cinternal.ffn_activate(g, w, "silu"), go.swiglu(g, w))
    assert bits_equal(cinternal.ffn_activate(g, w, "gelu"), go.gelu_f16(g) * w)
    assert bits_equal(cinternal.ffn_activate(g, w, "relu"), np.maximum(g, 0) * w)
    n_rot = n + (n & 1)
    xh = rng.standard_normal((3, n_rot + 2), dtype=np.float32)
    for pos in (0, 7, 1000):
        cos, sin = reference.rope_cache(np.array([pos]), n_rot, 10000.0, 1.0)
        for neox in (False, True):
            want = reference.rope(xh[None], cos, sin, n_rot, neox)[0]
            assert bits_equal(cinternal.rope(xh, pos, n_rot, 10000.0, neox), want), (pos, neox)
    for n_tok, hd, hdv in ((1, 64, 64), (3, 64, 64), (3, 24, 40)):   # 24, 40: partial 16-lane vectors
        if n_tok > n:
            continue
        q = rng.standard_normal((n_tok, 4, hd), dtype=np.float32) * 2
        kc = rng.standard_normal((n, 2, hd)).astype(np.float16)
        vc = rng.standard_normal((n, 2, hdv)).astype(np.float16)
        for window in (0, 5):
            got = cinternal.attention(pool, q, kc, vc, n - n_tok, 0.125, window)
            want = reference.attention(q, kc, vc, np.arange(n - n_tok, n), n, 0.125, window)
            assert bits_equal(got, want), (n_tok, hd, hdv, window)


def test_argument_errors():
    raw = random_rows(Q4_0, 2, 64, np.random.default_rng(0))
    x = np.ones(64, np.float32)
    with pytest.raises(UnsupportedError, match="not supported"):
        engine.matvec(raw, 11, 64, x)                                   # Q3_K
    with pytest.raises(UnsupportedError, match="not supported"):
        engine.dequantize(raw, 20, 64)                                  # IQ4_NL
    with pytest.raises(EngineError, match="multiple of 32"):
        engine.dequantize(raw, Q4_0, 48)
    with pytest.raises(EngineError, match="multiple of 32"):
        engine.quantize_act(np.ones(40, np.float32), Q8_0)
    with pytest.raises(UnsupportedError, match="activation format"):
        engine.matvec(raw, Q8_K, 256, np.ones(256, np.float32))
    with pytest.raises(UnsupportedError, match="not an activation format"):
        engine.quantize_act(x, Q4_0)
    with pytest.raises(ValueError, match="impl"):
        engine.matvec(raw, Q4_0, 64, x, impl="fast")
    with pytest.raises(ValueError, match="bytes"):
        engine.matvec(raw, Q4_0, 64, engine.quantize_act(np.ones(32, np.float32), Q8_0))


@pytest.mark.model
@pytest.mark.parametrize("key", ["qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"])
def test_real_tensors(key):
    from conftest import model_file
    from pi2.model.gguf_file import GGUFFile

    with GGUFFile(model_file(key)) as g:
        seen = {}
        for t in g.tensors.values():
            if len(t.ne) == 2 and t.type in WEIGHT_TYPES and t.type != F32 and t.type not in seen:
                seen[t.type] = t
        assert seen
        rng = np.random.default_rng(7)
        for qtype, t in seen.items():
            n_cols = t.ne[0]
            raw = np.ascontiguousarray(g.raw(t.name)[:128])
            got = engine.dequantize(raw, qtype, n_cols)
            assert np.array_equal(got, quants.dequantize(raw, qtype, n_cols)), t.name
            x = rng.standard_normal(n_cols, dtype=np.float32)
            ref = engine.matvec(raw, qtype, n_cols, x, impl="ref")
            assert nmse(ref, quants.QuantLinear(raw, qtype, n_cols)(x)) <= NMSE_NUMPY, t.name
            for impl in ("auto", "base"):
                assert nmse(engine.matvec(raw, qtype, n_cols, x, impl=impl), ref) <= NMSE_FAST[qtype], (t.name, impl)
