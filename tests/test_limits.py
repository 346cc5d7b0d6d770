"""test_limits.py — absurd but well-formed sizes are refused before anything is allocated, with one clear line:
a block_count of 2^31, a context of 10^9, a vocabulary of 10^8, a tensor of 2^40 elements, a context whose KV
cache exceeds the memory the process may use."""
import struct
import time

import pytest
from clirun import assert_error, cli, kv_value_pos, patched, tensor_info
from fixtures import write_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("limits") / "m.gguf", n_layer=2)


def _patch(model, tmp_path, edits_of):
    blob = model.read_bytes()
    return patched(model, tmp_path / "p.gguf", edits_of(blob))


@pytest.mark.parametrize("count", [2**31, 2**32 - 1, 3])
def test_block_count_beyond_the_tensor_list(model, tmp_path, count):
    """A block_count of 2^31 made `info` loop over 2^31 layers and `run` grow until killed."""
    p = _patch(model, tmp_path, lambda b: [(kv_value_pos(b, "llama.block_count"), struct.pack("<I", count))])
    for args in (["info", p], ["run", p, "-p", "hi", "-n", "1"], ["tokenize", "-m", p, "-p", "hi"]):
        t0 = time.monotonic()
        assert_error(cli(*args, timeout=20), 1, match=f"block_count is {count} but the file holds tensors for 2 layers")
        assert time.monotonic() - t0 < 5


def test_context_of_a_billion_tokens(model, tmp_path):
    p = _patch(model, tmp_path, lambda b: [(kv_value_pos(b, "llama.context_length"), struct.pack("<I", 10**9))])
    assert cli("info", p).code == 0
    line = assert_error(cli("run", p, "-p", "hi", "-n", "1", "-c", "0"), 2)
    assert "1000000000 tokens (the model's, -c 0) is more than pi2's maximum of 16777216" in line
    assert_error(cli("run", model, "-p", "hi", "-n", "1", "-c", str(10**9)), 2, match="maximum of 16777216")
    assert cli("run", p, "-p", "hi", "-n", "1", "-c", "64", "--temp", "0").code == 0


def test_context_larger_than_memory(model, monkeypatch):
    import pi2.plan.devices
    monkeypatch.setattr(pi2.plan.devices, "memory_limit", lambda *a: 64 << 20)
    res = cli("run", model, "-p", "hi", "-n", "1", "-c", str(1 << 20))
    line = assert_error(res, 2, match=r"a context of 1048576 tokens needs \d+\.\d MiB for its KV cache")
    assert "more than the 64.0 MiB this process may use" in line and "give -c " in res.err
    assert cli("run", model, "-p", "hi", "-n", "1", "-c", "256").code == 0


def test_vocab_of_a_hundred_million(model, tmp_path):
    import gguf
    from pi2file import writer_like
    r = gguf.GGUFReader(str(model))
    w = writer_like(r, tmp_path / "v.gguf")
    w.add_uint32("llama.vocab_size", 10**8)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    for args in (["info", tmp_path / "v.gguf"], ["run", tmp_path / "v.gguf", "-p", "hi", "-n", "1"]):
        assert_error(cli(*args), 1, match=r"token_embd.weight' has shape \[64, 512\], expected \[64, 100000000\]")


def test_tensor_of_2_40_elements(model, tmp_path):
    p = _patch(model, tmp_path, lambda b: [(tensor_info(b, "blk.0.ffn_up.weight")["ne"][1], struct.pack("<q", 2**40))])
    for args in (["info", p], ["run", p, "-p", "hi", "-n", "1"]):
        assert_error(cli(*args), 1, match="ffn_up.weight': data runs past the end of the file")
