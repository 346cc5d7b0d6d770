"""test_convert_writer.py — pi2/convert/writer.py's memory behaviour: tensors announced up front and made when the
write reaches them (Later groups) give the same bytes as arrays handed over whole; each group is made only after
the previous one was written and let go; a group that makes other shapes than it announced fails the write and
leaves nothing under the output name; the source header is read without reading the file."""
import gc
import weakref

import numpy as np
import pytest

from pi2.convert import writer
from pi2.convert.writer import ConvertError, Later, kv_types, write_gguf
from pi2.model.gguf_file import GGUFFile

KVS = [("general.name", "t", 8, None), ("t.count", 3, 4, None)]


def _groups(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [[(f"blk.{i}.a", rng.standard_normal((4, 64)).astype(np.float32), None),
             (f"blk.{i}.b", rng.integers(0, 255, (8, 68), dtype=np.uint8), 8),       # Q8_0 rows as bytes
             (f"blk.{i}.c", rng.integers(-9, 9, (2, 5, 7), dtype=np.int32), None)] for i in range(3)]


def _later(group: list, log: list, made: list, tmp=None) -> Later:
    def make():
        assert tmp is None or tmp.stat().st_size > 0, "made before the header was written"
        log.append(group[0][0])
        arrays = [a.copy() for _, a, _ in group]
        made.append([weakref.ref(a) for a in arrays])
        return arrays
    return Later([(n, a.shape, a.dtype, raw) for n, a, raw in group], make)


def test_later_groups_are_made_in_order_one_at_a_time(tmp_path):
    groups = _groups()
    head = ("token_embd.weight", np.arange(64, dtype=np.float32).reshape(2, 32), None)
    log, made, alive = [], [], []

    def release():
        gc.collect()
        alive.append(sum(r() is not None for refs in made for r in refs))

    tmp = writer.temp_path(tmp_path / "lazy.gguf")
    write_gguf(tmp_path / "lazy.gguf", "llama", KVS, [head] + [_later(g, log, made, tmp) for g in groups],
               progress=False, release=release)
    assert log == [g[0][0] for g in groups]
    assert alive == [0, 0, 0, 0], "a group's arrays outlived its write"
    f = GGUFFile(tmp_path / "lazy.gguf")
    assert list(f.tensors) == ["token_embd.weight"] + [n for g in groups for n, _, _ in g]
    assert f.tensors["blk.1.b"].type == 8
    assert np.array_equal(f.raw("blk.2.c").view(np.int32).reshape(2, 5, 7), groups[2][2][1])


def test_later_groups_equal_whole_arrays_byte_for_byte(tmp_path):
    groups = _groups(1)
    write_gguf(tmp_path / "whole.gguf", "llama", KVS, [t for g in groups for t in g], progress=False)
    write_gguf(tmp_path / "lazy.gguf", "llama", KVS, [_later(g, [], []) for g in groups], progress=False)
    assert (tmp_path / "whole.gguf").read_bytes() == (tmp_path / "lazy.gguf").read_bytes()


def test_a_group_that_makes_other_shapes_fails_and_leaves_nothing(tmp_path):
    g = _groups()[0]
    bad = Later([(n, a.shape, a.dtype, raw) for n, a, raw in g], lambda: [a[:2] for _, a, _ in g])
    out = tmp_path / "out.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(ConvertError, match="announced"):
        write_gguf(out, "llama", KVS, [bad], progress=False)
    assert out.read_bytes() == b"keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"]


def test_kv_types_reads_the_header_not_the_file(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", KVS, [t for g in _groups() for t in g], progress=False)
    seen = []
    real = writer._kv_types
    monkeypatch.setattr(writer, "_kv_types", lambda buf: seen.append(type(buf).__name__) or real(buf))
    got = kv_types(path)
    assert got["general.name"] == (8, None) and got["t.count"] == (4, None)
    assert seen == ["mmap"], "the header is parsed from a mapping, not a read of the whole file"
