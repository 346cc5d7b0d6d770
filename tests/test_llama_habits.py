"""test_llama_habits.py — a llama.cpp user's command lines: multi-letter short flags as llama.cpp spells them
(implemented, accepted with a note, or refused by their full spelling), -h and --version on every command, the
sampler flags' range checks (usage errors, no numpy warnings), the error messages issue 18 lists, and one exit-code
rule (2 usage, 1 otherwise) across commands."""
import pytest

from clirun import assert_error, cli
from fixtures import write_model

COMMANDS = ["run", "tokenize", "info", "perplexity", "bench", "convert", "devices", "profile-io", "plan"]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("habits") / "m.gguf")


def run(good, *args):
    return cli("run", good, "-p", "Hello", "-n", "3", "--temp", "0", "--no-display-prompt", *args)


@pytest.mark.parametrize("args, note", [
    (["-ngl", "99"], "-ngl accepted and ignored"), (["--n-gpu-layers", "99"], "--n-gpu-layers accepted"),
    (["-fa", "off", "-nr"], "-nr accepted"),
    (["--numa", "distribute"], "--numa accepted"), (["-tb", "2"], "-tb accepted"),
])
def test_flags_that_do_not_apply_are_accepted_with_a_note(good, args, note):
    res = run(good, *args)
    plain = run(good)
    assert res.code == 0, res.err
    assert res.out == plain.out and note in res.err
    assert sum(note.split()[0] in line for line in res.err.splitlines()) == 1      # one line


@pytest.mark.parametrize("flag", ["-xyz", "-ngx", "-ctkk"])
def test_unknown_short_flags_are_refused_by_their_full_spelling(good, flag):
    assert_error(run(good, flag, "1"), 2, f"unknown option {flag}")


@pytest.mark.parametrize("args", [["-sys", "hi", "-no-cnv"], ["-b", "64", "-ub", "16"], ["-ctk", "f16", "-ctv", "f16"],
                                  ["-v"], ["-s", "5"], ["-sp"], ["-e"], ["--temperature", "0"]])
def test_implemented_llama_flags_parse_as_llama_cpp_spells_them(good, args):
    res = run(good, *args)
    assert res.code == 0, res.err
    assert res.out == run(good).out


def test_mlock_locks_the_model_pages(good):
    """--mlock (and -lm mlock): the file's pages are locked (VmLck grows by the file's size), or, where the limit
    refuses, a warning as llama.cpp's, and the run goes on."""
    import resource
    from pi2.model.gguf_file import GGUFFile
    f = GGUFFile(good)
    why = f.lock()
    if resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] == resource.RLIM_INFINITY or not why:
        locked = [ln for ln in open("/proc/self/status") if ln.startswith("VmLck:")][0]
        assert not why and int(locked.split()[1]) * 1024 >= f.file_size
    else:
        assert "RLIMIT_MEMLOCK" in why
    for args in (["--mlock"], ["-lm", "mlock"]):
        res = run(good, *args)
        assert res.code == 0 and res.out == run(good).out, res.err


def test_batch_sizes_give_the_same_tokens(good):
    long = ["-p", "one two three four five six seven eight nine ten eleven twelve"]
    a = cli("run", good, *long, "-n", "4", "--temp", "0", "-b", "3")
    b = cli("run", good, *long, "-n", "4", "--temp", "0")
    assert a.code == 0 and a.out == b.out


def test_kv_types_pi2_does_not_hold_are_refused(good):
    assert_error(run(good, "-ctk", "iq4_nl"), 2, "-ctk iq4_nl")
    assert_error(run(good, "-fa", "off", "-ctv", "q8_0"), 2, "-ctv q8_0")   # a quantized V needs flash attention


@pytest.mark.parametrize("command", COMMANDS)
def test_help_and_version_everywhere(command):
    for h in ("-h", "--help"):
        res = cli(command, h)
        assert res.code == 0 and "Usage" in res.out, (command, h)
    res = cli(command, "--version")
    assert res.code == 0 and res.out.startswith("pi2 ")
    assert cli("--version").out == res.out


@pytest.mark.parametrize("args, match", [
    (["--temp", "nan"], "--temp"), (["--top-p", "2"], "--top-p"), (["--min-p", "-1"], "--min-p"),
    (["--repeat-penalty", "0"], "--repeat-penalty"), (["--repeat-penalty", "-1"], "--repeat-penalty"),
    (["--typical", "3"], "--typical"), (["--mirostat", "5"], "--mirostat"), (["--dry-base", "0.5"], "--dry-base"),
    (["--xtc-probability", "-0.1"], "--xtc-probability"), (["--samplers", "top_k;warp"], "warp"),
    (["--top-k", "-3"], "--top-k"), (["-b", "0"], "-b 0"),
])
def test_out_of_range_sampler_values_are_usage_errors(good, args, match):
    res = run(good, *args)
    assert_error(res, 2, match)
    assert "Warning" not in res.err


@pytest.mark.parametrize("args", [
    ["--typical", "0.5"], ["--mirostat", "1"], ["--mirostat", "2", "--mirostat-ent", "3"], ["--top-nsigma", "1"],
    ["--xtc-probability", "0.5", "--xtc-threshold", "0.1"], ["--dry-multiplier", "0.8"], ["--samplers", "top_k;temp"],
    ["--sampling-seq", "kt"], ["--presence-penalty", "0.5", "--frequency-penalty", "0.5"],
    ["--dynatemp-range", "0.3"], ["--top-k", "0", "--top-p", "1", "--min-p", "0", "--temp", "5"],
])
def test_sampler_flags_run_without_warnings(good, args, recwarn):
    res = cli("run", good, "-p", "Hello", "-n", "6", "-s", "3", *args)
    assert res.code == 0, res.err
    assert "Warning" not in res.err and not [w for w in recwarn if "numpy" in str(w.filename)]


