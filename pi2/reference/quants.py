# quants.py — the numpy lane of quantization: the specification the C kernels are tested against.
# Does: dequantize ggml blocks (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) bit-exactly;
#       quantize activations exactly as llama.cpp's x86 AVX2/AVX-512 CPU build does (Q8_0, Q8_1, Q8_K,
#       F16, BF16); QuantLinear, what ggml's CPU mul_mat computes: bit for bit in the x86 kernels' float order
#       for Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (qdot.py), up to float32 summation order for the other types;
#       quantize_weight for building fixtures (wraps gguf.quants).
# Does not: read files (model/gguf_file.py) or run the model (reference.py). K-quant blocks live in quants_k.py.
from __future__ import annotations

import numpy as np

from pi2.reference import qdot
from pi2.errors import ModelFormatError, UnsupportedError
from pi2.model.gguf_file import GGML_TYPES
from pi2.reference.quants_k import SPLITTERS as _K_SPLITTERS, _nibbles_k, _scales_mins_k4, q6_k_codes, quantize_q8_k

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q4_K, Q5_K, Q6_K, Q8_K, BF16 = 12, 13, 14, 15, 30

_VEC_DOT_TYPE = {F32: F32, F16: F16, BF16: BF16, Q4_0: Q8_0, Q5_0: Q8_0, Q8_0: Q8_0,
                 Q4_1: Q8_1, Q5_1: Q8_1, Q4_K: Q8_K, Q5_K: Q8_K, Q6_K: Q8_K}
_CHUNK_BLOCKS = 1 << 15          # blocks decoded per step: bounds temporaries to a few MB

def _type_name(qtype: int) -> str:
    return GGML_TYPES.get(qtype, (f"type {qtype}",))[0]


def vec_dot_type(qtype: int) -> int:
    """The activation format llama.cpp multiplies weights of `qtype` with."""
    try:
        return _VEC_DOT_TYPE[qtype]
    except KeyError:
        raise UnsupportedError(f"no matrix multiply for ggml type {_type_name(qtype)}") from None


# ---------------------------------------------------------------- block decoding (32-value types)

def _fp16(b: np.ndarray) -> np.ndarray:
    """(B, 2) uint8 little-endian fp16 bytes -> (B, 1) float32."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(B, 16) bytes -> (B, 32) uint8: low nibbles are values 0..15, high nibbles 16..31."""
    q = np.empty((qs.shape[0], 32), np.uint8)
    np.bitwise_and(qs, 0xF, out=q[:, :16])
    np.right_shift(qs, 4, out=q[:, 16:])
    return q


