"""gguf_map.py — where every number of a GGUF/PWRI file's header lies, for the mutator.

Owns: `walk(blob) -> Layout`: the byte position and width of each count, length, type, dimension, offset and
scalar value; the span of each key/value record and tensor-info record; the structure boundaries (every record's
start, the data section, each tensor's data). A header it cannot walk (a damaged seed) gives what it walked.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass
class Field:
    pos: int
    width: int        # bytes: 1, 2, 4 or 8
    kind: str         # count, strlen, vtype, etype, ndims, ne, ttype, offset, value
    name: str = ""    # the key or tensor it belongs to


@dataclass
class Layout:
    fields: list = field(default_factory=list)
    kv_spans: list = field(default_factory=list)       # (start, end, key)
    tensor_spans: list = field(default_factory=list)   # (start, end, name)
    boundaries: list = field(default_factory=list)
    n_tensors_pos: int = 8
    n_kv_pos: int = 16
    header_end: int = 24
    data_start: int = 0
    alignment: int = 32


class _Stop(Exception):
    pass


def walk(blob: bytes) -> Layout:
    lay = Layout()
    pos = 24
    offsets: list = []
    n = len(blob)

    def take(fmt: str, at: int):
        size = struct.calcsize(fmt)
        if at + size > n:
            raise _Stop
        return struct.unpack_from(fmt, blob, at)[0], at + size

    def string(at: int, kind: str, name: str):
        ln, p = take("<Q", at)
        lay.fields.append(Field(at, 8, kind, name))
        if p + ln > n:
            raise _Stop
        return blob[p:p + ln].decode("utf-8", "replace"), p + ln

    lay.fields += [Field(4, 4, "version"), Field(8, 8, "count", "n_tensors"), Field(16, 8, "count", "n_kv")]
    lay.boundaries += [0, 4, 8, 16, 24]
    try:
        n_tensors, _ = take("<q", 8)
        n_kv, _ = take("<q", 16)
        for _ in range(min(n_kv, 1 << 16)):
            start = pos
            key, pos = string(pos, "strlen", "key")
            vtype, p = take("<I", pos)
            lay.fields.append(Field(pos, 4, "vtype", key))
            pos = p
            if vtype == 8:
                _, pos = string(pos, "strlen", key)
            elif vtype == 9:
                etype, p = take("<I", pos)
                lay.fields.append(Field(pos, 4, "etype", key))
                count, p2 = take("<Q", p)
                lay.fields.append(Field(p, 8, "count", key))
                pos = p2
                if etype == 8:
                    for i in range(min(count, 1 << 20)):
                        if i < 64:
                            _, pos = string(pos, "strlen", key)
                        else:
                            ln, p = take("<Q", pos)
                            pos = p + ln
                elif etype in _SCALAR_SIZES:
                    w = _SCALAR_SIZES[etype]
                    for i in range(min(count, 8)):
                        lay.fields.append(Field(pos + i * w, w, "value", key))
                    pos += count * w
                else:
                    raise _Stop
            elif vtype in _SCALAR_SIZES:
                w = _SCALAR_SIZES[vtype]
                lay.fields.append(Field(pos, w, "value", key))
                if key == "general.alignment" and vtype == 4:
                    lay.alignment = take("<I", pos)[0] or 32
                pos += w
            else:
                raise _Stop
            if pos > n:
                raise _Stop
            lay.kv_spans.append((start, pos, key))
            lay.boundaries.append(pos)
        for _ in range(min(n_tensors, 1 << 16)):
            start = pos
            name, pos = string(pos, "strlen", "tensor")
            nd, p = take("<I", pos)
            lay.fields.append(Field(pos, 4, "ndims", name))
            pos = p
            for d in range(min(nd, 4)):
                lay.fields.append(Field(pos + 8 * d, 8, "ne", name))
            pos += 8 * min(nd, 4)
            lay.fields.append(Field(pos, 4, "ttype", name))
            lay.fields.append(Field(pos + 4, 8, "offset", name))
            off, _ = take("<Q", pos + 4)
            pos += 12
            lay.tensor_spans.append((start, pos, name))
            lay.boundaries.append(pos)
            offsets.append(off)                 # relative to the data section
        lay.header_end = pos
        lay.data_start = pos + (-pos % lay.alignment)
        lay.boundaries += [lay.data_start] + [lay.data_start + o for o in offsets if o < n]
    except _Stop:
        lay.header_end = pos
    lay.boundaries = sorted(set(b for b in lay.boundaries if 0 <= b <= n))
    return lay
