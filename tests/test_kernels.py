"""test_kernels.py — the C kernels (csrc/kernels via pi2.engine) against the numpy lane (pi2.quants).

Checks: dequantization and activation quantization bit for bit; the reference vec_dot against
QuantLinear within float rounding; every fast path (auto, base) against the reference at odd block
counts, with an NMSE threshold per type; argument errors; real tensors from fetched models.
Does not: time anything (scripts/bench_kernels.py) or test aarch64 (scripts/test_aarch64.sh).
"""
import numpy as np
import pytest

from pi2 import engine, quants
from pi2.errors import EngineError, UnsupportedError

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q4_K, Q5_K, Q6_K, Q8_K, BF16 = 12, 13, 14, 15, 30
WEIGHT_TYPES = [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
ACT_TYPES = [F32, F16, BF16, Q8_0, Q8_1, Q8_K]
BLOCKS = [1, 3, 7, 33]                        # llama.cpp's awkward sizes, in blocks
FLOAT_COLS = [1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023]
# fast vs ref: both sum exact integers per block, so only float32 summation order differs
NMSE_FAST = {F32: 1e-12, F16: 1e-12, BF16: 1e-12, Q4_0: 1e-10, Q4_1: 1e-10, Q5_0: 1e-10,
             Q5_1: 1e-10, Q8_0: 1e-10, Q4_K: 1e-10, Q5_K: 1e-10, Q6_K: 1e-10}
NMSE_NUMPY = 1e-10                            # ref vs QuantLinear (float32 matmul)
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


def cols_for(qtype, nb):
    return nb * engine.type_info(qtype).block_size if qtype not in (F32, F16, BF16) else nb * 32 + 1


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
    sizes = FLOAT_COLS if qtype in (F32, F16, BF16) else [cols_for(qtype, nb) for nb in BLOCKS]
    for n_cols in sizes:
        raw = random_rows(qtype, 3, n_cols, rng)
        got = engine.dequantize(raw, qtype, n_cols)
        want = quants.dequantize(raw, qtype, n_cols)
        assert got.dtype == np.float32 and got.shape == (3, n_cols)
        assert np.array_equal(got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32)), n_cols
        assert np.array_equal(engine.dequantize(raw, qtype, n_cols, impl="ref"), got)


@pytest.mark.parametrize("vdt", ACT_TYPES)
def test_quantize_act_bit_exact(vdt):
    rng = np.random.default_rng(100 + vdt)
    bs = engine.type_info(vdt).block_size
    for nb in BLOCKS:
        n = nb * max(bs, 32)
        x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 300.0], n)).astype(np.float32)
        m = min(n, 256)                                                 # first block: exact ties,
        x[:m] = np.tile(np.arange(-16, 16, dtype=np.float32) + 0.5, m // 32)  # amax 127 -> q = k + 0.5
        x[0] = 127.0
        if n >= 64:
            x[32:64] = 0.0                                              # an all-zero block
        got = engine.quantize_act(x, vdt)
        want = pack_act(quants.quantize_act(x, vdt), vdt)
        assert got.shape == want.shape and np.array_equal(got, want), (vdt, nb)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES)
def test_vec_dot_ref_matches_numpy(qtype):
    rng = np.random.default_rng(200 + qtype)
    for nb in BLOCKS:
        n_cols = cols_for(qtype, nb)
        raw = random_rows(qtype, 16, n_cols, rng)
        x = rng.standard_normal(n_cols, dtype=np.float32)
        got = engine.matvec(raw, qtype, n_cols, x, impl="ref")
        want = quants.QuantLinear(raw, qtype, n_cols)(x)
        assert nmse(got, want) <= NMSE_NUMPY, (nb, nmse(got, want))


@pytest.mark.parametrize("impl", ["auto", "base"])
@pytest.mark.parametrize("qtype", WEIGHT_TYPES)
def test_fast_matches_ref(qtype, impl):
    rng = np.random.default_rng(300 + qtype)
    for nb in BLOCKS:
        n_cols = cols_for(qtype, nb)
        raw = random_rows(qtype, 16, n_cols, rng)
        xq = engine.quantize_act(rng.standard_normal(n_cols, dtype=np.float32), engine.type_info(qtype).vec_dot_type)
        ref = engine.matvec(raw, qtype, n_cols, xq, impl="ref")
        fast = engine.matvec(raw, qtype, n_cols, xq, impl=impl)
        assert nmse(fast, ref) <= NMSE_FAST[qtype], (engine.type_info(qtype, impl).vec_dot_impl, nb, nmse(fast, ref))


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
