"""test_chat_shift.py — `pi2 run -cnv --context-shift`: a conversation that fills a small context goes on (the engine
drops half of what follows the kept tokens before the decode that would fill it, as llama-completion does), the same
in the C and reference engines and with a Q8_0 K cache; a user turn too long even after a shift ends the chat."""
import pytest

from clirun import cli, timing_counts
from fixtures import write_model

QUESTIONS = "".join(f"hi {i}\n" for i in range(10))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("chat_shift") / "bpe.gguf", n_embd=128, n_head=2, head_dim=64)


def chat(path, *flags, stdin=QUESTIONS):
    return cli("run", path, "-cnv", "-c", "64", "-n", "8", "--temp", "0", "--ignore-eos", *flags, stdin=stdin,
               timeout=120)


@pytest.mark.parametrize("ctk", ["f16", "q8_0"])
def test_a_full_context_shifts_and_the_chat_goes_on(bpe, ctk):
    res = chat(bpe, "--context-shift", "-ctk", ctk)
    assert res.code == 0, res.err
    assert "context is full" not in res.err and "Traceback" not in res.err
    counts = timing_counts(res.err)
    assert counts["total"] > 3 * 64 and counts["eval"] >= 70   # ten turns of 8 tokens: far more than the context
    ref = chat(bpe, "--context-shift", "-ctk", ctk, "--engine", "reference")
    assert ref.code == 0 and ref.out == res.out   # both engines shift the same cache the same way


def test_keep_tokens_changes_what_survives(bpe):
    a, b = chat(bpe, "--context-shift"), chat(bpe, "--context-shift", "--keep-tokens", "12")
    assert a.code == b.code == 0 and a.out != b.out


def test_without_context_shift_the_chat_ends(bpe):
    res = chat(bpe)
    assert res.code == 0 and "context is full" in res.err


def test_a_turn_too_long_even_after_a_shift_ends_the_chat(bpe):
    res = chat(bpe, "--context-shift", stdin="hi\n" + "word " * 40 + "\n")
    assert res.code == 0 and "context is full" in res.err and "Traceback" not in res.err
