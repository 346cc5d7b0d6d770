"""test_fuzz.py — a deterministic slice of the GGUF fuzzer (tests/fuzz, `scripts/fuzz.sh` runs the long one) and one
regression test for each thing it found: every damaged file ends in one `pi2: error:` line, never a traceback."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import assert_error, cli, gguf_str, patched, tensor_info
from fixtures import write_model
from pi2file import convert_pi2

from tests.fuzz.gguf_map import walk

ROOT = Path(__file__).resolve().parents[1]
SLICE = int(os.environ.get("PI2_FUZZ_SLICE", "1500"))


def test_fuzz_slice(tmp_path):
    """SLICE executions of seed 7 over every command: no traceback, hang, crash or sanitizer report, and convert
    never leaves output behind or touches its input."""
    p = subprocess.run([sys.executable, "-m", "tests.fuzz.run", "--execs", str(SLICE), "--jobs", "2", "--seed", "7",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    summary = json.loads((tmp_path / "summary.json").read_text()) if (tmp_path / "summary.json").exists() else {}
    assert p.returncode == 0, p.stderr[-3000:]
    assert summary["execs"] == SLICE and summary["outcomes"]["ok"] > 0.02 * SLICE, summary
    assert sum(summary["outcomes"][k] for k in ("ok", "error")) == SLICE, summary


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzreg")
    src = write_model(d / "src.gguf", n_ff=256, n_layer=2, seed=7)
    return {"plain": src, "pwri": write_model(d / "pwri.gguf", pwri=True, n_layer=2, seed=6),
            "pi2": convert_pi2(src, d / "q8.pi2.gguf", down_type="Q8_0", default_keep=0.5)}


def _without_key(src, dst, key):
    b = Path(src).read_bytes()
    lay = walk(b)
    s, e, _ = next(x for x in lay.kv_spans if x[2] == key)
    out = bytearray(b[:s] + b[e:])
    out[16:24] = struct.pack("<Q", struct.unpack_from("<Q", out, 16)[0] - 1)
    Path(dst).write_bytes(bytes(out))
    return Path(dst)


def test_key_that_is_not_a_name(files, tmp_path):
    """Found: a key length pointing into the header made a megabyte-long key of binary bytes, printed whole (and a
    newline in it broke the one-line error)."""
    b = files["plain"].read_bytes()
    at = b.index(gguf_str("general.name"))
    nl = patched(files["plain"], tmp_path / "nl.gguf", [(at + 8, b"general\nname")])
    assert_error(cli("info", nl), 1, match=r"key #\d+ 'general\\nname' is empty, repeated or not a name")
    long = patched(files["plain"], tmp_path / "long.gguf", [(at, struct.pack("<Q", 5000))])
    line = assert_error(cli("run", long, "-p", "hi", "-n", "1"), 1)
    assert len(line) < 300, line


def test_tensor_name_that_is_not_printable(files, tmp_path):
    """Found: a tensor-name length off by a few bytes swallowed the next record's binary fields into the name."""
    b = files["plain"].read_bytes()
    ti = tensor_info(b, "blk.1.attn_q.weight")
    bad = patched(files["plain"], tmp_path / "t.gguf", [(ti["name"] - 8, struct.pack("<Q", 40))])
    line = assert_error(cli("info", bad), 1, match=r"tensor #\d+'s name '.*' is empty, longer than 63 bytes or not")
    assert "\n" not in line


def test_predictor_fc1_rows_differ_from_fc2_columns(files, tmp_path):
    """Found: a PWRI fc1 of 127 rows against an fc2 of 128 columns reached numpy (ValueError) in both engines."""
    b = files["pwri"].read_bytes()
    ti = tensor_info(b, "blk.1.fc1.weight")
    rows = struct.unpack_from("<q", b, ti["ne"][1])[0]
    bad = patched(files["pwri"], tmp_path / "p.gguf", [(ti["ne"][1], struct.pack("<q", rows - 1))])
    for engine in ("c", "reference"):
        assert_error(cli("run", bad, "-p", "hi", "-n", "1", "--engine", engine), 1,
                     match=rf"blk.1.fc1/fc2 must map n_embd 64 -> r -> n_ff 128 \(got 64 -> {rows - 1}, {rows} -> 128\)")


def test_thresholds_longer_than_the_keep_grid(files, tmp_path):
    """Found: one layer's ffn_thresh of 32 values against a keep grid of 5 failed in np.stack."""
    b = files["pi2"].read_bytes()
    ti = tensor_info(b, "blk.1.ffn_thresh.weight")
    bad = patched(files["pi2"], tmp_path / "t.gguf", [(ti["ne"][0], struct.pack("<q", 32))])
    assert_error(cli("run", bad, "-p", "hi", "-n", "1", "--keep", "0.5"), 1,
                 match=r"ffn_err/ffn_thresh need \d+ values \(pi2.ffn.keep_grid\)")


def test_pi2_file_without_its_keep_grid(files, tmp_path):
    """Found: `info` indexed an empty keep grid (IndexError), run and the budget planner read the missing key
    (KeyError): a pi2 file's own keys are now checked when it is opened."""
    bad = _without_key(files["pi2"], tmp_path / "k.gguf", "pi2.ffn.keep_grid")
    for args in (["info", bad], ["run", bad, "-p", "hi", "-n", "1"], ["run", bad, "-p", "hi", "-n", "1", "--engine",
                 "reference"], ["plan", "-m", bad, "--memory-budget", "1G"]):
        assert_error(cli(*args), 1, match="pi2.ffn.keep_grid must be present in a pi2 file")


def test_pi2_key_of_the_wrong_type(files, tmp_path):
    b = files["pi2"].read_bytes()
    at = b.index(gguf_str("pi2.ffn.default_keep")) + 8 + len("pi2.ffn.default_keep")
    bad = patched(files["pi2"], tmp_path / "t.gguf", [(at, struct.pack("<I", 4))])     # F32 read as UINT32
    assert_error(cli("info", bad), 1, match=r"pi2.ffn.default_keep must be a number in \[0, 1\]")


def test_sliding_window_wider_than_int32(tmp_path):
    """Found (seed 1903, execution 14863): gemma3.attention.sliding_window = 2^32 - 1 (a uint32, as llama.cpp reads
    it) reached the C parameters (OverflowError). A window wider than any context attends to everything, as
    llama.cpp's uint32 window does: the run gives the tokens of a window wider than its context."""
    key = gguf_str("gemma3.attention.sliding_window")
    wide = write_model(tmp_path / "wide.gguf", arch="gemma3", sliding_window=1 << 20, seed=5)
    at = wide.read_bytes().index(key) + len(key) + 4       # after the key and its value type (UINT32)
    huge = patched(wide, tmp_path / "huge.gguf", [(at, struct.pack("<I", 0xFFFFFFFF))])
    args = ["-p", "hello world", "-n", "4", "--temp", "0", "--ignore-eos"]
    want, got = cli("run", wide, *args), cli("run", huge, *args)
    assert want.code == 0 and got.code == 0 and "Traceback" not in got.err, got.err
    assert got.out == want.out
    neg = patched(wide, tmp_path / "neg.gguf", [(at - 4, struct.pack("<I", 5)), (at, struct.pack("<i", -1))])
    assert_error(cli("info", neg), 1, match=r"gemma3.attention.sliding_window is -1")
