"""test_quants.py — pi2.reference.quants against gguf.quants (dequantization), hand-made activation blocks
(llama.cpp's x86 rounding) and a slow per-block integer dot product written here from the block layouts,
the way ggml's scalar ggml_vec_dot_* reference computes it."""
import numpy as np
import pytest
from conftest import model_file
from gguf.constants import GGMLQuantizationType, GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

from pi2.errors import ModelFormatError, UnsupportedError
from pi2.reference.quants import QuantLinear, act_values, dequantize, quantize_act, quantize_weight, vec_dot_type

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15, 30
ALL = [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]
FP16_FIELDS = {Q4_0: [0], Q4_1: [0, 2], Q5_0: [0], Q5_1: [0, 2], Q8_0: [0], Q4_K: [0, 2], Q5_K: [0, 2], Q6_K: [208]}


def sizes(t):
    return GGML_QUANT_SIZES[GGMLQuantizationType(t)]


def bits32(a):
    """float32 bit patterns, every NaN mapped to one value (NaN sign and payload carry no meaning)."""
    a = np.asarray(a, np.float32)
    return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


def random_raw(t, rows, n, rng, sane=True):
    """Random blocks of type t; with `sane`, fp16 scale fields hold small finite values."""
    qk, size = sizes(t)
    if t in (F32, F16, BF16):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        return x.view(np.uint8) if t == F32 else (x.astype(np.float16).view(np.uint8) if t == F16
                                                  else (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
    raw = rng.integers(0, 256, (rows, n // qk, size), dtype=np.uint8)
    if sane:
        for off in FP16_FIELDS[t]:
            raw[:, :, off:off + 2] = (rng.standard_normal((rows, n // qk, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


# ------------------------------------------------------------------ dequantize vs gguf

@pytest.mark.parametrize("t", ALL)
@pytest.mark.parametrize("rows,nblocks", [(1, 1), (3, 2), (7, 5), (33, 3)])
def test_dequantize_random_bytes_bit_exact(t, rows, nblocks):
    qk, _ = sizes(t)
    n = nblocks * (qk if qk > 1 else 37)
    raw = random_raw(t, rows, n, np.random.default_rng(rows * 100 + t), sane=False) if t not in (F32, F16, BF16) \
        else np.random.default_rng(t).integers(0, 256, (rows, n * sizes(t)[1]), dtype=np.uint8)
    with np.errstate(all="ignore"):
        got = dequantize(raw, t, n)
        want = np.asarray(gguf_dequantize(raw, GGMLQuantizationType(t)), np.float32).reshape(rows, n)
    assert got.dtype == np.float32 and got.shape == (rows, n)
    assert np.array_equal(bits32(got), bits32(want))


def test_dequantize_rejects_bad_input():
    with pytest.raises(UnsupportedError):
        dequantize(np.zeros((2, 84), np.uint8), 10, 256)            # Q2_K
    with pytest.raises(ModelFormatError):
        dequantize(np.zeros((2, 17), np.uint8), Q4_0, 32)
    with pytest.raises(ModelFormatError):
        dequantize(np.zeros((2, 18), np.uint8), Q4_0, 48)
    with pytest.raises(UnsupportedError):
        vec_dot_type(20)                                              # IQ4_NL


def test_vec_dot_types():
    assert {t: vec_dot_type(t) for t in ALL} == {
        F32: F32, F16: F16, BF16: BF16, Q4_0: Q8_0, Q5_0: Q8_0, Q8_0: Q8_0,
        Q4_1: Q8_1, Q5_1: Q8_1, Q4_K: Q8_K, Q5_K: Q8_K, Q6_K: Q8_K}


@pytest.mark.model
@pytest.mark.parametrize("key", MODELS)
def test_dequantize_real_tensors_bit_exact(key):
    from pi2.model.gguf_file import GGUFFile
    g = GGUFFile(model_file(key))
    seen = set()
    for name, ti in g.tensors.items():
        if ti.type in seen:
            continue
        seen.add(ti.type)
        raw = g.raw(name)
        pick = raw[sorted({0, min(1, raw.shape[0] - 1), raw.shape[0] - 1})]
        want = np.asarray(gguf_dequantize(pick, GGMLQuantizationType(ti.type)), np.float32).reshape(len(pick), -1)
        assert np.array_equal(bits32(dequantize(pick, ti.type, ti.ne[0])), bits32(want)), name
    assert len(seen) >= 3


# ------------------------------------------------------------------ activation quantizers

def block(vals, n=32):
    x = np.zeros(n, np.float32)
    x[:len(vals)] = vals
    return x


def test_q8_0_ties_round_half_to_even():
    # amax = 127 makes 127/amax exactly 1, so x·id keeps the .5 ties (roundf would give 1, 3, -1, -3)
    d, q = quantize_act(block([0.5, 2.5, -0.5, -2.5, 1.5, 127]), Q8_0)
    assert d.dtype == np.float16 and d.shape == (1,) and d[0] == 1
    assert q.dtype == np.int8 and q[0, :6].tolist() == [0, 2, 0, -2, 2, 127]


def test_q8_0_scale_and_multiplier():
    # d = fp16(amax/127) and q = rne(x·(127/amax)) with the f32 multiplier, not x/d or x·(1/d)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 32)).astype(np.float32)
    d, q = quantize_act(x.reshape(4, -1), Q8_0)
    amax = np.abs(x).max(-1)
    assert np.array_equal(d, (amax / np.float32(127)).astype(np.float16))
    assert np.array_equal(q, np.rint(x * (np.float32(127) / amax)[..., None]).astype(np.int8))
    assert np.abs(q).max() == 127


def test_q8_negative_max_and_zero_blocks():
    x = np.concatenate([block([-3.0, 1.0]), block([]), block([2.0, -2.0])])
    d, q = quantize_act(x, Q8_0)
    assert np.array_equal(d, (np.float32([3, 0, 2]) / np.float32(127)).astype(np.float16))
    assert q[0, :2].tolist() == [-127, 42] and not q[1].any() and q[2, :2].tolist() == [127, -127]
    d, s, q1 = quantize_act(x, Q8_1)
    assert np.array_equal(q1, q) and s[1] == 0 and s[2] == 0


def test_q8_1_sum_uses_unrounded_scale():
    x = block(np.linspace(-1, 1, 32) ** 3 + 0.3)
    d, s, q = quantize_act(x, Q8_1)
    d32 = np.abs(x).max() / np.float32(127)
    total = np.float32(q.sum())
    assert s[0] == (d32 * total).astype(np.float16)
    assert d[0] == d32.astype(np.float16)


def test_q8_k_hand_cases():
    x = np.zeros(512, np.float32)
    x[:6] = [-127.0, 2.5, 3.5, -0.5, 127.0, 1.5]     # first |max| is negative: iscale = 1, d = 1
    x[256:259] = [2.0, -2.0, 1.0]                     # first |max| positive: iscale = -63.5, d < 0
    d, q, bs = quantize_act(x.reshape(1, 512), Q8_K)
    assert d.dtype == np.float32 and q.dtype == np.int8 and bs.dtype == np.int16
    assert d.shape == (1, 2) and q.shape == (1, 2, 256) and bs.shape == (1, 2, 16)
    assert d[0, 0] == 1 and q[0, 0, :6].tolist() == [-127, 2, 4, 0, 127, 2]
    assert d[0, 1] == np.float32(1) / np.float32(-63.5) and q[0, 1, :3].tolist() == [-127, 127, -64]
    assert bs[0, 0, 0] == 8 and bs[0, 1, 0] == -64 and not bs[0, :, 1:].any()
    d, q, bs = quantize_act(np.zeros((2, 256), np.float32), Q8_K)
    assert not d.any() and not q.any() and not bs.any()


@pytest.mark.parametrize("vdt", [Q8_0, Q8_1, Q8_K])
def test_activation_round_trip(vdt):
    rng = np.random.default_rng(vdt)
    x = (rng.standard_normal((3, 1024)) * np.exp(rng.standard_normal((3, 1024)))).astype(np.float32)
    parts = quantize_act(x, vdt)
    back = act_values(parts, vdt)
    qk = 256 if vdt == Q8_K else 32
    step = np.abs(parts[0].astype(np.float32))
    err = np.abs(back - x).reshape(3, -1, qk).max(-1)
    slack = 0.5001 if vdt == Q8_K else 0.5 + 127 * 2.0 ** -11      # Q8_0/Q8_1 store d rounded to fp16
    assert back.shape == x.shape and np.all(err <= step * slack + 1e-7)
    if vdt == Q8_K:
        assert np.array_equal(parts[2], parts[1].reshape(3, 4, 16, 16).sum(-1))


def test_f16_bf16_rounding():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -7 + 2 ** -9), 65520.0, 1e-8, np.nan], np.float32)
    (h,) = quantize_act(x, F16)
    with np.errstate(over="ignore"):
        assert np.array_equal(h, x.astype(np.float16), equal_nan=True) and np.isinf(h[3])
    (b,) = quantize_act(x, BF16)
    assert b.dtype == np.uint16
    assert np.array_equal(b.view(np.uint8), gguf_quantize(x, GGMLQuantizationType.BF16))
    assert b[0] == 0x3F80 and b[1] == 0x3F82 and b[2] == 0xBF81 and b[5] & 0x40
    (f,) = quantize_act(x, F32)
    assert np.array_equal(f, x, equal_nan=True)


# ------------------------------------------------------------------ slow per-block integer reference

def fp16(b):
    return b.copy().view(np.float16).astype(np.float32)[..., 0]


def ints(t, blk):
    """One block type's fields as integers, straight from formats.md §3: returns dict with q (B, QK) int64,
    d (B,) and, where present, m (B,), dmin (B,), sc/mn (B, 8) or sc (B, 16)."""
    B, qk = blk.shape[0], sizes(t)[0]
    u = blk.astype(np.int64)
    q = np.zeros((B, qk), np.int64)
    if t in (Q4_0, Q4_1, Q5_0, Q5_1):
        base = {Q4_0: 2, Q4_1: 4, Q5_0: 6, Q5_1: 8}[t]
        qh = sum(u[:, base - 4 + k] << (8 * k) for k in range(4)) if t in (Q5_0, Q5_1) else 0 * u[:, 0]
        for j in range(16):
            q[:, j] = (u[:, base + j] & 0xF) + 16 * ((qh >> j) & 1)
            q[:, j + 16] = (u[:, base + j] >> 4) + 16 * ((qh >> (j + 16)) & 1)
        q -= {Q4_0: 8, Q5_0: 16}.get(t, 0)
        out = dict(q=q, d=fp16(blk[:, 0:2]))
        if t in (Q4_1, Q5_1):
            out["m"] = fp16(blk[:, 2:4])
        return out
    if t == Q8_0:
        return dict(q=blk[:, 2:34].copy().view(np.int8).astype(np.int64), d=fp16(blk[:, 0:2]))
    if t in (Q4_K, Q5_K):
        s = u[:, 4:16]
        sc, mn = np.zeros((B, 8), np.int64), np.zeros((B, 8), np.int64)
        for j in range(8):
            if j < 4:
                sc[:, j], mn[:, j] = s[:, j] & 63, s[:, j + 4] & 63
            else:
                sc[:, j] = (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4)
                mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
        qs0 = 16 if t == Q4_K else 48
        for c in range(4):
            for l in range(32):
                q[:, 64 * c + l] = u[:, qs0 + 32 * c + l] & 0xF
                q[:, 64 * c + 32 + l] = u[:, qs0 + 32 * c + l] >> 4
                if t == Q5_K:
                    q[:, 64 * c + l] += 16 * ((u[:, 16 + l] >> (2 * c)) & 1)
                    q[:, 64 * c + 32 + l] += 16 * ((u[:, 16 + l] >> (2 * c + 1)) & 1)
        return dict(q=q, d=fp16(blk[:, 0:2]), dmin=fp16(blk[:, 2:4]), sc=sc, mn=mn)
    assert t == Q6_K
    for h in range(2):
        ql, qh = u[:, 64 * h:64 * h + 64], u[:, 128 + 32 * h:128 + 32 * h + 32]
        for l in range(32):
            q[:, 128 * h + l] = (ql[:, l] & 0xF) | (((qh[:, l] >> 0) & 3) << 4)
            q[:, 128 * h + l + 32] = (ql[:, l + 32] & 0xF) | (((qh[:, l] >> 2) & 3) << 4)
            q[:, 128 * h + l + 64] = (ql[:, l] >> 4) | (((qh[:, l] >> 4) & 3) << 4)
            q[:, 128 * h + l + 96] = (ql[:, l + 32] >> 4) | (((qh[:, l] >> 6) & 3) << 4)
    return dict(q=q - 32, d=fp16(blk[:, 208:210]), sc=blk[:, 192:208].copy().view(np.int8).astype(np.int64))


def slow_matmul(raw, t, n, x):
    """(n_tok, n_out) in float64 plus the sum of |block terms| (the scale for the tolerance)."""
    f32 = np.float32
    if t in (F32, F16, BF16):
        w = dequantize(raw, t, n).astype(np.float64)
        xr = act_values(quantize_act(x, t), t).astype(np.float64)
        return xr @ w.T, np.abs(xr) @ np.abs(w).T
    qk, size = sizes(t)
    n_out, nb = raw.shape[0], n // qk
    f = ints(t, raw.reshape(-1, size))
    qw = f["q"].reshape(n_out, nb, -1)
    dw = f["d"].reshape(n_out, nb)
    parts = quantize_act(x, vec_dot_type(t))
    qx = parts[-1 if t not in (Q4_K, Q5_K, Q6_K) else 1].astype(np.int64)
    dx = parts[0].astype(np.float32)
    wscale = dw[:, :, None].astype(np.float64)                 # |w| and |x| per element bound the rounding
    if t in (Q4_K, Q5_K, Q6_K):             # per-sub-block integer sums weighted by the integer scales
        g = 32 if t != Q6_K else 16
        sub = np.einsum("objk,tbjk->otbj", qw.reshape(n_out, nb, -1, g), qx.reshape(len(x), nb, -1, g))
        sumi = (sub * f["sc"].reshape(n_out, 1, nb, -1)).sum(-1)
        wscale = wscale * np.repeat(f["sc"].reshape(n_out, nb, -1), g, axis=-1)
    else:
        sumi = np.einsum("obk,tbk->otb", qw, qx)
    mag = np.abs(qw * wscale).reshape(n_out, n) @ np.abs(qx * dx[..., None].astype(np.float64)).reshape(len(x), n).T
    terms = sumi * (dw[:, None, :] * dx[None, :, :]).astype(f32)
    if t in (Q4_1, Q5_1):
        terms = terms + (f["m"].reshape(n_out, 1, nb) * parts[1].astype(f32)[None]).astype(f32)
        mag = mag + np.abs(f["m"].reshape(n_out, nb)) @ np.abs(parts[1].astype(f32)).T
    if t in (Q4_K, Q5_K):
        bs = parts[2].astype(np.int64).reshape(len(x), nb, 8, 2).sum(-1)
        msum = (f["mn"].reshape(n_out, 1, nb, 8) * bs[None]).sum(-1)
        mterms = msum * (f["dmin"].reshape(n_out, 1, nb) * dx[None]).astype(f32)
        terms = terms - mterms
        mag = mag + np.abs(mterms).sum(-1)
    return terms.sum(-1).T, mag.T


def check_linear(raw, t, n, x, rtol=3e-7):
    lin = QuantLinear.from_raw(raw, t, n)
    assert (lin.qtype, lin.n_out, lin.n_in) == (t, raw.shape[0], n)
    got = lin(x)
    want, mag = slow_matmul(raw, t, n, x)
    assert got.dtype == np.float32 and got.shape == (len(x), raw.shape[0])
    assert np.all(np.abs(got - want) <= rtol * mag + 1e-30), np.max(np.abs(got - want) / (mag + 1e-30))
    return lin


@pytest.mark.parametrize("t", ALL)
def test_quant_linear_random_blocks(t):
    rng = np.random.default_rng(40 + t)
    n = 768
    raw = random_raw(t, 7, n, rng)
    x = (rng.standard_normal((5, n)) * np.exp(rng.standard_normal((5, n)))).astype(np.float32)
    x[1, :256] = 0                                          # an all-zero activation block
    lin = check_linear(raw, t, n, x)
    assert np.array_equal(lin.rows([4, 0, 4]), dequantize(raw, t, n)[[4, 0, 4]])
    assert lin.rows(np.array([[1, 2]])).shape == (1, 2, n)
    assert lin(x[0]).shape == (7,)


@pytest.mark.parametrize("t", [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0])
def test_quant_linear_quantized_weights(t):
    rng = np.random.default_rng(t)
    w = rng.standard_normal((9, 96)).astype(np.float32)
    raw = quantize_weight(w, t)
    assert raw.dtype == np.uint8 and raw.shape == (9, 96 // sizes(t)[0] * sizes(t)[1])
    want = np.asarray(gguf_quantize(w, GGMLQuantizationType(t))).view(np.uint8).reshape(9, -1)
    assert np.array_equal(raw, want)
    assert np.allclose(dequantize(raw, t, 96), w, atol=0.3)
    check_linear(raw, t, 96, rng.standard_normal((4, 96)).astype(np.float32))


def test_quant_linear_differs_from_float_matmul():
    # the activation really is quantized: Q8_0 rounding moves the product well beyond float32 noise
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((16, 256)).astype(np.float32), rng.standard_normal((2, 256)).astype(np.float32)
    raw = quantize_weight(w, Q8_0)
    exact = x.astype(np.float64) @ dequantize(raw, Q8_0, 256).T.astype(np.float64)
    assert np.abs(QuantLinear.from_raw(raw, Q8_0, 256)(x) - exact).max() > 1e-4


@pytest.mark.model
@pytest.mark.parametrize("key", MODELS)
def test_quant_linear_real_tensors(key):
    from pi2.model.gguf_file import GGUFFile
    g = GGUFFile(model_file(key))
    rng = np.random.default_rng(0)
    seen = set()
    for name, ti in g.tensors.items():
        if len(ti.ne) != 2 or ti.type in seen:
            continue
        seen.add(ti.type)
        x = (rng.standard_normal((3, ti.ne[0])) * 2).astype(np.float32)
        check_linear(g.raw(name)[:12], ti.type, ti.ne[0], x)
    assert seen