def test_sampler_flags_change_the_sampling(good):
    base = cli("run", good, "-p", "Hello", "-n", "12", "-s", "3", "--temp", "1.5", "--top-k", "0", "--min-p", "0")
    for extra in (["--mirostat", "2"], ["--typical", "0.3"], ["--xtc-probability", "1", "--xtc-threshold", "0.01"]):
        res = cli("run", good, "-p", "Hello", "-n", "12", "-s", "3", "--temp", "1.5", "--top-k", "0", "--min-p", "0",
                  *extra)
        assert res.code == 0 and res.out != base.out, extra


def test_context_size_errors(good):
    assert_error(run(good, "-c", "1"), 2, "too small")
    line = assert_error(run(good, "-c", "100000000"), 2, "more than pi2.s maximum")
    assert "n_batch" not in line and "impl" not in line          # no internal parameters
    res = run(good, "-c", "5000")        # above the training context: a warning, once, and it runs
    assert res.code == 0 and res.err.count("larger than the model's training context") == 1


def test_thread_range_backwards(good):
    assert_error(cli("bench", good, "-t", "2-1", "-p", "8", "-n", "0", "-r", "1"), 2, "ends below where it starts")


def test_garbage_in_messages_is_escaped():
    from pi2.cli.main import _one_line as printable
    assert printable("tensor 'a\x1b[31m\x00b\x7f'") == "tensor 'a\\x1b[31m\\x00b\\x7f'"


def test_sizes_below_a_mib_are_not_zero():
    from pi2.plan.budget import fmt
    assert fmt(1024) == "1.0 KiB" and fmt(512) == "512 bytes" and fmt(3 << 20) == "3.0 MiB"


@pytest.mark.parametrize("command", COMMANDS)
def test_one_exit_code_rule(tmp_path, command):
    """A missing file is exit 1 in every command; a bad flag is exit 2 in every command."""
    missing = tmp_path / "none.gguf"
    extra = {"perplexity": ["-f", missing], "plan": ["--memory-budget", "100M"], "tokenize": ["-p", "x"],
             "run": ["-p", "x"], "bench": ["-p", "8", "-n", "0", "-r", "1"]}.get(command, [])
    res = cli(command, "-m", missing, *extra, "--cache-dir", tmp_path) if command == "profile-io" else \
        cli(command, "-m", missing, *extra)
    assert res.code == 1, (command, res.err)
    assert cli(command, "--no-such-flag").code == 2


def test_the_flag_table_says_what_run_does():
    """docs/llama-cpp-flags.md: each flag's answer is what `pi2 run` does with its spellings."""
    import re
    from pathlib import Path

    import typer
    from pi2.cli.app import app
    from pi2.cli.llama_flags import NOTED
    run_cmd = typer.main.get_command(app).commands["run"]
    known = {o for p in run_cmd.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]} | {"-h", "--help",
                                                                                                 "--version"}
    rows = re.findall(r"^\| `([^|]+)` \| [^|]+ \| ([^|]+) \|$",
                      (Path(__file__).parent.parent / "docs" / "llama-cpp-flags.md").read_text(), re.M)
    assert len(rows) > 200
    for names, answer in rows:
        spell = [n.strip(" `") for n in re.split(r"[,`]\s*", names) if n.strip(" `").startswith("-")]
        if answer.startswith("implemented"):
            assert any(n in known for n in spell), names
        elif answer.startswith("accepted"):
            assert all(n in NOTED or n in known for n in spell), names
        elif answer.startswith("refused"):
            assert not any(n in known or n in NOTED for n in spell), names


def test_interactive_mode_continues_the_text(good):
    """-i: the prompt, -n tokens, then each typed line appended as text and generation going on from it: the same
    tokens as one greedy run over the whole stream."""
    from pi2.runtime.config import RunConfig, SamplerParams
    from pi2.runtime.generate import Timings, generate
    from pi2.runtime.sampling import Sampler
    from pi2.runtime.session import open_model, open_session
    res = cli("run", good, "-i", "-p", "Hello", "-n", "3", "--temp", "0", stdin="world\n")
    assert res.code == 0, res.err
    model = open_model(good)
    tok = model.tokenizer
    stream, texts = tok.encode("Hello", add_special=None, parse_special=True), []
    for extra in (None, "world\n"):
        if extra is not None:
            stream += tok.encode(extra, add_special=False, parse_special=True)
        s = open_session(model, RunConfig(n_ctx=0))
        gen = generate(s.ctx, tok, stream, 3, Sampler(SamplerParams(temp=0.0), model.config.n_vocab, s.n_ctx),
                       Timings())
        texts.append(gen.text)
        stream += gen.tokens
    assert res.out == "Hello" + texts[0] + texts[1] + "\n"
    first = cli("run", good, "-if", "-p", "Hello", "-n", "3", "--temp", "0", stdin="world\n")
    assert first.code == 0 and first.out.startswith("Hello") and first.out != res.out
