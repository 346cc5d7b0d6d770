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
    """-sys is the system message (as llama.cpp's); -p the first user message, answered before stdin is read."""
    lines = ["What is a fox?"]
    res = cli("run", bpe, "-cnv", "-sys", "You are terse.", "-n", "3", "--temp", "0", stdin=lines[0] + "\n")
    assert res.code == 0, res.err
    replies, n_tokens = replay(bpe, lines, 3, system="You are terse.")
    assert res.out == replies[0] + "\n" and timing_counts(res.err)["total"] == n_tokens
    res = cli("run", bpe, "-cnv", "-sys", "You are terse.", "-p", lines[0], "-n", "3", "--temp", "0", stdin="")
    assert res.code == 0 and res.out == replies[0] + "\n"


def test_single_turn_answers_p_and_exits(bpe):
    res = cli("run", bpe, "-st", "-p", "What is a fox?", "-n", "3", "--temp", "0", stdin="never read\n")
    assert res.code == 0, res.err
    replies, n_tokens = replay(bpe, ["What is a fox?"], 3)
    assert res.out == replies[0] + "\n" and timing_counts(res.err)["total"] == n_tokens


def test_banner_says_how_to_quit(bpe, monkeypatch):
    import pi2.cli.run_chat as run_chat
    monkeypatch.setattr(run_chat, "_interactive", lambda: True)     # as at a terminal
    res = cli("run", bpe, "-cnv", "-n", "2", stdin="")
    assert "Ctrl-C stops a reply" in res.err and "/exit" in res.err and "/regen" in res.err


def test_clear_forgets_the_conversation(bpe):
    res = cli("run", bpe, "-cnv", "-n", "3", "--temp", "0", stdin="Hello there\n/clear\nHow are you?\n")
    assert res.code == 0, res.err
    first, _ = replay(bpe, ["Hello there"], 3)
    fresh, _ = replay(bpe, ["How are you?"], 3)       # answered as a first turn: nothing before it
    assert res.out == first[0] + "\n" + fresh[0] + "\n" and "conversation cleared" in res.err


def test_regen_answers_the_last_message_again(bpe):
    res = cli("run", bpe, "-cnv", "-n", "3", "--temp", "0", stdin="Hello there\n/regen\n")
    assert res.code == 0, res.err
    first, _ = replay(bpe, ["Hello there"], 3)
    assert res.out == first[0] + "\n" + first[0] + "\n"      # greedy: the same reply to the same history
    res = cli("run", bpe, "-cnv", "-n", "3", "--temp", "0", stdin="/regen\n")
    assert res.code == 0 and "nothing to answer again" in res.err


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(bpe, monkeypatch):
    """The first reply is interrupted after its first piece (as by Ctrl-C): the chat prints what it had, says the
    reply stopped, and answers the next line with the interrupted reply in the history."""
    import pi2.api as api
    real, streams = api.Stream.advance, []

    def interrupted(self, *a, **kw):     # Ctrl-C while the first reply decodes its second token
        if self not in streams:
            streams.append(self)
        if self is streams[0] and self.text:
            raise KeyboardInterrupt
        return real(self, *a, **kw)
    monkeypatch.setattr(api.Stream, "advance", interrupted)
    res = cli("run", bpe, "-cnv", "-n", "3", "--temp", "0", stdin="Hello there\nHow are you?\n")
    assert res.code == 0, res.err
    assert "reply stopped" in res.err and len(streams) == 2
    lines = [ln for ln in res.out.split("\n") if ln]
    assert len(lines) == 2 and "Traceback" not in res.err


def test_reverse_prompt_stops_a_reply(bpe):
    full = cli("run", bpe, "-p", "Hello", "-n", "8", "--temp", "0", "--no-display-prompt").out.rstrip("\n")
    stop = full[len(full) // 3:len(full) // 3 + 4]        # text that first appears inside the reply
    res = cli("run", bpe, "-p", "Hello", "-n", "8", "--temp", "0", "--no-display-prompt", "-r", stop)
    out = res.out.rstrip("\n")
    assert res.code == 0 and stop in out and full.startswith(out) and len(out) < len(full)
    assert stop not in out[:-1 - len(stop) - 3]     # it stopped at the first piece that completed the text


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


@pytest.mark.model
def test_gemma3_chats_with_the_template_its_vocabulary_implies():
    """Gemma-3-270M's GGUF has no chat template: pi2 uses gemma's (llama.cpp needs --chat-template gemma), and the
    prompt and the greedy reply are llama.cpp's with that template (tests/data/gemma3-270m.chat.json)."""
    import json
    from conftest import DATA
    from pi2.runtime.chat import Chat
    gold = json.loads((DATA / "gemma3-270m.chat.json").read_text())
    path = model_file("gemma3-270m")
    import pi2
    conv = Chat(pi2.load(path, n_ctx=256, n_threads=1).default_sequence)
    session = conv.session
    assert conv.template_name == "gemma" and not conv.fallback
    text = conv.render([{"role": "user", "content": gold["user"]}])
    assert session.model.tokenizer.encode(text, add_special=True, parse_special=True) == gold["prompt_ids"]
    res = cli("run", path, "-st", "-p", gold["user"], "--temp", "0", "-n", gold["n_predict"], "-c", "256", "-t", "1",
              timeout=300)
    assert res.code == 0, res.err
    assert res.out == gold["reply"] + "\n" and "no chat template" not in res.err
