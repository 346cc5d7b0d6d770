"""mutate.py — damage a GGUF file the ways real files go wrong, deterministically from a random generator.

Owns: `mutate(blob, layout, rng) -> (blob, description)` with one to three of: bit flips (header-biased),
integer boundary values written into a count/length/type/dimension/offset/value field, truncation at (or
next to) a structure boundary, a key/value or tensor-info record duplicated or removed (its count kept
consistent, or not), and an array count or string length pointed past the end.
"""
from __future__ import annotations

import struct

from tests.fuzz.gguf_map import Layout, walk

BOUNDARY = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 255, 256, 4095, 4096, 65535, 65536, 10**8, 10**9,
            2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
NUMBERS = ("value", "ne", "ttype", "offset", "ndims", "etype", "count")
_FMT = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def _put(b: bytearray, pos: int, width: int, value: int) -> None:
    b[pos:pos + width] = struct.pack(_FMT[width], value % (1 << (8 * width)))


def _get(b: bytes, pos: int, width: int) -> int:
    return struct.unpack_from(_FMT[width], b, pos)[0]


def _boundary(b: bytearray, lay: Layout, rng, n: int) -> str:
    fields = [f for f in lay.fields if f.pos + f.width <= n]
    numbers = [f for f in fields if f.kind in NUMBERS]
    if numbers and rng.random() < 0.7:      # mostly the numbers a model is built from, less the string lengths
        fields = numbers
    if not fields:
        return "no field left"
    f = fields[int(rng.integers(len(fields)))]
    old = _get(b, f.pos, f.width)
    r = rng.random()
    if r < 0.6:
        v = BOUNDARY[int(rng.integers(len(BOUNDARY)))]
    elif r < 0.75:
        v = old + int(rng.choice([-2, -1, 1, 2]))
    elif r < 0.85:
        v = n + int(rng.integers(-64, 64))           # about the file's size
    elif r < 0.95:
        v = -int(rng.choice([1, 2, 2**31]))          # negative in a signed reading
    else:
        v = old * int(rng.choice([2, 10, 1000]))
    _put(b, f.pos, f.width, v)
    return f"{f.kind} of {f.name or 'header'} at {f.pos}: {old} -> {v % (1 << (8 * f.width))}"


def _bitflip(b: bytearray, lay: Layout, rng) -> str:
    k = int(rng.integers(1, 9))
    end = min(lay.header_end if rng.random() < 0.8 else len(b), len(b))
    if end <= 0:
        return "no byte to flip"
    at = sorted(int(x) for x in rng.integers(0, end, k))
    for p in at:
        b[p] ^= 1 << int(rng.integers(8))
    return f"{k} bit flips at {at[:4]}"


def _record(b: bytearray, lay: Layout, rng, duplicate: bool) -> tuple:
    spans, count_pos = ((lay.kv_spans, lay.n_kv_pos) if lay.kv_spans and (not lay.tensor_spans or rng.random() < 0.5)
                        else (lay.tensor_spans, lay.n_tensors_pos))
    if not spans:
        return b, "no record to change"
    s, e, name = spans[int(rng.integers(len(spans)))]
    keep_count = rng.random() < 0.15
    if duplicate:
        out = b[:e] + b[s:e] + b[e:]
        delta = 1
    else:
        out = b[:s] + b[e:]
        delta = -1
    if not keep_count:
        _put(out, count_pos, 8, _get(out, count_pos, 8) + delta)
    what = "duplicated" if duplicate else "removed"
    return out, f"{'key' if count_pos == lay.n_kv_pos else 'tensor'} {name!r} {what}" + (", count kept" if keep_count else "")


def _truncate(b: bytearray, lay: Layout, rng) -> tuple:
    at = lay.boundaries[int(rng.integers(len(lay.boundaries)))] if lay.boundaries else len(b) // 2
    at = max(0, min(len(b) - 1, at + int(rng.choice([0, 0, 0, -1, 1, -4, 3]))))
    return b[:at], f"truncated at {at} of {len(b)}"


def mutate(blob: bytes, rng, layout: Layout | None = None) -> tuple:
    """One to three mutations of `blob`; returns (bytes, '; '-joined description)."""
    b = bytearray(blob)
    notes = []
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        lay = layout if layout is not None and not notes else walk(bytes(b))
        r = rng.random()
        if r < 0.45 and lay.fields:
            notes.append(_boundary(b, lay, rng, len(b)))
        elif r < 0.65:
            notes.append(_bitflip(b, lay, rng))
        elif r < 0.75:
            b, note = _truncate(b, lay, rng)
            notes.append(note)
        elif r < 0.87:
            b, note = _record(b, lay, rng, duplicate=True)
            notes.append(note)
        else:
            b, note = _record(b, lay, rng, duplicate=False)
            notes.append(note)
    return bytes(b), "; ".join(notes)
