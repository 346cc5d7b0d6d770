"""test_cli.py — the `pi2` command line end to end on fixture models (and a few on SmolLM2-135M): run
(--json, streaming, timings, -n, -c, --ignore-eos, seeds, escapes, -f), tokenize, info, perplexity,
--help, Ctrl-C, and that no command changes the model file. Bad input: test_cli_errors.py; chat:
test_cli_chat.py.
"""
import json
import re
import shutil
import signal
import struct
import os
import subprocess
import sys
import time

import pytest

from clirun import cli, cli_process, kv_value_pos, patched, sha256, timing_counts
from conftest import DATA, model_file
from fixtures import TEXT, write_model
from pi2.model.loader import load_model
from pi2.cli.prompt import process_escapes

PROMPT = "Hello world"


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def bpe(d):
    return write_model(d / "bpe.gguf")          # llama, byte-level BPE, ChatML template, n_ctx 256, no BOS


@pytest.fixture(scope="module")
def spm(d):
    return write_model(d / "spm.gguf", vocab="spm")     # llama, SPM vocab with add_bos, no chat template


@pytest.fixture(scope="module")
def tok(bpe):
    return load_model(bpe).tokenizer


def run_json(*args):
    res = cli("run", *args, "--json")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert len(lines) == 1, res.out             # exactly one JSON object, nothing else on stdout
    return json.loads(lines[0])


# --- pi2 run ---

def test_run_json(bpe, tok):
    j = run_json(bpe, "-p", PROMPT, "-n", "8", "--temp", "0")
    assert {"prompt_tokens", "tokens", "text", "timings"} <= set(j)
    assert j["prompt_tokens"] == tok.encode(PROMPT, add_special=None, parse_special=True)
    assert len(j["tokens"]) == 8 and all(isinstance(t, int) for t in j["tokens"])
    assert isinstance(j["text"], str) and j["stop_reason"] == "length"
    t = j["timings"]
    assert t["prompt_n"] == len(j["prompt_tokens"]) and t["eval_n"] == 7     # runs = generated - 1
    assert t["total_ms"] >= t["load_ms"] >= t["prompt_ms"] >= 0


def test_model_flag_and_positional_agree(bpe):
    a = run_json(bpe, "-p", PROMPT, "-n", "6", "--temp", "0")
    b = run_json("-m", bpe, "-p", PROMPT, "-n", "6", "--temp", "0")
    c = run_json(bpe, "-m", bpe, "-p", PROMPT, "-n", "6", "--temp", "0")
    assert a["tokens"] == b["tokens"] == c["tokens"]


def test_text_stream_matches_json_and_timings_on_stderr(bpe):
    j = run_json(bpe, "-p", PROMPT, "-n", "8", "--temp", "0")
    res = cli("run", bpe, "-p", PROMPT, "-n", "8", "--temp", "0")
    assert res.code == 0, res.err
    assert res.out == PROMPT + j["text"] + "\n"         # the prompt echoed, as llama-completion does
    counts = timing_counts(res.err)
    assert counts == {"prompt": len(j["prompt_tokens"]), "eval": 7, "total": len(j["prompt_tokens"]) + 7}
    quiet = cli("run", bpe, "-p", PROMPT, "-n", "8", "--temp", "0", "--no-display-prompt")
    assert quiet.out == j["text"] + "\n"


def test_json_mode_keeps_stdout_clean(bpe):
    res = cli("run", bpe, "-p", PROMPT, "-n", "3", "--temp", "0", "--json")
    assert "time =" not in res.out and res.out.count("\n") == 1


def test_n_zero(bpe):
    j = run_json(bpe, "-p", PROMPT, "-n", "0")
    assert j["tokens"] == [] and j["text"] == "" and j["timings"]["eval_n"] == 0
    res = cli("run", bpe, "-p", PROMPT, "-n", "0")
    assert res.code == 0 and res.out == PROMPT + "\n"


@pytest.mark.parametrize("n_ctx", [8, 16, 40])
def test_n_minus_one_stops_cleanly_at_a_full_context(bpe, n_ctx):
    """llama-completion stops once n_past + 1 >= n_ctx: n_ctx - n_prompt tokens come out."""
    j = run_json(bpe, "-p", PROMPT, "-n", "-1", "--ignore-eos", "--temp", "0", "-c", str(n_ctx))
    assert len(j["tokens"]) == n_ctx - len(j["prompt_tokens"])
    assert j["stop_reason"] == "context"


