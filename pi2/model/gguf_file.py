"""gguf_file.py — a lean, validating reader of GGUF v2/v3 files and PowerInfer's `PWRI` variant.

Owns: the header (key/value metadata and tensor infos), bounds checks on every count, size and
offset, and zero-copy access to tensor bytes through one read-only mmap.
Does not: interpret metadata (config.py, tokenizer.py) or decode quant blocks (quants.py).
The `gguf` package's reader builds a Python object per array element, which takes seconds and
hundreds of MB on a 152k-token vocabulary; this one reads numeric arrays with numpy and strings
with one slice each.
"""
from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2.errors import ModelFormatError, UnsupportedError

MAGICS = {b"GGUF": "GGUF", b"PWRI": "PWRI"}

# ggml type id -> (name, values per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}

# KV value type id -> (numpy dtype, struct format); 7 BOOL, 8 STRING, 9 ARRAY are handled apart
_SCALARS = {0: ("<u1", "<B"), 1: ("<i1", "<b"), 2: ("<u2", "<H"), 3: ("<i2", "<h"),
            4: ("<u4", "<I"), 5: ("<i4", "<i"), 6: ("<f4", "<f"), 7: ("<u1", "<B"),
            10: ("<u8", "<Q"), 11: ("<i8", "<q"), 12: ("<f8", "<d")}
_MAX_DIMS = 4
_MAX_NAME = 64
_MAX_KEY = 256


def _is_name(s: str, max_bytes: int) -> bool:
    """A key or tensor name pi2 can print on one line: printable and not too long (garbage from a damaged
    header would otherwise flood or break the one-line error that names it)."""
    return 0 < len(s.encode()) <= max_bytes and s.isprintable()


def _shown(s: str) -> str:
    return repr(s[:40] + ("..." if len(s) > 40 else ""))


def _guard(mm, path: str, fd: int) -> int:
    """Have the C core guard the map (a failing page would otherwise kill the process with SIGBUS); -1 when the
    compiled core is not there (pure-Python uses of the reader)."""
    try:
        from pi2.engine import guard_mapping
    except ImportError:
        return -1
    return guard_mapping(mm, path, fd)


