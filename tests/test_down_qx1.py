"""test_down_qx1.py — Q4_1 and Q5_1 down rows (`--ffn-type q4_1 | q5_1`): the reference's integer group sum with
8-bit activations (pi2/reference/down_qx1.py) against a scalar model of its definition, its error against the
float sum of the same rows, and the grouping of axpy_rows. The C engine's equality with it is in
tests/test_ffn_sparse_c.py (the `ud` / `ud4` files) and tests/c/kernel_selftest.c (every kernel)."""
from __future__ import annotations

import numpy as np
import pytest

from pi2.reference import sparse_ffn as sparse
from pi2.reference.down_qx1 import axpy_rows_qx1, group_part
from pi2.reference.quants import Q4_1, Q5_1, QuantLinear, dequantize, quantize_weight

F32_MAX = np.finfo(np.float32).max


def scalar_part(p, raw, qtype, n):
    """The definition, one block and one value at a time in float32 (numpy scalars) and Python integers."""
    bs = 20 if qtype == Q4_1 else 24
    out = np.zeros(n, np.float32)
    for b in range(n // 32):
        blk = [raw[i, b * bs:(b + 1) * bs] for i in range(len(p))]
        d = [blk[i][0:2].view(np.float16)[0].astype(np.float32) for i in range(len(p))]
        m = [blk[i][2:4].view(np.float16)[0].astype(np.float32) for i in range(len(p))]
        a = [np.float32(p[i]) * d[i] for i in range(len(p))]
        M = np.float32(0)
        for i in range(len(p)):
            M = np.float32(M + np.float32(p[i]) * m[i])
        mx = np.float32(0)
        for v in a:
            mx = max(mx, np.float32(abs(v)))
        vals = []
        for i in range(len(p)):
            qs = blk[i][4:20] if qtype == Q4_1 else blk[i][8:24]
            qh = 0 if qtype == Q4_1 else int.from_bytes(bytes(blk[i][4:8]), "little")
            vals.append([(int(qs[j % 16]) >> (4 * (j // 16)) & 15) | ((qh >> j) & 1) << 4 for j in range(32)])
        ok = np.float32(1e-30) <= mx <= F32_MAX
        for j in range(32):
            if ok:
                inv, s = np.float32(127) / mx, mx / np.float32(127)
                z = [int(np.rint(a[i] * inv)) for i in range(len(p))]
                assert all(abs(v) <= 127 for v in z)
                acc = sum(z[i] * vals[i][j] for i in range(len(p)))
                out[b * 32 + j] = np.float32(s * np.float32(acc)) + M
            else:
                out[b * 32 + j] = M
    return out


@pytest.mark.parametrize("qtype", [Q4_1, Q5_1])
def test_group_part_is_its_definition(qtype):
    rng = np.random.default_rng(1)
    n = 64
    for k in (1, 3, 8, 64):
        raw = quantize_weight(rng.normal(size=(k, n)).astype(np.float32), qtype).reshape(k, -1)
        p = (rng.normal(size=k) * 10.0 ** rng.uniform(-3, 1, size=k)).astype(np.float32)
        p[0] = 0
        assert np.array_equal(group_part(p, raw, qtype, n), scalar_part(p, raw, qtype, n))
    zero = np.zeros(3, np.float32)
    assert np.array_equal(group_part(zero, raw[:3], qtype, n), scalar_part(zero, raw[:3], qtype, n))


@pytest.mark.parametrize("qtype", [Q4_1, Q5_1])
def test_close_to_float_sum(qtype):
    """The 8-bit activations of a 64-neuron group cost NMSE ~1.5e-4 of the output here (about 1.2 % relative
    error, 4-6x the dense product's q8 activations of 32 neurons; far below the 4- and 5-bit rows' own)."""
    rng = np.random.default_rng(2)
    n_ff, e = 300, 96
    raw = quantize_weight(rng.normal(size=(n_ff, e)).astype(np.float32), qtype).reshape(n_ff, -1)
    h = rng.normal(size=(3, n_ff)).astype(np.float32)
    h[rng.random(h.shape) < 0.3] = 0
    got = axpy_rows_qx1(h, raw, qtype, e, sparse.GROUP)
    want = h.astype(np.float64) @ dequantize(raw, qtype, e).astype(np.float64)
    nmse = float(((got - want) ** 2).sum() / (want ** 2).sum())
    assert 0 < nmse < 5e-4
    assert np.array_equal(sparse.axpy_rows(h, QuantLinear.from_raw(raw, qtype, e)), got)
