"""test_gguf_file.py — pi2.model.gguf_file against gguf's GGUFReader, and its handling of bad input.

Owns: agreement with GGUFReader on synthetic fixtures and the real models (every key's value, every
tensor's type, shape, offset and bytes), PWRI acceptance, opening speed, and the rule that a damaged
or hostile file raises ModelFormatError/UnsupportedError with a clear message, never another
exception and never a hang.
"""
import os
import random
import signal
import struct
import time
from functools import lru_cache

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from conftest import model_file
from fixtures import corrupt_copy, write_model
from pi2.errors import ModelFormatError, Pi2Error, UnsupportedError
from pi2.model.gguf_file import GGUFFile

REAL_MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]
_NP = {GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8, GGUFValueType.UINT16: np.uint16,
       GGUFValueType.INT16: np.int16, GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
       GGUFValueType.FLOAT32: np.float32, GGUFValueType.BOOL: np.bool_, GGUFValueType.UINT64: np.uint64,
       GGUFValueType.INT64: np.int64, GGUFValueType.FLOAT64: np.float64}


@pytest.fixture(autouse=True)
def no_hang():
    """Fail instead of hanging (a generous bound: gguf's own reader takes seconds on a real model, more on a
    loaded machine)."""
    old = signal.signal(signal.SIGALRM, lambda *a: pytest.fail("timed out (the reader hung)"))
    signal.alarm(180)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def assert_matches_gguf_reader(path, reader=None):
    g = GGUFFile(path)
    r = reader or GGUFReader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(g.kv) == list(fields)
    for key, f in fields.items():
        got, want = g.kv[key], f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            if f.types[-1] == GGUFValueType.STRING:
                assert list(got) == want, key
            else:
                assert got.dtype == _NP[f.types[-1]], key
                np.testing.assert_array_equal(got, np.asarray(want), err_msg=key)
        else:
            assert got == want, key
            assert isinstance(got, bool) == (f.types[0] == GGUFValueType.BOOL), key
    assert g.alignment == r.alignment and g.data_offset == r.data_offset
    assert list(g.tensors) == [t.name for t in r.tensors]
    for t in r.tensors:
        info = g.tensors[t.name]
        assert info.type == int(t.tensor_type), t.name
        assert info.ne == tuple(int(d) for d in t.shape), t.name
        assert info.offset == t.data_offset and info.nbytes == t.n_bytes, t.name
        raw = g.raw(t.name)
        assert raw.shape[0] * raw.shape[1] == t.n_bytes
        assert np.array_equal(raw.reshape(-1), np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)), t.name
    g.close()


# --- synthetic fixtures ----------------------------------------------------------------------

@pytest.mark.parametrize("arch,vocab,wtype,tied", [
    ("llama", "bpe", "Q8_0", True), ("llama", "spm", "Q4_0", False), ("llama", "bpe", "F32", True),
    ("llama", "bpe", "BF16", False), ("qwen2", "bpe", "Q4_1", True), ("qwen2", "bpe", "F16", False),
    ("qwen2", "spm", "Q5_0", True), ("gemma3", "spm", "Q8_0", True), ("gemma3", "spm", "Q5_1", True),
])
def test_fixture_matches_gguf_reader(tmp_path, arch, vocab, wtype, tied):
    p = write_model(tmp_path / "m.gguf", arch, vocab=vocab, wtype=wtype, tied=tied, embd_type="Q8_0")
    assert_matches_gguf_reader(p)
    g = GGUFFile(p)
    assert g.magic == "GGUF" and g.version == 3
    assert g.kv["general.architecture"] == arch


