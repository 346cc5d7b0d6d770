"""test_api_chat_shift.py — context shift in the Python API and pi2 serve (load(ctx_shift=True), --context-shift): a
conversation that fills a small context keeps being answered, each call going on from the shifted cache when the
messages extend what it evaluated (as llama-server's slots do); the C engine answers as the reference engine does
(the reference that tests/test_chat_shift.py holds pi2 run -cnv to), with F16 and Q8_0 keys."""
import json
import urllib.request

import pytest

import pi2
from fixtures import write_model
from pi2.errors import ContextFullError
from servefix import LiveServer

TURNS = [f"hi {i}" for i in range(10)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("api_shift") / "bpe.gguf", n_embd=128, n_head=2, head_dim=64)


def converse(model, turns=TURNS, n=4):
    msgs, out = [], []
    for text in turns:
        msgs.append({"role": "user", "content": text})
        c = model.chat(msgs, max_tokens=n, temp=0)
        msgs.append({"role": "assistant", "content": c.text})
        out.append(c)
    return out


@pytest.mark.parametrize("ctk", ["f16", "q8_0"])
def test_a_full_context_shifts_and_the_chat_goes_on(bpe, ctk):
    c = pi2.load(bpe, n_ctx=64, ctx_shift=True, engine="c", cache_type_k=ctk)
    got = converse(c)
    seq = c.default_sequence
    assert seq.kept.dropped > 64                                   # several shifts
    assert len(got[-1].prompt_tokens) > 2 * 64                    # the conversation is far longer than the context
    assert all(x.finish_reason == "length" for x in got)
    assert got[-1].n_cached > len(got[-1].prompt_tokens) - 30      # went on from the shifted cache
    ref = converse(pi2.load(bpe, n_ctx=64, ctx_shift=True, engine="reference", cache_type_k=ctk))
    assert [x.text for x in got] == [x.text for x in ref]
    assert [x.tokens for x in got] == [x.tokens for x in ref]


def test_without_context_shift_the_conversation_ends(bpe):
    with pytest.raises(ContextFullError):
        converse(pi2.load(bpe, n_ctx=64))


def test_keep_tokens_changes_what_survives(bpe):
    a = converse(pi2.load(bpe, n_ctx=64, ctx_shift=True))
    b = converse(pi2.load(bpe, n_ctx=64, ctx_shift=True, n_keep=6))
    assert [x.text for x in a] != [x.text for x in b]


def test_another_conversation_after_a_shift_starts_over(bpe):
    m = pi2.load(bpe, n_ctx=64, ctx_shift=True)
    converse(m)
    fresh = m.chat([{"role": "user", "content": "bye"}], max_tokens=4, temp=0)
    want = pi2.load(bpe, n_ctx=64).chat([{"role": "user", "content": "bye"}], max_tokens=4, temp=0)
    assert fresh.tokens == want.tokens and fresh.n_cached <= 2


def test_serve_chat_slot_shifts(bpe):
    want = [x.text for x in converse(pi2.load(bpe, n_ctx=64, ctx_shift=True))]
    server = LiveServer(bpe, "-c", "64", "--context-shift")
    got, msgs = [], []
    try:
        for text in TURNS:
            msgs.append({"role": "user", "content": text})
            body = json.dumps({"messages": msgs, "max_tokens": 4, "temperature": 0}).encode()
            req = urllib.request.Request(server.url + "/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                reply = json.loads(r.read())["choices"][0]["message"]["content"]
            msgs.append({"role": "assistant", "content": reply})
            got.append(reply)
    finally:
        server.stop()
    assert got == want
