"""gguf_split.py — models split across files as llama.cpp's gguf-split writes them: NAME-00001-of-0000N.gguf …
NAME-0000N-of-0000N.gguf, the first holding the metadata, each holding `split.no`, `split.count` and some of the
tensors (`split.tensors.count` in all).

Owns: open_gguf (a file, or given the first part every part: SplitGGUF), the parts' names (llama.cpp's
llama_split_path), the checks llama.cpp makes on them, and where each part's bytes sit in the one address range
the C core maps them into (part k at a 64 KiB-aligned base after part k - 1: a tensor's offset is its part's base
plus its offset in the part). Does not: read GGUF (gguf_file.py).
"""
from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from pi2.errors import ModelFormatError, UsageError
from pi2.model.gguf_file import GGUFFile

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)
PART_ALIGN = 65536      # a page multiple for every kernel pi2 runs on (4, 16 and 64 KiB pages)
_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_path(prefix: str, no: int, count: int) -> str:
    """llama_split_path: part `no` (0-based) of `count`."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def part_paths(first: str, count: int) -> list:
    """Every part's path, from the first part's."""
    m = _NAME.match(first)
    if m is None or int(m["no"]) != 1 or int(m["count"]) != count:
        raise ModelFormatError(f"{first}: split.count is {count}, but the name does not end in "
                               f"-00001-of-{count:05d}.gguf (llama.cpp's gguf-split names)")
    return [part_path(m["prefix"], k, count) for k in range(count)]


def _int_key(f: GGUFFile, key: str):
    v = f.kv.get(key)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise ModelFormatError(f"{f.path}: {key} is {v!r}, not a count")
    return v


def open_gguf(path) -> GGUFFile:
    """The GGUF file at `path`; the first part of a split model opens every part (a SplitGGUF)."""
    f = GGUFFile(path)
    try:
        count, no = _int_key(f, SPLIT_COUNT), _int_key(f, SPLIT_NO)
        if count is None or count <= 1:
            return f
        if no != 0:
            m = _NAME.match(f.path)
            first = part_path(m["prefix"], 0, count) if m else "its first part"
            raise UsageError(f"{f.path} is part {(no or 0) + 1} of {count} of a split model; give the first part, "
                             f"{os.path.basename(first)}")
        return SplitGGUF(f, part_paths(f.path, count))
    except BaseException:
        f.close()
        raise


class SplitGGUF(GGUFFile):
    """The parts of a split model as one GGUFFile: the first part's metadata, every part's tensors (offsets in the
    parts' common range, see module doc); raw() reads the part that holds the tensor. `parts`: (path, base, size)."""

    def __init__(self, first: GGUFFile, paths: list):     # noqa: super().__init__ is not called: `first` is opened
        self._files = [first]
        try:
            self._open(first, paths)
        except BaseException:
            self.close()
            raise

    def _open(self, first: GGUFFile, paths: list) -> None:
        count = len(paths)
        for attr in ("path", "magic", "version", "kv", "alignment", "data_offset"):
            setattr(self, attr, getattr(first, attr))
        self.tensors, self._where = {}, {}
        self.parts, base = [], 0
        for k, path in enumerate(paths):
            if k:
                if not os.path.exists(path):
                    raise ModelFormatError(f"{first.path}: part {k + 1} of {count} of the split model is missing "
                                           f"({path})")
                self._files.append(GGUFFile(path))
            f = self._files[k]
            if _int_key(f, SPLIT_NO) != k or _int_key(f, SPLIT_COUNT) != count:
                raise ModelFormatError(f"{f.path}: split.no {f.kv.get(SPLIT_NO)!r} / split.count "
                                       f"{f.kv.get(SPLIT_COUNT)!r}, expected part {k} of {count}")
            base = -(-base // PART_ALIGN) * PART_ALIGN
            self.parts.append((f.path, base, f.file_size))
            for name, t in f.tensors.items():
                if name in self.tensors:
                    raise ModelFormatError(f"{f.path}: tensor '{name}' appears in two parts")
                self.tensors[name] = dataclasses.replace(t, offset=base + t.offset)
                self._where[name] = f
            base += f.file_size
        self.file_size = sum(size for _, _, size in self.parts)
        want = _int_key(first, SPLIT_TENSORS)
        if want is not None and want != len(self.tensors):
            raise ModelFormatError(f"{first.path}: split.tensors.count is {want}, the parts hold {len(self.tensors)} "
                                   "tensors")

    def raw(self, name: str) -> np.ndarray:
        return self._where[name].raw(name)

    def part_of(self, name: str) -> int:
        """The index of the part that holds tensor `name`."""
        return self._files.index(self._where[name])

    def drop_pages(self) -> None:
        for f in self._files:
            f.drop_pages()

    def lock(self) -> str:
        for f in self._files:
            why = f.lock()
            if why:
                return why
        return ""

    def check_io(self) -> None:
        for f in self._files:
            f.check_io()

    def close(self) -> None:
        for f in self._files:
            f.close()


def is_split(f: GGUFFile) -> bool:
    return isinstance(f, SplitGGUF)


def file_parts(f: GGUFFile) -> list:
    """(path, base, size) of each file of `f`: one for a plain file."""
    return f.parts if isinstance(f, SplitGGUF) else [(f.path, 0, f.file_size)]