def test_pwri_accepted_and_reported(tmp_path):
    p = write_model(tmp_path / "s.gguf", pwri=True, wtype="Q4_0")
    g = GGUFFile(p)
    assert g.magic == "PWRI"
    assert g.kv["powerinfer.sparse_threshold"] == 0.0
    assert "blk.0.ffn_down_t.weight" in g.tensors and "blk.0.ffn_down.weight" not in g.tensors
    with pytest.raises(ValueError):                      # stock gguf-py refuses the magic
        GGUFReader(p)
    dense = corrupt_copy(p, tmp_path / "d.gguf", "magic", data=b"GGUF")
    assert GGUFFile(dense).magic == "GGUF"
    assert_matches_gguf_reader(dense)                    # same contents once the magic is GGUF
    assert {n: (t.ne, t.offset) for n, t in GGUFFile(dense).tensors.items()} == \
           {n: (t.ne, t.offset) for n, t in g.tensors.items()}


def test_context_manager_and_get(tmp_path):
    p = write_model(tmp_path / "m.gguf")
    with GGUFFile(p) as g:
        assert g.get("llama.block_count") == 2 and g.get("nope", 7) == 7
        assert g.tensors["token_embd.weight"].shape == (512, 64)
        assert g.tensors["token_embd.weight"].type_name == "Q8_0"
        assert g.tensors["token_embd.weight"].row_bytes == 68


# --- real models -----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _reader(path):
    return GGUFReader(path)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("key", REAL_MODELS)
def test_real_model_matches_gguf_reader(key):
    p = model_file(key)
    assert_matches_gguf_reader(p, _reader(str(p)))


@pytest.mark.model
def test_real_model_opens_fast():
    p = model_file("qwen2.5-coder-0.5b")
    t = time.perf_counter()
    g = GGUFFile(p)
    dt = time.perf_counter() - t
    assert dt < 15, f"opening took {dt:.2f} s"      # ~0.3 s quiet: only a read of the tensor data would reach this
    assert len(g.kv["tokenizer.ggml.tokens"]) > 150_000
    assert g.magic == "GGUF" and {t.type_name for t in g.tensors.values()} >= {"Q4_K", "Q6_K", "F32"}


# --- hand-built headers ----------------------------------------------------------------------

def gstr(x) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def u32(key, v):
    return kv(key, 4, struct.pack("<I", v))


def tinfo(name, ne, ttype=0, offset=0) -> bytes:
    return (gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne)
            + struct.pack("<IQ", ttype, offset))


def build(kvs=(), tensors=(), data=b"", *, magic=b"GGUF", version=3, n_tensors=None, n_kv=None, align=32):
    head = magic + struct.pack("<Iqq", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % align) + data


GOOD_KVS = [kv("general.architecture", 8, gstr("llama")), u32("llama.block_count", 1)]
GOOD_T = [tinfo("a.weight", [32, 2], 0, 0), tinfo("b.weight", [32], 8, 256)]
GOOD_DATA = bytes(256) + bytes(34) + bytes(30)


def _write(tmp_path, blob, name="x.gguf"):
    p = tmp_path / name
    p.write_bytes(blob)
    return p


def test_hand_built_file_is_valid(tmp_path):
    p = _write(tmp_path, build(GOOD_KVS, GOOD_T, GOOD_DATA))
    g = GGUFFile(p)
    assert g.kv["llama.block_count"] == 1 and g.tensors["b.weight"].nbytes == 34
    assert_matches_gguf_reader(p)


