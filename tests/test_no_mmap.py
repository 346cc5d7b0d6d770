"""test_no_mmap.py — `--no-mmap` (and `-lm none`): the C engine reads the whole file into memory at load instead of
mapping it, so the run computes what a mapped run computes and later writes to the file do not reach the weights
(they do reach a mapping); --keep N in llama.cpp's sense gets a hint."""
import shutil

import numpy as np
import pytest

from clirun import cli
from fixtures import write_model
from pi2.engine import CContext, CModel
from pi2.model.loader import load_model

PROMPT = [3, 17, 42, 99, 7, 256, 300, 11]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("no_mmap") / "m.gguf")


def scribble(path, model):
    """Overwrite attn_output of layer 0 in place (same file, same inode)."""
    t = model.file.tensors["blk.0.attn_output.weight"]
    with open(path, "r+b") as f:
        f.seek(t.offset)
        f.write(bytes(t.nbytes))


def test_read_into_memory_is_immune_to_later_writes(path, tmp_path):
    p = tmp_path / "copy.gguf"
    shutil.copy(path, p)
    m = load_model(p)
    mem, mapped = CModel.from_model(m, no_mmap=True), CModel.from_model(m)
    a, b = CContext(mem, 32, 1), CContext(mapped, 32, 1)
    before = a.decode(PROMPT)
    assert np.array_equal(before, b.decode(PROMPT))
    scribble(p, m)
    a.reset(), b.reset()
    assert np.array_equal(a.decode(PROMPT), before)          # the weights were read at load
    assert not np.array_equal(b.decode(PROMPT), before)      # a mapping sees the file as it is now


def test_cli_no_mmap_gives_the_mapped_text(path):
    want = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0")
    for flags in (["--no-mmap"], ["-lm", "none"], ["--no-mmap", "-t", "2"]):
        res = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", *flags)
        assert res.code == 0 and res.out == want.out and "note" not in res.err, flags


def test_llama_cpps_keep_gets_a_hint(path):
    res = cli("run", path, "-p", "hi", "-n", "1", "--keep", "64")
    assert res.code == 2 and "--keep-tokens" in res.err
