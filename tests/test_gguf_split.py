"""test_gguf_split.py — models split across files as llama.cpp's gguf-split writes them (NAME-00001-of-0000N.gguf:
the metadata in the first part, `split.no` / `split.count` / `split.tensors.count`), written here by gguf-py's
GGUFWriter with split_max_tensors (the same layout and names). Given the first part, pi2 opens every part and
generates the unsplit file's tokens on both engines; `pi2 info` lists the parts; a missing part, a later part
given or damaged split keys are one line each; convert takes a split model; a split pi2 file does not stream.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from clirun import assert_error, cli
from conftest import model_file
from fixtures import write_model
from pi2.convert.writer import add_kv, kv_types
from pi2.errors import ModelFormatError
from pi2.model.gguf_file import GGUFFile
from pi2.model.gguf_split import PART_ALIGN, SplitGGUF, file_parts, part_paths
from pi2.model.loader import load_model


def write_split(src: Path, out: Path, max_tensors: int, extra_kv: dict | None = None) -> list:
    """`src` rewritten as parts of at most max_tensors tensors named after `out` (out-0000k-of-0000n.gguf); the
    parts' paths. extra_kv: keys added to the first part (damaged split keys)."""
    f = GGUFFile(src)
    types = kv_types(src)
    w = GGUFWriter(str(out), f.kv["general.architecture"], split_max_tensors=max_tensors)
    for k, v in f.kv.items():
        if k not in ("general.alignment", "general.architecture"):
            add_kv(w, k, v, *types[k])
    for k, (v, vt) in (extra_kv or {}).items():
        add_kv(w, k, v, vt, None)
    for name, t in f.tensors.items():
        raw = f.raw(name).reshape(tuple(reversed(t.ne[1:])) + (t.row_bytes,))
        w.add_tensor(name, raw, raw_dtype=GGMLQuantizationType(t.type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    f.close()
    parts = sorted(out.parent.glob(out.stem + "-*-of-*.gguf"))
    assert len(parts) > 1
    return parts


def _tokens(path, *args) -> list:
    res = cli("run", path, "-p", "Once upon a time", "-n", "12", "--temp", "0", "--ignore-eos", "--json", *args,
              timeout=120)
    assert res.code == 0, res.err
    return json.loads(res.out)["tokens"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    whole = write_model(d / "tiny.gguf", n_layer=3, seed=3)
    return whole, write_split(whole, d / "tiny-split.gguf", 10)


def test_parts_are_found_and_placed(tiny):
    whole, parts = tiny
    m = load_model(parts[0])
    try:
        assert isinstance(m.file, SplitGGUF)
        spans = file_parts(m.file)
        assert [p for p, _, _ in spans] == [str(p) for p in parts]
        assert spans[0][1] == 0 and all(b % PART_ALIGN == 0 for _, b, _ in spans)
        assert all(b1 >= b0 + s0 for (_, b0, s0), (_, b1, _) in zip(spans, spans[1:]))
        ref = GGUFFile(whole)
        assert set(m.file.tensors) == set(ref.tensors)
        for name, t in ref.tensors.items():      # every tensor's bytes, wherever its part put them
            assert (m.file.raw(name) == ref.raw(name)).all(), name
        assert {m.file.part_of(n) for n in m.file.tensors} == set(range(len(parts)))
        ref.close()
    finally:
        m.close()


@pytest.mark.parametrize("engine", ["c", "reference"])
def test_split_generates_the_unsplit_tokens(tiny, engine):
    whole, parts = tiny
    assert _tokens(parts[0], "--engine", engine) == _tokens(whole, "--engine", engine)


def test_info_lists_the_parts(tiny):
    _, parts = tiny
    res = cli("info", parts[0])
    assert res.code == 0, res.err
    for p in parts:
        assert p.name in res.out


def test_missing_part_is_one_line(tiny, tmp_path):
    _, parts = tiny
    copies = []
    for p in parts:
        copies.append(tmp_path / p.name)
        copies[-1].write_bytes(p.read_bytes())
    copies[1].unlink()
    line = assert_error(cli("run", copies[0], "-p", "hi", "-n", "1"), 1)
    assert f"part 2 of {len(parts)}" in line and copies[1].name in line


def test_later_part_given_names_the_first(tiny):
    _, parts = tiny
    line = assert_error(cli("run", parts[1], "-p", "hi", "-n", "1"), 2)
    assert "part 2 of" in line and parts[0].name in line


def test_damaged_split_keys_are_one_line(tmp_path):
    whole = write_model(tmp_path / "m.gguf", n_layer=2, seed=1)
    parts = write_split(whole, tmp_path / "renamed.gguf", 8)
    wrong = tmp_path / "other-00001-of-00009.gguf"        # a name that does not match split.count
    parts[0].rename(wrong)
    assert "gguf-split names" in assert_error(cli("run", wrong, "-p", "hi", "-n", "1"), 1)
    with pytest.raises(ModelFormatError):
        part_paths(str(wrong), 3)


def test_convert_takes_a_split_model(tiny, tmp_path):
    whole, parts = tiny
    a, b = tmp_path / "whole.pi2.gguf", tmp_path / "split.pi2.gguf"
    for src, out in ((whole, a), (parts[0], b)):
        res = cli("convert", src, "-o", out, timeout=300)
        assert res.code == 0, res.err
    kv = GGUFFile(b).kv
    assert not any(k.startswith("split.") for k in kv)
    assert _tokens(a) == _tokens(b)


def test_split_pi2_file_does_not_stream(tiny, tmp_path):
    whole, _ = tiny
    conv = tmp_path / "c.pi2.gguf"
    assert cli("convert", whole, "-o", conv, timeout=300).code == 0
    parts = write_split(conv, tmp_path / "c-split.gguf", 12)
    assert _tokens(parts[0]) == _tokens(conv)          # mapped whole: fine
    line = assert_error(cli("run", parts[0], "-p", "hi", "-n", "1", "--memory-budget", "64M"), 2)
    assert "split" in line and "merge" in line


@pytest.mark.model
def test_smollm2_split_matches_whole(tmp_path):
    whole = model_file("smollm2-135m")
    parts = write_split(whole, tmp_path / "smol.gguf", 100)
    assert len(parts) == 3
    assert _tokens(parts[0]) == _tokens(whole)