def _bad(tmp_path, blob, exc=ModelFormatError, match=None):
    p = _write(tmp_path, blob)
    with pytest.raises(exc, match=match) as e:
        GGUFFile(p)
    assert str(p) in str(e.value)                       # the message names the file
    return e.value


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        GGUFFile(tmp_path / "absent.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelFormatError, match="directory"):
        GGUFFile(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ModelFormatError, match="not a regular file"):
        GGUFFile(tmp_path / "pipe")


@pytest.mark.parametrize("blob,match", [
    (b"", "0 bytes"), (b"GGUF", "4 bytes"), (b"GGUF\x03\0\0\0", "8 bytes"),
    (b"hello, this is a plain text file and not a model\n" * 3, "magic"),
    (b"GGML" + bytes(40), "magic"), (b"\0" * 64, "magic"), (b"FUGG" + bytes(40), "magic"),
])
def test_not_gguf(tmp_path, blob, match):
    _bad(tmp_path, blob, match=match)


@pytest.mark.parametrize("version", [0, 1, 4, 99, 2**32 - 1])
def test_unsupported_version(tmp_path, version):
    _bad(tmp_path, build(GOOD_KVS, GOOD_T, GOOD_DATA, version=version), UnsupportedError, match="version")


def test_big_endian_is_named(tmp_path):
    blob = build(GOOD_KVS, GOOD_T, GOOD_DATA, version=3 << 24)
    _bad(tmp_path, blob, UnsupportedError, match="big-endian")


@pytest.mark.parametrize("n_tensors,n_kv", [(2**40, 2), (2, 2**40), (-1, 2), (2, -1), (2**63 - 1, 2**63 - 1)])
def test_absurd_counts(tmp_path, n_tensors, n_kv):
    _bad(tmp_path, build(GOOD_KVS, GOOD_T, GOOD_DATA, n_tensors=n_tensors, n_kv=n_kv), match="corrupted")


def test_count_larger_than_contents(tmp_path):
    _bad(tmp_path, build(GOOD_KVS, GOOD_T, GOOD_DATA, n_kv=3))      # reads tensor infos as a KV
    _bad(tmp_path, build(GOOD_KVS, GOOD_T, n_tensors=3))


@pytest.mark.parametrize("blob_kv,match", [
    (struct.pack("<Q", 2**40) + b"key", "truncated"),                      # key length past EOF
    (struct.pack("<Q", 2**64 - 1) + b"key", "truncated"),
    (kv("k", 8, struct.pack("<Q", 10**12) + b"abc"), "truncated"),          # string value past EOF
    (kv("k", 9, struct.pack("<IQ", 4, 2**40)), "past the end"),             # u32 array count past EOF
    (kv("k", 9, struct.pack("<IQ", 8, 2**40)), "cannot fit"),               # string array count past EOF
    (kv("k", 9, struct.pack("<IQ", 8, 2) + gstr("a") + struct.pack("<Q", 2**50)), "truncated"),
    (kv("k", 13, b"\0" * 8), "unknown value type 13"),
    (kv("k", 2**31, b"\0" * 8), "unknown value type"),
    (kv("k", 9, struct.pack("<IQ", 13, 1) + bytes(8)), "unknown array element type 13"),
    (kv("k", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 0)), "nested"),
    (kv("", 4, bytes(4)), "empty"),
])
def test_bad_kv(tmp_path, blob_kv, match):
    _bad(tmp_path, build(GOOD_KVS + [blob_kv], GOOD_T, GOOD_DATA), match=match)


def test_duplicate_key(tmp_path):
    _bad(tmp_path, build(GOOD_KVS + [u32("llama.block_count", 2)], GOOD_T, GOOD_DATA), match="duplicate")


@pytest.mark.parametrize("align", [0, 3, 48, 2**31 + 1])
def test_bad_alignment(tmp_path, align):
    _bad(tmp_path, build(GOOD_KVS + [u32("general.alignment", align)], GOOD_T, GOOD_DATA), match="alignment")


def test_alignment_of_wrong_type(tmp_path):
    _bad(tmp_path, build(GOOD_KVS + [kv("general.alignment", 8, gstr("32"))], GOOD_T, GOOD_DATA),
         match="alignment")


def test_larger_alignment_is_honoured(tmp_path):
    t = [tinfo("a.weight", [32, 2], 0, 0), tinfo("b.weight", [32], 8, 256)]
    p = _write(tmp_path, build(GOOD_KVS + [u32("general.alignment", 64)], t, GOOD_DATA, align=64))
    g = GGUFFile(p)
    assert g.alignment == 64 and g.data_offset % 64 == 0
    assert_matches_gguf_reader(p)