def _with_high_bits(q: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """Adds 16·bit j of the little-endian u32 in qh (B, 4) to value j of q (B, 32), in place."""
    q |= np.unpackbits(qh, axis=1, bitorder="little") << 4
    return q


def _split_q4_0(raw, w, mins):
    q = _nibbles(raw[:, 2:18])
    q -= 8
    np.multiply(q.view(np.int8), _fp16(raw[:, 0:2]), out=w)


def _split_q4_1(raw, w, mins):
    np.multiply(_nibbles(raw[:, 4:20]), _fp16(raw[:, 0:2]), out=w)
    mins[:] = _fp16(raw[:, 2:4])


def _split_q5_0(raw, w, mins):
    q = _with_high_bits(_nibbles(raw[:, 6:22]), raw[:, 2:6])
    q -= 16
    np.multiply(q.view(np.int8), _fp16(raw[:, 0:2]), out=w)


def _split_q5_1(raw, w, mins):
    np.multiply(_with_high_bits(_nibbles(raw[:, 8:24]), raw[:, 4:8]), _fp16(raw[:, 0:2]), out=w)
    mins[:] = _fp16(raw[:, 2:4])


def _split_q8_0(raw, w, mins):
    np.multiply(raw[:, 2:34].view(np.int8), _fp16(raw[:, 0:2]), out=w)


# type -> splitter(blocks (B, bytes), w (B, values), mins (B, values/32) or None): writes the exact
# scaled part d·q into w and the additive per-32 mins (Q4_1, Q5_1, Q4_K, Q5_K) into mins.
_SPLITTERS = {Q4_0: _split_q4_0, Q4_1: _split_q4_1, Q5_0: _split_q5_0, Q5_1: _split_q5_1,
              Q8_0: _split_q8_0, **_K_SPLITTERS}


def _check(raw: np.ndarray, qtype: int, n_cols: int) -> tuple[np.ndarray, int, int]:
    if qtype not in _VEC_DOT_TYPE:
        raise UnsupportedError(f"pi2 cannot dequantize ggml type {_type_name(qtype)}")
    _, qk, size = GGML_TYPES[qtype]
    raw = np.asarray(raw)
    if raw.ndim == 1:
        raw = raw.reshape(1, -1)
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ModelFormatError(f"{_type_name(qtype)} data must be uint8 (rows, row_bytes), got {raw.dtype} {raw.shape}")
    if n_cols % qk or raw.shape[1] != n_cols // qk * size:
        raise ModelFormatError(f"{_type_name(qtype)} rows of {n_cols} values need {n_cols // qk * size} bytes "
                               f"(and a multiple of {qk} values), got {raw.shape[1]}")
    return np.ascontiguousarray(raw), qk, size


def _float_rows(raw: np.ndarray, qtype: int) -> np.ndarray:
    if qtype == F32:
        return raw.view(np.float32).copy()
    if qtype == F16:
        return raw.view(np.float16).astype(np.float32)
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _split(raw: np.ndarray, qtype: int, n_cols: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(rows, row_bytes) -> scaled part (rows, n_cols) and per-32 mins (rows, n_cols/32) or None."""
    raw, qk, size = _check(raw, qtype, n_cols)
    rows = raw.shape[0]
    if qtype in (F32, F16, BF16):
        return _float_rows(raw, qtype).reshape(rows, n_cols), None
    blocks = raw.reshape(-1, size)
    fn = _SPLITTERS[qtype]
    w = np.empty((blocks.shape[0], qk), np.float32)
    mins = np.empty((blocks.shape[0], qk // 32), np.float32) if qtype in (Q4_1, Q5_1, Q4_K, Q5_K) else None
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        fn(blocks[i:i + _CHUNK_BLOCKS], w[i:i + _CHUNK_BLOCKS], None if mins is None else mins[i:i + _CHUNK_BLOCKS])
    return w.reshape(rows, n_cols), None if mins is None else mins.reshape(rows, n_cols // 32)


def dequantize(raw: np.ndarray, qtype: int, n_cols: int) -> np.ndarray:
    """uint8 (rows, row_bytes) of ggml type `qtype` -> float32 (rows, n_cols), bit-exact with ggml."""
    w, mins = _split(raw, qtype, n_cols)
    if mins is not None:
        w += np.repeat(mins, 32, axis=1)
    return w


# ---------------------------------------------------------------- activation quantizers

def _blocks32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % 32:
        raise ValueError(f"activation rows of {x.shape[-1]} values are not a multiple of 32")
    return x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)


def _quantize_q8_0_f32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AVX2 quantize_row_q8_0: d = amax/127 (f32), q = round-half-even(x·(127/amax)) -> (d32, d16, q)."""
    xb = _blocks32(x)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d32 = amax / np.float32(127)
    inv = np.zeros_like(amax)
    np.divide(np.float32(127), amax, out=inv, where=amax != 0)
    q = np.clip(np.rint(xb * inv), -128, 127).astype(np.int8)
    return d32[..., 0], d32[..., 0].astype(np.float16), q


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round-to-nearest-even, NaNs quieted (ggml_compute_fp32_to_bf16)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(nan, (u >> 16) | 64, r).astype(np.uint16)


def quantize_act(x: np.ndarray, vdt: int) -> tuple:
    """llama.cpp's x86 quantization of activation rows x (..., n) into format `vdt`.

    Q8_0 -> (d float16 (..., nb), q int8 (..., nb, 32)); Q8_1 -> (d, s float16, q), s = fp16(d_f32·Σq);
    Q8_K -> (d float32, q int8 (..., nb, 256), bsums int16 (..., nb, 16));
    F16 -> (float16 values,); BF16 -> (uint16 bf16 bit patterns,); F32 -> (float32 values,).
    """
    if vdt == Q8_0:
        _, d, q = _quantize_q8_0_f32(x)
        return d, q
    if vdt == Q8_1:
        d32, d, q = _quantize_q8_0_f32(x)
        s = (d32 * q.sum(axis=-1, dtype=np.int32).astype(np.float32)).astype(np.float16)
        return d, s, q
    if vdt == Q8_K:
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] % 256:
            raise ValueError(f"activation rows of {x.shape[-1]} values are not a multiple of 256")
        return quantize_q8_k(x)
    if vdt == F16:
        with np.errstate(over="ignore"):                      # beyond 65504 becomes inf, as in ggml
            return (np.asarray(x, dtype=np.float32).astype(np.float16),)
    if vdt == BF16:
        return (bf16_bits(x),)
    if vdt == F32:
        return (np.asarray(x, dtype=np.float32),)
    raise UnsupportedError(f"no activation quantizer for ggml type {_type_name(vdt)}")


def act_values(parts: tuple, vdt: int) -> np.ndarray:
    """quantize_act's output -> the float32 values (..., n) it stands for (d·q for the 8-bit formats)."""
    if vdt in (Q8_0, Q8_1):
        d, q = parts[0], parts[-1]
        v = d.astype(np.float32)[..., None] * q.astype(np.float32)
    elif vdt == Q8_K:
        v = parts[0][..., None] * parts[1].astype(np.float32)
    elif vdt == BF16:
        return (parts[0].astype(np.uint32) << 16).view(np.float32)
    else:
        return parts[0].astype(np.float32)
    return v.reshape(*v.shape[:-2], -1)


def _act_for_matmul(x: np.ndarray, vdt: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Activation values as llama.cpp sees them, plus the per-32 sums that multiply the weight mins:
    Q8_1 -> the stored fp16 s; Q8_K -> d·(bsums[2j] + bsums[2j+1]); otherwise None."""
    parts = quantize_act(x, vdt)
    xv = act_values(parts, vdt)
    if vdt == Q8_1:
        return xv, parts[1].astype(np.float32).reshape(*x.shape[:-1], -1)
    if vdt == Q8_K:
        d, _, bsums = parts
        pair = bsums.reshape(*bsums.shape[:-1], 8, 2).sum(axis=-1, dtype=np.int32).astype(np.float32)
        return xv, (d[..., None] * pair).reshape(*x.shape[:-1], -1)
    return xv, None


# ---------------------------------------------------------------- matrix multiply

def _kernel_blocks(raw: np.ndarray, qtype: int, n_out: int) -> qdot.Weights:
    """(n_out, row_bytes) blocks -> qdot.Weights: integer values q (nb, 32, n_out) in value order, scale d and
    (Q4_1) minimum m, each (nb, n_out) float32."""
    size = GGML_TYPES[qtype][2]
    b = raw.reshape(-1, size)
    col = lambda a: np.ascontiguousarray(a.reshape(n_out, -1).T)  # noqa: E731
    if qtype == Q6_K:
        q = q6_k_codes(b).reshape(n_out, -1, 256).transpose(1, 2, 0)
        sc = b[:, 192:208].view(np.int8).reshape(n_out, -1, 16).transpose(1, 2, 0)
        return qdot.Weights(q=np.ascontiguousarray(q), d=col(_fp16(b[:, 208:210])), sc=np.ascontiguousarray(sc))
    if qtype in (Q4_K, Q5_K):
        sc, mn = _scales_mins_k4(b[:, 4:16])
        if qtype == Q4_K:
            q = _nibbles_k(b[:, 16:144]).reshape(n_out, -1, 256).transpose(1, 2, 0)
        else:   # 5-bit codes: bit j of qh[l] is the 5th bit of value l of sub-block j
            q = _nibbles_k(b[:, 48:176])
            q |= np.unpackbits(b[:, 16:48], axis=1, bitorder="little").reshape(-1, 32, 8).transpose(0, 2, 1) << 4
            q = q.reshape(n_out, -1, 256).transpose(1, 2, 0)
        t8 = lambda a: np.ascontiguousarray(a.reshape(n_out, -1, 8).transpose(1, 2, 0))  # noqa: E731
        return qdot.Weights(q=np.ascontiguousarray(q), d=col(_fp16(b[:, 0:2])), m=col(_fp16(b[:, 2:4])),
                            sc=t8(sc), mn=t8(mn))
    m = None
    if qtype == Q4_1:
        q, m = _nibbles(b[:, 4:20]), _fp16(b[:, 2:4])
    elif qtype == Q5_1:
        q, m = _with_high_bits(_nibbles(b[:, 8:24]), b[:, 4:8]), _fp16(b[:, 2:4])
    elif qtype == Q4_0:
        q = _nibbles(b[:, 2:18]).view(np.int8) - np.int8(8)
    elif qtype == Q5_0:
        q = _with_high_bits(_nibbles(b[:, 6:22]), b[:, 2:6])
        q = (q.view(np.int8) - np.int8(16))
    else:
        q = b[:, 2:34].view(np.int8)
    d = _fp16(b[:, 0:2])
    return qdot.Weights(q=np.ascontiguousarray(q.reshape(n_out, -1, 32).transpose(1, 2, 0)), d=col(d),
                        m=None if m is None else col(m))


_EXACT = {Q4_1: qdot.dot_q4_1_q8_1, Q5_1: qdot.dot_q4_1_q8_1, Q5_0: qdot.dot_q8_lanes, Q8_0: qdot.dot_q8_lanes, Q6_K: qdot.dot_q6_k_q8_k,
          Q4_K: qdot.dot_q4_k_repack, Q5_K: qdot.dot_q5_k_q8_k}


class QuantLinear:
    """One weight matrix (n_out rows of n_in values) kept as raw blocks, decoded on first multiply.

    x @ W^T is computed as llama.cpp's CPU mul_mat does: the activation is quantized to
    vec_dot_type(qtype) and multiplied with the exact scaled weights d·q; weight mins (Q4_1, Q5_1,
    Q4_K, Q5_K) meet the activation only through its block sums (Q8_1's fp16 s, Q8_K's bsums).
    Types in _EXACT run qdot's emulation of the x86 kernel (same float32 bits as llama.cpp); the others
    one BLAS product of the float32 values (same value up to summation order).
    """

    def __init__(self, raw: np.ndarray, qtype: int, n_cols: int):
        self.raw, _, _ = _check(raw, qtype, n_cols)
        self.qtype, self.n_out, self.n_in = qtype, self.raw.shape[0], n_cols
        self.vdt = vec_dot_type(qtype)
        self._w: np.ndarray | None = None      # (n_out, n_in) scaled part, float32
        self._mins: np.ndarray | None = None   # (n_out, n_in/32) additive mins, float32
        self._kw: qdot.Weights | None = None   # the exact kernels' view of the blocks
        self.exact = qtype in _EXACT           # multiply in ggml's float order (qdot), not by BLAS

    @classmethod
    def from_raw(cls, raw: np.ndarray, qtype: int, n_cols: int) -> "QuantLinear":
        return cls(raw, qtype, n_cols)

    def _decode(self) -> None:
        if self._w is None:
            self._w, self._mins = _split(self.raw, self.qtype, self.n_in)

    def _kernel_weights(self):
        """The integer blocks and scales qdot's kernels read, decoded on first use."""
        if self._kw is None:
            self._kw = _kernel_blocks(self.raw, self.qtype, self.n_out)
        return self._kw

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != self.n_in:
            raise ValueError(f"activation has {x.shape[-1]} columns, weight expects {self.n_in}")
        lead = x.shape[:-1]
        if self.exact:
            out = _EXACT[self.qtype](self._kernel_weights(), quantize_act(x.reshape(-1, self.n_in), self.vdt))
            return out.reshape(*lead, self.n_out)
        self._decode()
        xv, sums = _act_for_matmul(x.reshape(-1, self.n_in), self.vdt)
        out = xv @ self._w.T
        if self._mins is not None:
            out += sums @ self._mins.T
        return out.reshape(*lead, self.n_out)

    def rows(self, ids) -> np.ndarray:
        """Dequantized float32 rows `ids` (ggml get_rows)."""
        ids = np.asarray(ids, dtype=np.int64)
        return dequantize(self.raw[ids.reshape(-1)], self.qtype, self.n_in).reshape(*ids.shape, self.n_in)


# ---------------------------------------------------------------- fixtures

_QUANTIZABLE = (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)


def quantize_weight(x: np.ndarray, qtype: int) -> np.ndarray:
    """float32 (rows, n) -> uint8 (rows, row_bytes) of `qtype`, with ggml's reference quantizers (gguf.quants)."""
    from gguf.quants import quantize
    from gguf.constants import GGMLQuantizationType

    if qtype not in _QUANTIZABLE:
        raise UnsupportedError(f"gguf cannot quantize to {_type_name(qtype)}")
    x = np.atleast_2d(np.asarray(x, dtype=np.float32))
    out = np.ascontiguousarray(quantize(x, GGMLQuantizationType(qtype)))
    return out.view(np.uint8).reshape(x.shape[0], -1)


# ---------------------------------------------------------------- the x8 repacked layout (csrc/kernels/pack.h)

PACK_ROWS = 8
# bytes of each field of a block, in order (d, [m], [qh], qs)
PACK_FIELDS = {Q4_0: (2, 16), Q4_1: (2, 2, 16), Q5_0: (2, 4, 16), Q5_1: (2, 2, 4, 16), Q8_0: (2, 32)}


# the K-quants (csrc/kernels/pack_k.c): fields longer than 2 bytes interleaved in 4-byte units
PACK_FIELDS_K = {Q4_K: (2, 2, 12, 128), Q5_K: (2, 2, 12, 32, 128), Q6_K: (128, 64, 16, 2)}


def _k_units(qtype: int) -> list[tuple[int, int]]:
    """(byte offset in the plain block, bytes) of each unit of a K-quant block column, in packed order: Q4_K field
    by field; Q6_K in its kernels' read order (d, scales, then per c in 0..7, h in 0..1: ql units 16h+c and
    16h+8+c, qh unit 8h+c); Q5_K likewise (d, dmin, scales, then per c in 0..7: qh unit c, qs units 8k+c)."""
    if qtype == Q6_K:
        units = [(208, 2)] + [(192 + 4 * a, 4) for a in range(4)]
        for c in range(8):
            for h in range(2):
                units += [(4 * (16 * h + c), 4), (4 * (16 * h + 8 + c), 4), (128 + 4 * (8 * h + c), 4)]
        return units
    if qtype == Q5_K:
        units = [(0, 2), (2, 2)] + [(4 + 4 * a, 4) for a in range(3)]
        for c in range(8):
            units += [(16 + 4 * c, 4)] + [(48 + 32 * k + 4 * c, 4) for k in range(4)]
        return units
    units, off = [], 0
    for f in PACK_FIELDS_K[qtype]:
        u = 2 if f == 2 else 4
        units += [(off + a * u, u) for a in range(f // u)]
        off += f
    return units


def pack_rows(raw: np.ndarray, qtype: int) -> np.ndarray:
    """The x8 layout of raw (n_rows, row_bytes) blocks: per group of 8 rows and block column, each field of
    the 8 rows side by side (the C twin: pi2_repack_rows / pi2_pack_rows). Same shape and bytes, reordered.
    Q4_K, Q5_K and Q6_K: unit by unit (_k_units), 2 or 4 bytes of each of the 8 rows per unit."""
    n, rb = raw.shape
    if qtype in PACK_FIELDS_K:
        ts = sum(PACK_FIELDS_K[qtype])
        g, cols = n // PACK_ROWS, rb // ts
        blocks = raw.reshape(g, PACK_ROWS, cols, ts)                          # group, row, column, byte
        parts = [blocks[..., a:a + u].transpose(0, 2, 1, 3).reshape(g, cols, -1) for a, u in _k_units(qtype)]
        return np.concatenate(parts, axis=2).reshape(n, rb)
    fields = PACK_FIELDS[qtype]
    ts = sum(fields)
    g, cols = n // PACK_ROWS, rb // ts
    blocks = raw.reshape(g, PACK_ROWS, cols, ts)                              # group, row, column, byte
    offs = np.cumsum((0,) + fields)
    parts = []
    for a, b in zip(offs[:-1], offs[1:]):
        f = blocks[..., a:b]                                                   # group, row, column, field
        parts.append(f.transpose(0, 2, 1, 3).reshape(g, cols, -1))             # group, column, row, field
    return np.concatenate(parts, axis=2).reshape(n, rb)
