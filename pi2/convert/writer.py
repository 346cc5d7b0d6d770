# writer.py — writing the pi2 file: GGUF metadata with the source's value types, tensors, and the safe
# replace (a temporary file beside the output, renamed only after a complete, flushed write).
# Owns: the KV type scan of the source header, GGUFWriter setup (alignment 4096), tensors made only when the
#       write reaches them (Later: one layer in memory at a time), temporary-file naming, clean-up of a failed
#       write and of stale temporary files left by killed conversions.
# Does not: decide tensor contents (__init__.py, layout.py).
from __future__ import annotations

import errno
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from tqdm import tqdm

from pi2.errors import Pi2Error

ALIGNMENT = 4096
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class ConvertError(Pi2Error):
    """A conversion that could not be completed (nothing is left under the output name)."""


@dataclass
class Later:
    """Tensors whose data is made when the write reaches them, so a converter holds one group (a layer) at a time:
    specs [(name, shape, numpy dtype, raw ggml type or None)] as write_gguf's tuples would give them, and make()
    returning the arrays in that order."""
    specs: list
    make: Callable[[], list]


def kv_types(path) -> dict:
    """key -> (value type, array element type or None), read from the GGUF header."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _kv_types(buf)


def _kv_types(buf) -> dict:
    """kv_types of a mapped file: only the header's pages are read (f.read() would hold the whole file)."""
    n_kv = struct.unpack_from("<q", buf, 16)[0]
    pos, out = 24, {}

    def u(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    for _ in range(n_kv):
        n = u("<Q")
        key = buf[pos:pos + n].decode("utf-8", "replace")
        pos += n
        vt = u("<I")
        sub = None
        if vt == 8:
            n = u("<Q")
            pos += n
        elif vt == 9:
            sub, count = u("<I"), u("<Q")
            if sub == 8:
                for _ in range(count):
                    n = u("<Q")
                    pos += n
            else:
                pos += count * _SIZES[sub]
        else:
            pos += _SIZES[vt]
        out[key] = (vt, sub)
    return out


def add_kv(w: GGUFWriter, key: str, value, vtype: int, sub: int | None) -> None:
    vt = GGUFValueType(vtype)
    if vt == GGUFValueType.ARRAY:
        vals = value.tolist() if isinstance(value, np.ndarray) else list(value)
        if not vals:
            return                      # GGUFWriter cannot write empty arrays
        w.add_key_value(key, vals, vt, sub_type=GGUFValueType(sub))
    else:
        w.add_key_value(key, value, vt)


def temp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.{os.getpid()}.tmp")


def remove_stale_temps(out: Path) -> None:
    """Remove temporary files of earlier conversions to `out` whose process is gone."""
    pat = re.compile(rf"^\.{re.escape(out.name)}\.(\d+)\.tmp$")
    try:
        names = os.listdir(out.parent)
    except OSError:
        return
    for name in names:
        m = pat.match(name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue                     # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(out.parent / name)
        except OSError:
            pass


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return "no space left on device"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return str(e) or type(e).__name__


def _specs(t) -> list:
    """[(name, shape, dtype, raw)] of a write_gguf entry: a Later group's, or a (name, array, raw) tuple's."""
    return t.specs if isinstance(t, Later) else [(t[0], t[1].shape, t[1].dtype, t[2])]


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


def _info(w: GGUFWriter, name: str, shape, dtype, raw) -> None:
    w.add_tensor_info(name, tuple(shape), np.dtype(dtype), _nbytes(shape, dtype),
                      raw_dtype=None if raw is None else GGMLQuantizationType(raw))


def _write_data(w: GGUFWriter, tensors: list, progress: bool, release) -> None:
    """The tensors' data in order, each Later group made just before it is written and dropped after; release()
    (when given) after each, e.g. to let go of the source pages a copied tensor was read from."""
    total = sum(_nbytes(sh, dt) for t in tensors for _, sh, dt, _ in _specs(t))
    bar = tqdm(desc="Writing", total=total, unit="byte", unit_scale=True, disable=not progress)
    for t in tensors:
        if not isinstance(t, Later):
            w.write_tensor_data(t[1])
            bar.update(t[1].nbytes)
            if release is not None:
                release()
            continue
        arrays = t.make()
        for (name, shape, dtype, _), arr in zip(t.specs, arrays, strict=True):
            if tuple(arr.shape) != tuple(shape) or arr.dtype != np.dtype(dtype):
                raise ValueError(f"{name}: made {arr.dtype}{tuple(arr.shape)}, announced {np.dtype(dtype)}"
                                 f"{tuple(shape)}")
            w.write_tensor_data(np.ascontiguousarray(arr))
            bar.update(arr.nbytes)
        arrays = arr = None         # the group's arrays go before the next group is made
        if release is not None:
            release()
    bar.close()


def write_gguf(out: Path, arch: str, kvs: list, tensors: list, progress: bool = True, check=None,
               release=None) -> None:
    """kvs: [(key, value, vtype, sub)]; tensors: [(name, array, raw_dtype or None)] with arrays in numpy
    row order, or Later groups; release() after each is written (optional). Writes to a temporary file in out's
    directory and renames it over `out` at the end, after `check()` (when given) has not raised."""
    out = Path(out)
    remove_stale_temps(out)
    tmp = temp_path(out)
    w = GGUFWriter(str(tmp), arch)
    try:
        w.add_custom_alignment(ALIGNMENT)
        for key, value, vt, sub in kvs:
            add_kv(w, key, value, vt, sub)
        for t in tensors:
            for name, shape, dtype, raw in _specs(t):
                _info(w, name, shape, dtype, raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        _write_data(w, tensors, progress, release)
        for f in w.fout or []:
            f.flush()
            os.fsync(f.fileno())
        w.close()
        if check is not None:       # e.g. the source's pages read whole (a failed one reads as zeros)
            check()
        os.replace(tmp, out)
    except BaseException as e:
        try:
            w.close()
        except Exception:
            pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ConvertError(f"cannot write {out}: {_reason(e)} (nothing was written under that name)") from e
