# quants_k.py — numpy lane of the K-quants (256-value super-blocks): Q4_K, Q5_K, Q6_K decoding and
# the Q8_K activation quantizer, as llama.cpp's CPU build computes them.
# Does: split K-quant blocks into their exact scaled part d·sc·q and per-32 mins (−dmin·mn);
#       quantize activations to Q8_K (d f32, q int8, bsums int16) like quantize_row_q8_K_ref.
# Does not: dispatch on type ids, multiply, or validate shapes (quants.py does).
# Invariant: dequantized = scaled + repeat(mins, 32), bit-exact with ggml's dequantize_row_*.
from __future__ import annotations

import numpy as np

QK_K = 256


def _fp16(b: np.ndarray) -> np.ndarray:
    """(B, 2) uint8 little-endian fp16 bytes -> (B, 1) float32."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _scales_mins_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of Q4_K/Q5_K -> 6-bit scales and mins, each (B, 8) float32."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _nibbles_k(qs: np.ndarray) -> np.ndarray:
    """(B, 128) quant bytes -> (B, 8, 32) uint8: chunk c's low nibbles are sub-block 2c, high ones 2c+1."""
    qs = qs.reshape(-1, 4, 32)
    q = np.empty((qs.shape[0], 4, 2, 32), np.uint8)
    np.bitwise_and(qs, 0xF, out=q[:, :, 0])
    np.right_shift(qs, 4, out=q[:, :, 1])
    return q.reshape(-1, 8, 32)


def split_q4_k(raw: np.ndarray, w: np.ndarray, mins: np.ndarray) -> None:
    """(B, 144) Q4_K blocks -> w (B, 256) = d·sc·q and mins (B, 8) = −dmin·mn, float32."""
    d, dmin = _fp16(raw[:, 0:2]), _fp16(raw[:, 2:4])
    sc, mn = _scales_mins_k4(raw[:, 4:16])
    np.multiply((d * sc)[:, :, None], _nibbles_k(raw[:, 16:144]), out=w.reshape(-1, 8, 32))
    np.negative(dmin * mn, out=mins)


def split_q5_k(raw: np.ndarray, w: np.ndarray, mins: np.ndarray) -> None:
    """(B, 176) Q5_K blocks -> w (B, 256), mins (B, 8); bit j of qh[l] is the 5th bit of value l of sub-block j."""
    d, dmin = _fp16(raw[:, 0:2]), _fp16(raw[:, 2:4])
    sc, mn = _scales_mins_k4(raw[:, 4:16])
    bits = np.unpackbits(raw[:, 16:48], axis=1, bitorder="little").reshape(-1, 32, 8).transpose(0, 2, 1)
    q = _nibbles_k(raw[:, 48:176])
    q |= bits << 4
    np.multiply((d * sc)[:, :, None], q, out=w.reshape(-1, 8, 32))
    np.negative(dmin * mn, out=mins)


def q6_k_codes(raw: np.ndarray) -> np.ndarray:
    """(B, 210) Q6_K blocks -> the unsigned 6-bit codes (B, 256) uint8 in value order (value = code − 32)."""
    ql = raw[:, 0:128].reshape(-1, 2, 2, 32)               # [half, ql offset 0/32, l]
    q = np.empty((ql.shape[0], 2, 2, 2, 32), np.uint8)    # [half, nibble, offset, l] = [half, k, l]
    np.bitwise_and(ql, 0xF, out=q[:, :, 0])
    np.right_shift(ql, 4, out=q[:, :, 1])
    q = q.reshape(-1, 2, 4, 32)
    qh = raw[:, 128:192].reshape(-1, 2, 1, 32)
    q |= ((qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3) << 4
    return q.reshape(-1, 256)


def split_q6_k(raw: np.ndarray, w: np.ndarray, mins: None) -> None:
    """(B, 210) Q6_K blocks -> w (B, 256) = d·scale·(q − 32), float32; Q6_K has no mins."""
    q = q6_k_codes(raw) - np.uint8(32)
    sc = raw[:, 192:208].view(np.int8).astype(np.float32)
    d = _fp16(raw[:, 208:210])
    np.multiply((d * sc)[:, :, None], q.view(np.int8).reshape(-1, 16, 16), out=w.reshape(-1, 16, 16))


SPLITTERS = {12: split_q4_k, 13: split_q5_k, 14: split_q6_k}


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of x (..., n) -> Q8_K: d f32 (..., nb), q int8 (..., nb, 256), bsums int16 (..., nb, 16).

    As quantize_row_q8_K_ref (x86 uses it): the first element of largest |x| keeps its sign as `max`,
    iscale = −127/max, q = min(127, round-half-even(iscale·x)), d = 1/iscale; an all-zero block gives d = 0.
    """
    x = np.asarray(x, dtype=np.float32)
    lead, n = x.shape[:-1], x.shape[-1]
    xb = x.reshape(-1, n // QK_K, QK_K)
    imax = np.abs(xb).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(xb, imax, axis=-1)
    nz = mx != 0
    iscale = np.zeros_like(mx)
    np.divide(np.float32(-127.0), mx, out=iscale, where=nz)
    q = np.minimum(np.rint(xb * iscale), 127).astype(np.int8)
    bsums = q.reshape(q.shape[0], q.shape[1], 16, 16).sum(axis=-1, dtype=np.int32).astype(np.int16)
    d = np.zeros_like(mx)
    np.divide(np.float32(1.0), iscale, out=d, where=nz)
    nb = n // QK_K
    return d.reshape(*lead, nb), q.reshape(*lead, nb, QK_K), bsums.reshape(*lead, nb, 16)