@pytest.mark.parametrize("tensor,match", [
    (tinfo("c", [32], 4, 320), "unknown type id 4"),                 # removed Q4_2
    (tinfo("c", [32], 31, 320), "unknown type id 31"),               # Q4_0_4_4, refused in files
    (tinfo("c", [32], 200, 320), "unknown type id 200"),
    (tinfo("c", [1, 1, 1, 1, 1], 0, 320), "5 dimensions"),
    (tinfo("c", [32, -1], 0, 320), "negative"),
    (tinfo("c", [-32], 0, 320), "negative"),
    (tinfo("c", [48], 8, 320), "multiple"),                          # Q8_0 block is 32
    (tinfo("c", [128], 12, 320), "multiple"),                        # Q4_K block is 256
    (tinfo("c", [2**40, 2**40], 0, 320), "overflow"),
    (tinfo("c", [2**62, 2**62, 2**62, 2**62], 0, 320), "overflow"),
    (tinfo("c", [32], 0, 2**40), "past the end"),                    # offset past EOF
    (tinfo("c", [32], 0, 2**64 - 32), "past the end"),
    (tinfo("c", [32, 1000], 0, 320), "past the end"),                # data past EOF
    (tinfo("c", [32], 0, 321), "aligned"),
    (tinfo("x" * 64, [32], 0, 320), "longer"),
    (tinfo("a.weight", [32], 0, 320), "twice"),                      # duplicate tensor name
])
def test_bad_tensor_info(tmp_path, tensor, match):
    _bad(tmp_path, build(GOOD_KVS, GOOD_T + [tensor], GOOD_DATA + bytes(128)), match=match)


def test_tensor_dims_past_eof(tmp_path):
    head = b"GGUF" + struct.pack("<Iqq", 3, 3, len(GOOD_KVS))
    blob = head + b"".join(GOOD_KVS + GOOD_T) + gstr("c") + struct.pack("<Iq", 4, 32)
    _bad(tmp_path, blob, match="truncated")


def test_zero_size_and_scalar_tensors(tmp_path):
    t = [tinfo("a.weight", [32, 2], 0, 0), tinfo("e", [0, 4], 0, 256), tinfo("s", [], 0, 256)]
    p = _write(tmp_path, build(GOOD_KVS, t, bytes(256) + bytes(32)))
    g = GGUFFile(p)
    assert g.tensors["e"].nbytes == 0 and g.raw("e").size == 0
    assert g.tensors["s"].nbytes == 4 and g.raw("s").shape == (1, 4)


# --- damaged real-looking files --------------------------------------------------------------

@pytest.fixture(scope="module")
def fixture_file(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("fx") / "m.gguf", "qwen2", wtype="Q4_0")


def test_truncated_everywhere(fixture_file, tmp_path):
    g = GGUFFile(fixture_file)
    end = max(t.offset + t.nbytes for t in g.tensors.values())
    hdr = g.data_offset
    g.close()
    cuts = sorted({0, 1, 3, 4, 7, 8, 16, 23, 24, 25, 31, 32, 40, hdr - 1, hdr, hdr + 1, end - 1}
                  | {int(x) for x in np.linspace(41, hdr - 2, 20)}
                  | {int(x) for x in np.linspace(hdr + 2, end - 2, 13)})
    assert len(cuts) >= 50
    blob = fixture_file.read_bytes()
    p = tmp_path / "cut.gguf"
    for cut in cuts:
        p.write_bytes(blob[:cut])
        with pytest.raises(ModelFormatError):
            GGUFFile(p)


def test_random_header_damage_never_crashes(fixture_file, tmp_path):
    """Flip bytes in the header at seeded random places: the result opens or raises a Pi2Error."""
    blob = bytearray(fixture_file.read_bytes())
    hdr = GGUFFile(fixture_file).data_offset
    rng = random.Random(1234)
    p = tmp_path / "flip.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(4, hdr)] = rng.randrange(256)
        p.write_bytes(b)
        try:
            GGUFFile(p).close()
            outcomes["ok"] += 1
        except Pi2Error as e:
            assert isinstance(e, (ModelFormatError, UnsupportedError)) and str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 0