@pytest.fixture(scope="module")
def eos_model(d, bpe):
    """The BPE fixture with its EOS id set to a token greedy decoding produces, so -n -1 meets an EOG."""
    free = run_json(bpe, "-p", PROMPT, "-n", "12", "--temp", "0")["tokens"]
    eog = free[3]
    blob = bpe.read_bytes()
    path = patched(bpe, d / "eos.gguf", [(kv_value_pos(blob, "tokenizer.ggml.eos_token_id"), struct.pack("<I", eog))])
    return path, free, eog


def test_n_minus_one_stops_at_end_of_generation(eos_model):
    path, free, eog = eos_model
    j = run_json(path, "-p", PROMPT, "-n", "-1", "--temp", "0")
    assert j["tokens"] == free[:free.index(eog)] and j["stop_reason"] == "eog"
    assert eog not in j["tokens"]


def test_ignore_eos(eos_model):
    path, free, eog = eos_model
    j = run_json(path, "-p", PROMPT, "-n", "12", "--temp", "0", "--ignore-eos")
    assert j["tokens"] == free and eog in j["tokens"]


def test_seed_reproducibility(bpe):
    args = ["-p", PROMPT, "-n", "16", "--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
    a = run_json(bpe, *args, "-s", "42")
    b = run_json(bpe, *args, "-s", "42")
    assert a["tokens"] == b["tokens"] and a["seed"] == 42
    others = [run_json(bpe, *args, "-s", str(s))["tokens"] for s in (43, 44)]
    assert any(o != a["tokens"] for o in others)


def test_random_seed_is_reported(bpe):
    j = run_json(bpe, "-p", PROMPT, "-n", "4")
    again = run_json(bpe, "-p", PROMPT, "-n", "4", "-s", str(j["seed"]))
    assert again["tokens"] == j["tokens"]


@pytest.mark.parametrize("raw, want", [
    (r"a\nb", "a\nb"), (r"tab\there", "tab\there"), (r"back\\slash", "back\\slash"), (r"\x41\x42C", "ABC"),
    (r"keep \q and \d", r"keep \q and \d"), (r"quote \" and \'", "quote \" and '"), ("trailing \\", "trailing \\"),
    (r"\x4", r"\x4"), (r"\xZZ", r"\xZZ"), (r"cr\r", "cr\r"), (r"\xc3\xa9t\xc3\xa9", "été"), ("été\\n", "été\n"),
])
def test_process_escapes(raw, want):
    assert process_escapes(raw) == want


def test_escapes_in_prompt(bpe, tok):
    raw = r"line\none\ttab \\ \x41 \q"
    j = run_json(bpe, "-p", raw, "-n", "1", "--temp", "0")
    assert j["prompt_tokens"] == tok.encode("line\none\ttab \\ A \\q", add_special=None, parse_special=True)
    k = run_json(bpe, "-p", raw, "-n", "1", "--temp", "0", "--no-escape")
    assert k["prompt_tokens"] == tok.encode(raw, add_special=None, parse_special=True)


def test_escape_to_invalid_utf8_is_written_as_bytes(bpe):
    """\\xff is one raw byte (llama.cpp tokenizes it as U+FFFD); echoing it must not crash a UTF-8 stdout."""
    res = cli("run", bpe, "-p", r"x\xffy", "-n", "2", "--temp", "0")
    assert res.code == 0, res.err
    assert res.out_bytes.startswith(b"x\xffy")


def test_prompt_file_byte_for_byte(d, bpe, tok):
    raw = b"First line\\n stays \\\\ as written\r\nwindows line\tand a tab \xc3\xa9\n\n"
    (d / "prompt.txt").write_bytes(raw)
    j = run_json(bpe, "-f", d / "prompt.txt", "-n", "2", "--temp", "0")
    assert j["prompt_tokens"] == tok.encode(raw.decode("utf-8"), add_special=None, parse_special=True)
    res = cli("run", bpe, "-f", d / "prompt.txt", "-n", "2", "--temp", "0")
    assert res.out_bytes.startswith(raw)


def test_prompt_file_not_utf8(d, bpe):
    (d / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    res = cli("run", bpe, "-f", d / "latin1.txt", "-n", "2", "--temp", "0")
    assert res.code == 0, res.err
    assert res.out_bytes.startswith(b"caf\xe9 au lait")


@pytest.mark.parametrize("flag, n_ctx", [([], 256), (["-c", "0"], 256), (["-c", "4096"], 256), (["-c", "64"], 64)])
def test_context_size(bpe, flag, n_ctx):
    """-c 0 is the model's training context (256 here); the default 4096 is capped at it."""
    j = run_json(bpe, "-p", PROMPT, "-n", "-1", "--ignore-eos", "--temp", "0", *flag)
    assert len(j["prompt_tokens"]) + len(j["tokens"]) == n_ctx


def test_engine_reference(bpe):
    a = run_json(bpe, "-p", PROMPT, "-n", "6", "--temp", "0", "--engine", "reference")
    b = run_json(bpe, "-p", PROMPT, "-n", "6", "--temp", "0")
    assert a["tokens"] == b["tokens"]


def test_special_tokens_in_prompt_are_parsed(bpe, tok):
    j = run_json(bpe, "-p", "<|im_start|>user", "-n", "1", "--temp", "0")
    assert j["prompt_tokens"][0] == tok.encode("<|im_start|>", add_special=False, parse_special=True)[0]
    assert len(tok.encode("<|im_start|>", add_special=False, parse_special=True)) == 1


# --- pi2 tokenize ---

def test_tokenize_lines_like_llama_tokenize(bpe, tok):
    text = "Hello world, how are you?"
    res = cli("tokenize", "-m", bpe, "-p", text)
    assert res.code == 0, res.err
    ids = tok.encode(text, add_special=None, parse_special=True)
    want = [f"{i:6d} -> '{tok.token_to_piece(i, special=True).decode()}'" for i in ids]
    assert res.out.splitlines() == want


def test_tokenize_ids(bpe, tok):
    res = cli("tokenize", bpe, "-p", "Hello world", "--ids")
    assert res.code == 0 and res.out.count("\n") == 1
    assert json.loads(res.out) == tok.encode("Hello world", add_special=None, parse_special=True)
    assert re.fullmatch(r"\[\d+(, \d+)*\]\n", res.out)


def test_tokenize_no_bos(spm):
    stok = load_model(spm).tokenizer
    assert stok.add_bos
    with_bos = json.loads(cli("tokenize", "-m", spm, "-p", "Hello world", "--ids").out)
    without = json.loads(cli("tokenize", "-m", spm, "-p", "Hello world", "--ids", "--no-bos").out)
    assert with_bos[0] == stok.bos_id and with_bos[1:] == without and stok.bos_id not in without


def test_tokenize_special_parsing(bpe, tok):
    im_start = tok.encode("<|im_start|>", add_special=False, parse_special=True)
    parsed = json.loads(cli("tokenize", "-m", bpe, "-p", "<|im_start|>user", "--ids").out)
    plain = json.loads(cli("tokenize", "-m", bpe, "-p", "<|im_start|>user", "--ids", "--no-parse-special").out)
    assert len(im_start) == 1 and parsed[0] == im_start[0]
    assert im_start[0] not in plain and len(plain) > len(parsed)


def test_tokenize_file_and_count(d, bpe, tok):
    (d / "t.txt").write_bytes(b"two\nlines\\n\n")
    res = cli("tokenize", "-m", bpe, "-f", d / "t.txt", "--show-count")
    ids = tok.encode("two\nlines\\n\n", add_special=None, parse_special=True)
    assert res.code == 0 and res.out.splitlines()[-1] == f"Total number of tokens: {len(ids)}"
    assert len(res.out.splitlines()) >= len(ids) + 1


# --- pi2 info, pi2 perplexity ---

def test_info(bpe):
    res = cli("info", bpe)
    assert res.code == 0, res.err
    for word in ("architecture", "llama", "parameters", "0.11 M", "tensor groups", "attention", "ffn",
                 "embedding", "Q8_0", "tokenizer", "gpt2", "context", "256"):
        assert word in res.out, word
    assert cli("info", "-m", bpe).out == res.out


def test_perplexity(d, bpe):
    (d / "corpus.txt").write_text(TEXT)
    res = cli("perplexity", "-m", bpe, "-f", d / "corpus.txt", "-c", "32", "--chunks", "2")
    assert res.code == 0, res.err
    both = res.out + res.err
    finals = re.findall(r"^Final estimate: PPL = \d+\.\d{4} \+/- \d+\.\d{5}$", both, re.M)
    assert len(finals) == 1 and res.out == finals[0] + "\n"
    assert "calculating perplexity over 2 chunks, n_ctx=32" in res.err
    assert re.search(r"^\[1\][\d.]+,\[2\][\d.]+,$", res.err, re.M)


# --- help, Ctrl-C, the user's files ---

HELP_PROBE = ("import json, sys\nfrom pi2.cli.main import main\nsys.argv[0] = 'pi2'\nmain(sys.argv[1:])\n"
              "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('numpy', 'cffi', 'jinja2', 'gguf') or m in ('pi2.cli.commands', 'pi2._pi2'))), file=sys.stderr)\n")


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["tokenize", "--help"]])
def test_help_is_fast_and_light(args):
    p = subprocess.run([sys.executable, "-c", HELP_PROBE, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "Usage" in p.stdout and json.loads(p.stderr.splitlines()[-1]) == []   # no numpy, cffi, gguf, ...


def test_run_help_lists_llama_cpp_flags():
    out = cli_process("run", "--help", env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).out
    for flag in ("--prompt", "--file", "--n-predict", "--threads", "--ctx-size", "--temp", "--top-k", "--top-p",
                 "--min-p", "--repeat-penalty", "--repeat-last-n", "--seed", "--ignore-eos", "--no-escape",
                 "-cnv", "--engine", "--json"):
        assert flag in out, flag


def test_no_arguments_shows_help():
    res = cli_process()
    assert res.code == 2 and "Usage" in res.out + res.err and "Traceback" not in res.err


@pytest.mark.skipif(shutil.which("pi2") is None, reason="pi2 console script not installed")
def test_console_script():
    p = subprocess.run(["pi2", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "run" in p.stdout


def test_ctrl_c_exits_130(d):
    """SIGINT mid-generation: exit 130, timings, no traceback. A 32k context keeps even a fast engine busy."""
    model = write_model(d / "long.gguf", n_ctx=32768)
    p = subprocess.Popen([sys.executable, "-m", "pi2", "run", model, "-p", PROMPT, "-n", "-1", "--ignore-eos",
                          "-c", "32768"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    head = b""
    deadline = time.monotonic() + 120
    while len(head) < len(PROMPT.encode()) + 8 and time.monotonic() < deadline:   # the prompt echoed, then text
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            break
        head += chunk
    assert p.poll() is None, "finished before the interrupt"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    out, err = head + out, err.decode()
    assert p.returncode == 130, err
    assert "Traceback" not in err and err.rstrip().endswith("pi2: interrupted")
    assert out.startswith(PROMPT.encode())
    timing_counts(err)      # llama-completion prints its timings on Ctrl-C too


def test_model_file_is_never_modified(d, bpe):
    before, mtime = sha256(bpe), bpe.stat().st_mtime_ns
    (d / "c.txt").write_text(TEXT)
    for args in (["run", bpe, "-p", PROMPT, "-n", "3"], ["run", bpe, "-p", "x", "-c", "4"],
                 ["tokenize", "-m", bpe, "-p", PROMPT], ["info", bpe],
                 ["perplexity", "-m", bpe, "-f", d / "c.txt", "-c", "32", "--chunks", "1"]):
        cli(*args)
    cli("run", bpe, "-cnv", "-n", "2", stdin="hi\n")
    assert sha256(bpe) == before and bpe.stat().st_mtime_ns == mtime
    assert (d / "c.txt").read_text() == TEXT


# --- SmolLM2-135M ---

def _golden(name):
    return json.loads((DATA / name).read_text())      # llama.cpp's goldens, provenance in tests/data/README.md


@pytest.mark.model
def test_smollm2_greedy_matches_llama_cpp():
    path = model_file("smollm2-135m")
    case = _golden("smollm2-135m.greedy.json")["prompts"][0]
    n = 8 if case["first_near_tie_index"] is None else min(8, case["first_near_tie_index"])
    before = sha256(path)
    res = cli("run", path, "-p", case["prompt"], "-n", str(n), "--temp", "0", "--json", timeout=120)
    j = json.loads(res.out)
    assert j["prompt_tokens"] == case["prompt_ids"] and j["tokens"] == case["ids"][:n]
    assert case["text"].startswith(j["text"])
    assert sha256(path) == before


@pytest.mark.model
def test_smollm2_tokenize_matches_llama_cpp():
    path = model_file("smollm2-135m")
    cases = _golden("smollm2-135m.tokenize.json")["cases"]
    for case in cases[:6]:
        for special, flag in ((True, []), (False, ["--no-parse-special"])):
            out = cli("tokenize", "-m", path, "-p", case["text"], "--ids", "--no-escape", *flag, timeout=60)
            want = case["parse_special_true" if special else "parse_special_false"]["ids"]
            assert json.loads(out.out) == want, case["name"]


@pytest.mark.model
def test_smollm2_info():
    res = cli("info", model_file("smollm2-135m"), timeout=60)
    assert res.code == 0 and "llama" in res.out and "8192" in res.out and "Q4_1" in res.out
