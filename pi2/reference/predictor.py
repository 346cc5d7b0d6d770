"""predictor.py — what a pi2-made predictor computes (pi2/convert/predictor.py makes them; csrc/ffn/ runs them):
ĝ, the guessed gate pre-activations whose |act(ĝ)| > t_L − m_L choose the gate rows a token reads.

Owns: decoding the low-bit gate copy (format in pi2/convert/predictor.py: per block of 32 values an F16 scale d
and 1- or 2-bit codes c, weight = d·(2c − (2^b − 1))) and its integer dot product with Q8_0 activations
(LowbitGate), and the low-rank model ĝ = fc2·(fc1·z) over Q8_0 matrices (LowrankGate).
"""
from __future__ import annotations

import numpy as np

from pi2.errors import ModelFormatError
from pi2.model.ffn_layout import PRED_BLOCK as BLOCK
from pi2.model.gguf_file import TYPE_IDS
from pi2.reference.quants import QuantLinear, quantize_act

Q8_0 = TYPE_IDS["Q8_0"]


def _lowbit_split(raw: np.ndarray, bits: int, n: int):
    """(scales float32 (rows, nb), signed integer weights (rows, nb, 32)) of low-bit rows."""
    raw = np.ascontiguousarray(raw, np.uint8)
    nb, per = n // BLOCK, 2 + BLOCK * bits // 8
    if raw.ndim != 2 or raw.shape[1] != nb * per:
        raise ModelFormatError(f"low-bit predictor rows must be {nb * per} bytes for n_embd {n} and {bits} bits "
                               f"(got {raw.shape[-1]})")
    blk = raw.reshape(raw.shape[0], nb, per)
    d = blk[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blk[..., 2:]
    codes = (q[..., None] >> (np.arange(8 // bits, dtype=np.uint8) * bits)) & ((1 << bits) - 1)
    v = 2 * codes.reshape(raw.shape[0], nb, BLOCK).astype(np.int16) - ((1 << bits) - 1)
    return d, v


def lowbit_decode(raw: np.ndarray, bits: int, n: int) -> np.ndarray:
    d, v = _lowbit_split(raw, bits, n)
    return (d[..., None] * v).reshape(raw.shape[0], n)


class LowbitGate:
    """ĝ = lowbit_gate · x with the arithmetic stated at the top of this file."""

    def __init__(self, raw: np.ndarray, bits: int, n_embd: int):
        self.raw, self.bits, self.n_in = raw, bits, n_embd
        self.d, v = _lowbit_split(raw, bits, n_embd)
        self.v = np.ascontiguousarray(v.transpose(1, 2, 0).astype(np.float32))    # (nb, 32, rows)
        self.n_out = raw.shape[0]

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, np.float32))
        dx, qx = quantize_act(x, Q8_0)                       # (T, nb) f16, (T, nb, 32) int8
        dx = dx.astype(np.float32)
        acc = np.zeros((x.shape[0], self.n_out), np.float32)
        q = qx.astype(np.float32)
        for b in range(self.v.shape[0]):
            sumi = q[:, b, :] @ self.v[b]                    # integers below 2^24: exact in any order
            acc += sumi * (self.d[None, :, b] * dx[:, b, None])
        return acc


class LowrankGate:
    def __init__(self, fc1: QuantLinear, fc2: QuantLinear):
        self.fc1, self.fc2 = fc1, fc2

    @property
    def nbytes(self) -> int:
        return int(self.fc1.raw.nbytes + self.fc2.raw.nbytes)

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return self.fc2(self.fc1(z))