def _unguard(gid: int) -> None:
    if gid >= 0:
        from pi2.engine import unguard_mapping
        unguard_mapping(gid)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: int          # ggml type id
    ne: tuple          # ggml order: ne[0] is contiguous (a row)
    offset: int        # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def shape(self) -> tuple:
        """numpy shape (rows first): reversed ne."""
        return tuple(reversed(self.ne))

    @property
    def row_bytes(self) -> int:
        _, block, size = GGML_TYPES[self.type]
        return (self.ne[0] if self.ne else 1) // block * size


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; every failure is a ModelFormatError."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path
        self.size = len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFormatError(f"{self.path}: truncated or corrupted GGUF header "
                                   f"(reading {what} at byte {self.pos})")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def array(self, what: str):
        etype, count = self.unpack("<IQ", what)
        if etype == 8:
            if count > (self.size - self.pos) // 8:
                raise ModelFormatError(f"{self.path}: {what}: array of {count} strings cannot fit in the file")
            out = []
            buf, pos, size = self.buf, self.pos, self.size
            for _ in range(count):
                if pos + 8 > size:
                    self.pos = pos
                    self.need(8, what)
                (n,) = struct.unpack_from("<Q", buf, pos)
                pos += 8
                if pos + n > size:
                    self.pos = pos
                    self.need(n, what)
                out.append(bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"))
                pos += n
            self.pos = pos
            return out
        if etype == 9:
            raise ModelFormatError(f"{self.path}: {what}: nested arrays are not supported")
        if etype not in _SCALARS:
            raise ModelFormatError(f"{self.path}: {what}: unknown array element type {etype}")
        dtype = _SCALARS[etype][0]
        size = np.dtype(dtype).itemsize
        if count > (self.size - self.pos) // size:
            raise ModelFormatError(f"{self.path}: {what}: array of {count} values runs past the end of the file")
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += count * size
        return arr.astype(bool) if etype == 7 else arr

    def value(self, vtype: int, what: str):
        if vtype == 8:
            return self.string(what)
        if vtype == 9:
            return self.array(what)
        if vtype not in _SCALARS:
            raise ModelFormatError(f"{self.path}: {what}: unknown value type {vtype}")
        v = self.unpack(_SCALARS[vtype][1], what)
        return bool(v) if vtype == 7 else v


class GGUFFile:
    """An opened GGUF/PWRI file: `.kv` (metadata), `.tensors` (name -> TensorInfo), `.magic`."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        p = Path(path)
        if not p.exists():
            raise ModelFormatError(f"{self.path}: no such file")
        if p.is_dir():
            raise ModelFormatError(f"{self.path}: is a directory, not a model file")
        if not p.is_file():  # a FIFO or device would block or have no size
            raise ModelFormatError(f"{self.path}: not a regular file")
        try:
            self._f = open(p, "rb")
        except OSError as e:
            raise ModelFormatError(f"{self.path}: cannot open: {e.strerror}") from None
        self.file_size = os.fstat(self._f.fileno()).st_size
        if self.file_size < 24:
            self._f.close()
            raise ModelFormatError(f"{self.path}: not a GGUF file (only {self.file_size} bytes)")
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
        self._guard = _guard(self._mm, self.path, self._f.fileno())
        # given back when this object goes, even unclosed: a stale guard could claim a later mapping's address
        self._unguard = weakref.finalize(self, _unguard, self._guard)
        try:
            self._parse()
        except Exception:
            self.close()
            raise

    # -- parsing ---------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(memoryview(self._mm), self.path)
        magic = bytes(self._mm[:4])
        if magic not in MAGICS:
            raise ModelFormatError(f"{self.path}: not a GGUF file (magic {magic!r})")
        self.magic = MAGICS[magic]
        cur.pos = 4
        self.version = cur.unpack("<I", "version")
        if self.version not in (2, 3) and self.version & 0xFFFF == 0:
            raise UnsupportedError(f"{self.path}: big-endian GGUF files are not supported")
        if self.version not in (2, 3):
            raise UnsupportedError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = cur.unpack("<qq", "counts")
        # smallest possible entries: a tensor info is 25 bytes, a KV pair 14 (1-byte key, u8 value)
        if n_tensors < 0 or n_kv < 0 or n_tensors > self.file_size // 25 or n_kv > self.file_size // 14:
            raise ModelFormatError(f"{self.path}: corrupted GGUF header "
                                   f"({n_tensors} tensors, {n_kv} keys in a {self.file_size}-byte file)")
        self.kv: dict = {}
        for i in range(n_kv):
            key = cur.string(f"key #{i}")
            if not key or key in self.kv or not _is_name(key, _MAX_KEY):
                raise ModelFormatError(f"{self.path}: key #{i} {_shown(key)} is empty, repeated or not a name")
            vtype = cur.unpack("<I", key)
            self.kv[key] = cur.value(vtype, key)
        align = self.kv.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ModelFormatError(f"{self.path}: general.alignment {align!r} is not a power of two")
        self.alignment = align
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor #{i} name")
            if not _is_name(name, _MAX_NAME - 1):
                raise ModelFormatError(f"{self.path}: tensor #{i}'s name {_shown(name)} is empty, longer than "
                                       f"{_MAX_NAME - 1} bytes or not printable")
            n_dims = cur.unpack("<I", name)
            if n_dims > _MAX_DIMS:
                raise ModelFormatError(f"{self.path}: tensor '{name}' has {n_dims} dimensions (at most 4)")
            ne = tuple(cur.unpack("<q", name) for _ in range(n_dims))
            ttype, offset = cur.unpack("<IQ", name)
            infos.append((name, ne, ttype, offset))
        data_start = cur.pos + (-cur.pos % align)
        self.data_offset = data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, ttype, offset in infos:
            self.tensors[name] = self._check_tensor(name, ne, ttype, offset, data_start)

    def _check_tensor(self, name, ne, ttype, offset, data_start) -> TensorInfo:
        where = f"{self.path}: tensor '{name}'"
        if name in self.tensors:
            raise ModelFormatError(f"{where} appears twice")
        if len(name.encode()) >= _MAX_NAME:
            raise ModelFormatError(f"{where}: name longer than {_MAX_NAME - 1} bytes")
        if ttype not in GGML_TYPES:
            raise ModelFormatError(f"{where} has unknown type id {ttype}")
        if any(d < 0 for d in ne):
            raise ModelFormatError(f"{where} has a negative dimension {ne}")
        n = 1
        for d in ne:
            n *= d
        if n >= 1 << 62:
            raise ModelFormatError(f"{where}: shape {ne} overflows")
        tname, block, size = GGML_TYPES[ttype]
        ne0 = ne[0] if ne else 1
        if ne0 % block:
            raise ModelFormatError(f"{where}: row of {ne0} values is not a multiple of {tname}'s block of {block}")
        nbytes = n // block * size
        if offset % self.alignment:
            raise ModelFormatError(f"{where}: offset {offset} is not aligned to {self.alignment}")
        start = data_start + offset
        if start + nbytes > self.file_size:
            raise ModelFormatError(f"{where}: data runs past the end of the file "
                                   f"(needs bytes {start}..{start + nbytes}, file has {self.file_size}; truncated?)")
        return TensorInfo(name, ttype, tuple(int(d) for d in ne), start, nbytes)

    # -- access ----------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array of shape (rows, row_bytes), zero-copy."""
        t = self.tensors[name]
        ne0 = t.ne[0] if t.ne else 1
        rows = t.n_elements // ne0 if ne0 else 0
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset).reshape(rows, t.row_bytes)

    def get(self, key: str, default=None):
        return self.kv.get(key, default)

    def drop_pages(self) -> None:
        """Let go of the mapped pages read so far (MADV_DONTNEED; they are read again if touched), so a
        layer-at-a-time pass holds one layer of the file, not every layer it has seen."""
        if hasattr(mmap, "MADV_DONTNEED"):
            try:
                self._mm.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):
                pass

    def check_io(self) -> None:
        """Raise if a page of the map failed since it was opened (the file truncated, a device error: the C core
        turned the SIGBUS into a page of zeros), so nothing computed from it goes out."""
        if self._guard >= 0:
            from pi2.engine import check_mapping
            check_mapping(self._guard)

    def close(self) -> None:
        # numpy views may still reference the map; closing it then would fault, so leave that to GC
        try:
            self._mm.close()
        except BufferError:
            pass
        else:
            self._unguard()
            self._guard = -1
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
