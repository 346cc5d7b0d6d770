"""test_cli_chat.py — `pi2 run -cnv` with stdin piped: turns rendered with the chat template (or llama.cpp's
ChatML fallback), replies on stdout, the KV cache holding exactly the conversation, clean ends (EOF, /exit,
a full context).
"""
import pytest

from clirun import assert_error, cli, sha256, timing_counts
from conftest import model_file
from fixtures import write_model
from pi2.runtime.generate import Timings, generate
from pi2.model.chat import render_chat, select_template
from pi2.runtime.config import RunConfig
from pi2.runtime.session import open_model, open_session
from pi2.runtime.sampling import Sampler, SamplerParams


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_chat")


@pytest.fixture(scope="module")
def bpe(d):
    return write_model(d / "bpe.gguf")                  # ChatML template in the file


@pytest.fixture(scope="module")
def spm(d):
    return write_model(d / "spm.gguf", vocab="spm")     # llama SPM vocab, no chat template


def replay(path, lines, n, system=None):
    """What the chat should print, recomputed with the library: each turn's new text is tokenized after the
    cached conversation and every reply is greedy from a fresh context fed the whole token stream at once.
    Returns (replies, number of tokens the chat's context must have evaluated)."""
    model = open_model(path)
    tok = model.tokenizer
    template, _ = select_template(model.file.kv)
    piece = lambda i: tok.token_to_piece(i).decode("utf-8", "replace") if i is not None else ""  # noqa: E731
    messages = [{"role": "system", "content": system}] if system else []
    stream, cached, replies = [], "", []
    for line in lines:
        messages.append({"role": "user", "content": line})
        full = render_chat(template, messages, True, piece(tok.bos_id), piece(tok.eos_id))
        assert full.startswith(cached)
        stream += tok.encode(full[len(cached):], add_special=(cached == ""), parse_special=True)
        ctx = open_session(model, RunConfig(n_ctx=0))
        sampler = Sampler(SamplerParams(temp=0.0), model.config.n_vocab, ctx.n_ctx)
        gen = generate(ctx, tok, stream, n, sampler, Timings(), special=False)
        assert gen.stop_reason == "length", "pick inputs whose replies run to -n"
        replies.append(gen.text)
        messages.append({"role": "assistant", "content": gen.text})
        stream += gen.tokens
        cached = full + gen.text
    return replies, len(stream)


def test_chat_two_turns(bpe):
    lines = ["Hello there", "How are you?"]
    res = cli("run", bpe, "-cnv", "-n", "4", "--temp", "0", stdin="\n".join(lines) + "\n")
    assert res.code == 0, res.err
    replies, n_tokens = replay(bpe, lines, 4)
    assert res.out == "".join(r + "\n" for r in replies)
    counts = timing_counts(res.err)
    assert counts["total"] == n_tokens          # every reply token is in the cache, the last ones too
    assert "Traceback" not in res.err


def test_chat_with_system_prompt(bpe):
    lines = ["What is a fox?"]
    res = cli("run", bpe, "-cnv", "-p", "You are terse.", "-n", "3", "--temp", "0", stdin=lines[0] + "\n")
    assert res.code == 0, res.err
    replies, n_tokens = replay(bpe, lines, 3, system="You are terse.")
    assert res.out == replies[0] + "\n" and timing_counts(res.err)["total"] == n_tokens


def test_chat_without_template_falls_back_to_chatml(spm):
    """llama.cpp uses its ChatML template when the GGUF has none; pi2 says so on stderr and does the same."""
    lines = ["Hello there", "Tell me more"]
    res = cli("run", spm, "-cnv", "-n", "3", "--temp", "0", stdin="\n".join(lines) + "\n")
    assert res.code == 0, res.err
    assert "no chat template" in res.err and "ChatML" in res.err
    replies, n_tokens = replay(spm, lines, 3)
    assert res.out == "".join(r + "\n" for r in replies)
    assert timing_counts(res.err)["total"] == n_tokens


def test_blank_lines_skipped_and_exit_command(bpe):
    res = cli("run", bpe, "-cnv", "-n", "2", "--temp", "0", stdin="\n   \nHello there\n/exit\nnever asked\n")
    assert res.code == 0, res.err
    replies, n_tokens = replay(bpe, ["Hello there"], 2)
    assert res.out == replies[0] + "\n" and timing_counts(res.err)["total"] == n_tokens


def test_immediate_eof(bpe):
    res = cli("run", bpe, "-cnv", stdin="")
    assert res.code == 0 and res.out == "" and "Traceback" not in res.err


def test_full_context_ends_the_chat_cleanly(bpe):
    res = cli("run", bpe, "-cnv", "-c", "48", "-n", "8", "--temp", "0", "--ignore-eos",
              stdin="".join(f"Question number {i}, please answer it\n" for i in range(10)))
    assert res.code == 0, res.err
    assert "context is full" in res.err and "Traceback" not in res.err
    assert timing_counts(res.err)["total"] <= 48


def test_first_turn_too_long_for_the_context(bpe):
    assert_error(cli("run", bpe, "-cnv", "-c", "16", stdin="word " * 40 + "\n"), 2, "too long")


def test_chat_leaves_the_model_alone(bpe):
    before = sha256(bpe)
    cli("run", bpe, "-cnv", "-n", "2", stdin="hi\nagain\n")
    assert sha256(bpe) == before


@pytest.mark.model
def test_smollm2_chat():
    path = model_file("smollm2-135m")
    before = sha256(path)
    res = cli("run", path, "-cnv", "-n", "6", "--temp", "0", "-c", "256",
              stdin="What is the capital of France?\nAnd of Italy?\n", timeout=300)
    assert res.code == 0, res.err
    assert len(res.out.strip()) > 0 and "Traceback" not in res.err
    counts = timing_counts(res.err)
    assert counts["total"] > 20
    assert sha256(path) == before
