"""test_cli_errors.py — bad input through the `pi2` CLI: every damaged file, bad flag and bad prompt ends
with one `pi2: error: ...` line (and at most a hint line) on stderr, exit 1 (2 for usage errors), no
traceback, no hang, and the user's files untouched.
"""
import os
import struct

import numpy as np
import pytest
from gguf import GGUFWriter

from clirun import assert_error, cli, cli_process, kv_value_pos, patched, sha256, tensor_info
from fixtures import TEXT, corrupt_copy, write_model


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_errors")


@pytest.fixture(scope="module")
def good(d):
    return write_model(d / "good.gguf")


@pytest.fixture(scope="module")
def spm(d):
    return write_model(d / "spm.gguf", vocab="spm")


def _mamba(path):
    """A well-formed GGUF of an architecture pi2 does not run."""
    w = GGUFWriter(str(path), "mamba")
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _damaged(d, good, kind):
    """Build one damaged copy of the good fixture (or another bad file) and return its path."""
    blob = good.read_bytes()
    size = len(blob)
    p = d / f"{kind}.gguf"
    if kind == "missing":
        return d / "no-such-model.gguf"
    if kind == "directory":
        p.mkdir(exist_ok=True)
        return p
    if kind == "text":
        p.write_text("this is not a model\n")
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "garbage":
        p.write_bytes(os.urandom(5000))
    elif kind == "bad_magic":
        corrupt_copy(good, p, "magic", data=b"GGML")
    elif kind.startswith("truncated_"):
        frac = {"4": 4, "10": 10, "30": 30, "200": 200}.get(kind[10:])
        at = frac if frac is not None else {"header_end": blob.index(b"blk.1.ffn_down.weight") + 10,
                                           "data": size // 2, "last_byte": size - 1}[kind[10:]]
        corrupt_copy(good, p, "truncate", at=at)
    elif kind == "version_1":
        patched(good, p, [(4, struct.pack("<I", 1))])
    elif kind == "absurd_tensor_count":
        patched(good, p, [(8, struct.pack("<q", 2 ** 40))])
    elif kind == "absurd_kv_count":
        patched(good, p, [(16, struct.pack("<q", 2 ** 50))])
    elif kind == "offset_past_eof":
        patched(good, p, [(tensor_info(blob, "output_norm.weight")["offset"], struct.pack("<Q", 2 ** 40))])
    elif kind == "size_past_eof":       # the last tensor's shape grows, so its data would run past EOF
        ti = tensor_info(blob, "blk.1.ffn_down.weight")
        patched(good, p, [(ti["ne"][1], struct.pack("<q", 64 * 100))])
    elif kind == "wrong_shape":         # fits in the file, but is not what a llama layer needs
        ti = tensor_info(blob, "blk.0.ffn_up.weight")
        patched(good, p, [(ti["ne"][1], struct.pack("<q", 64))])
    elif kind == "missing_tensor":
        ti = tensor_info(blob, "blk.1.ffn_up.weight")
        patched(good, p, [(ti["name"], b"blk.1.ffn_uq.weight")])
    elif kind == "unsupported_type_iq4_nl":
        patched(good, p, [(tensor_info(blob, "blk.0.ffn_up.weight")["type"], struct.pack("<I", 20))])
    elif kind == "unknown_type_id":
        patched(good, p, [(tensor_info(blob, "blk.0.ffn_up.weight")["type"], struct.pack("<I", 999))])
    elif kind == "mamba_patched":
        patched(good, p, [(kv_value_pos(blob, "general.architecture") + 8, b"mamba")])
    elif kind == "mamba_written":
        _mamba(p)
    elif kind == "bad_tokenizer":
        patched(good, p, [(kv_value_pos(blob, "tokenizer.ggml.model") + 8, b"xxxx")])
    else:
        raise ValueError(kind)
    return p


BAD_FILES = {  # kind -> what the message must say
    "missing": "no such file", "directory": "directory", "text": "not a GGUF", "empty": "not a GGUF",
    "garbage": "not a GGUF", "bad_magic": "not a GGUF", "truncated_4": "not a GGUF|truncated",
    "truncated_10": "truncated|corrupted|not a GGUF", "truncated_30": "truncated|corrupted",
    "truncated_200": "truncated|corrupted", "truncated_header_end": "truncated|corrupted|past the end",
    "truncated_data": "past the end", "truncated_last_byte": "past the end", "version_1": "version 1",
    "absurd_tensor_count": "corrupted|truncated", "absurd_kv_count": "corrupted|truncated",
    "offset_past_eof": "past the end|offset", "size_past_eof": "past the end",
    "wrong_shape": "shape", "missing_tensor": "'blk.1.ffn_up.weight' is missing",
    "unsupported_type_iq4_nl": "IQ4_NL", "unknown_type_id": "unknown type", "mamba_patched": "mamba",
    "mamba_written": "mamba", "bad_tokenizer": "tokenizer 'xxxx'",
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_bad_model_file_run(d, good, kind):
    bad = _damaged(d, good, kind)
    before = sha256(bad) if bad.is_file() else None
    assert_error(cli("run", bad, "-p", "Hello", "-n", "4"), 1, BAD_FILES[kind])
    if before is not None:
        assert sha256(bad) == before


@pytest.mark.parametrize("command", ["info", "tokenize", "perplexity", "cnv"])
@pytest.mark.parametrize("kind", ["missing", "directory", "bad_magic", "truncated_data", "missing_tensor",
                                  "unsupported_type_iq4_nl", "mamba_written"])
def test_bad_model_file_other_commands(d, good, kind, command):
    bad = _damaged(d, good, kind)
    corpus = d / "corpus.txt"
    corpus.write_text(TEXT)
    args = {"info": ["info", bad], "tokenize": ["tokenize", "-m", bad, "-p", "Hello"],
            "perplexity": ["perplexity", "-m", bad, "-f", corpus, "-c", "32"],
            "cnv": ["run", bad, "-cnv"]}[command]
    assert_error(cli(*args, stdin="hi\n"), 1, BAD_FILES[kind])


def test_q2_k_weights_are_refused(d):
    """A K-quant pi2 cannot compute (Q2_K) named in one line, not garbage output."""
    src = write_model(d / "wide.gguf", n_embd=256, n_ff=256, n_head=4, n_head_kv=2)
    blob = src.read_bytes()
    bad = patched(src, d / "q2k.gguf", [(tensor_info(blob, "blk.0.ffn_gate.weight")["type"],
                                         struct.pack("<I", 10))])
    assert_error(cli("run", bad, "-p", "Hello", "-n", "2"), 1, "Q2_K")


@pytest.mark.parametrize("kind", ["missing", "bad_magic", "truncated_header_end", "mamba_written"])
def test_bad_model_file_in_a_real_process(d, good, kind):
    """The same contract seen from outside: exit status and stderr of a real `python -m pi2`."""
    assert_error(cli_process("run", _damaged(d, good, kind), "-p", "Hello", "-n", "2"), 1, BAD_FILES[kind])


# --- prompts ---

def test_empty_prompt(good):
    assert_error(cli("run", good, "-p", ""), 2, "prompt is empty")


def test_empty_prompt_file(d, good):
    (d / "empty.txt").write_bytes(b"")
    assert_error(cli("run", good, "-f", d / "empty.txt"), 2, "prompt is empty")


def test_empty_prompt_with_bos_runs_from_bos(spm):
    """llama-completion runs an empty prompt from BOS when the model adds one (the SPM fixture does)."""
    res = cli("run", spm, "-p", "", "-n", "2", "--temp", "0", "--json")
    assert res.code == 0, res.err


def test_prompt_longer_than_context(good):
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 20
    assert_error(cli("run", good, "-p", long_prompt, "-c", "16"), 2, r"prompt is too long \(\d+ tokens, max 12\)")


def test_no_prompt(good):
    assert_error(cli("run", good), 2, "no prompt")


def test_prompt_and_file(d, good):
    (d / "p.txt").write_text("hi")
    assert_error(cli("run", good, "-p", "hi", "-f", d / "p.txt"), 2, "once")


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_prompt_file(d, good, what):
    path = d / "nope.txt" if what == "missing" else d
    assert_error(cli("run", good, "-f", path), 1, "cannot read")     # not a usage error: exit 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_prompt_file_without_permission(d, good):
    p = d / "secret.txt"
    p.write_text("hi")
    p.chmod(0)
    assert_error(cli("run", good, "-f", p), 1, "cannot read")


def test_no_model(good):
    assert_error(cli("run", "-p", "hi"), 2, "no model")
    assert_error(cli("info"), 2, "no model")


def test_two_different_models(good, spm):
    assert_error(cli("run", good, "-m", spm, "-p", "hi"), 2, "model once")


def test_tokenize_nothing(good):
    assert_error(cli("tokenize", "-m", good), 2, "nothing to tokenize")


# --- flags ---

@pytest.mark.parametrize("args, match", [
    (["run", "{m}", "-p", "hi", "--bogus"], "No such option: --bogus"),
    (["run", "{m}", "-p", "hi", "-n", "x"], "-n"),
    (["run", "{m}", "-p", "hi", "--temp", "warm"], "--temp"),
    (["run", "{m}", "-p"], "requires an argument"),
    (["frobnicate"], "No such command"),
    (["perplexity", "-m", "{m}"], "--file"),
    (["tokenize", "-m", "{m}", "-p", "hi", "--nope"], "No such option"),
])
def test_usage_errors_from_the_parser(good, args, match):
    line = assert_error(cli(*[a.replace("{m}", str(good)) for a in args]), 2, match)
    assert "Error:" not in line


def test_parser_errors_show_a_help_hint(good):
    res = cli("run", good, "-p", "hi", "--bogus")
    assert res.err.splitlines()[1] == "  hint: see 'pi2 run --help'"


@pytest.mark.parametrize("args, match", [
    (["-n", "-5"], "invalid -n -5"),
    (["-c", "-1"], "context size"),
    (["--engine", "turbo"], "unknown engine 'turbo'"),
])
def test_bad_values(good, args, match):
    assert_error(cli("run", good, "-p", "hi", *args), 2, match)


def test_bad_engine_other_commands(d, good):
    (d / "c.txt").write_text(TEXT)
    assert_error(cli("perplexity", "-m", good, "-f", d / "c.txt", "-c", "32", "--engine", "turbo"), 2, "engine")


@pytest.mark.parametrize("args", [["-t", "-3"], ["-t", "0"], ["-n", "-2"], ["-n", "-1", "-c", "8"]])
def test_values_llama_cpp_accepts(good, args):
    """-t <= 0 means all cores in llama.cpp; -n -2 is its 'until the context is full'."""
    res = cli("run", good, "-p", "Hello", "-n", "2", "--temp", "0", *args)
    assert res.code == 0, res.err


def test_json_with_chat_is_refused(good):
    assert_error(cli("run", good, "-cnv", "--json", stdin="hi\n"), 2, "--json")


def test_perplexity_text_too_short(d, good):
    (d / "short.txt").write_text("Hello there")
    assert_error(cli("perplexity", "-m", good, "-f", d / "short.txt", "-c", "32"), 2, "at least 64 tokens")


def test_perplexity_missing_file(d, good):
    assert_error(cli("perplexity", "-m", good, "-f", d / "none.txt", "-c", "32"), 1, "cannot read")


def test_perplexity_zero_chunks(d, good):
    (d / "c.txt").write_text(TEXT)
    assert_error(cli("perplexity", "-m", good, "-f", d / "c.txt", "-c", "32", "--chunks", "0"), 2, "chunks")


def test_unexpected_failures_are_one_line(monkeypatch, good):
    """A bug pi2 did not anticipate still ends as one line and exit 1 (the traceback needs --verbose)."""
    import pi2.cli.commands
    monkeypatch.setattr(pi2.cli.commands, "run", lambda opts: {}["boom"])
    res = cli("run", good, "-p", "hi")
    assert res.code == 1 and res.err == "pi2: error: KeyError: 'boom'\n"
    with pytest.raises(KeyError):
        cli("run", good, "-p", "hi", "--verbose")
