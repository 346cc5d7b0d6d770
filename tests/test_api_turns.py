"""test_api_turns.py — the Python API's hooks for turn-by-turn generation (pi2 run -i / -cnv): a sampler kept across
turns (its random state and penalty window run on, as llama.cpp keeps one) gives the tokens the runtime's own loop
gives with one sampler on one context; feed() evaluates without sampling; reset() empties the sequence."""
from __future__ import annotations

import pytest

import pi2
from fixtures import write_model
from pi2.errors import UsageError
from pi2.runtime.config import SamplerParams
from pi2.runtime.generate import Timings, generate, timed_decode
from pi2.runtime.sampling import Sampler
from pi2.runtime.session import open_model, open_session

SAMPLING = SamplerParams(temp=0.9, seed=7, repeat_penalty=1.3, frequency_penalty=1.5, repeat_last_n=-1)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("api_turns") / "bpe.gguf")


def test_a_kept_sampler_runs_on_across_turns(path):
    model = pi2.load(path, n_ctx=96, n_threads=1)
    seq = model.sequence()
    tok = model.tokenizer
    turns = [tok.encode("Hello there", add_special=None), tok.encode(" and again", add_special=False)]
    kept = Sampler(SAMPLING, model.n_vocab, seq.n_ctx, tokenizer=tok)
    got = []
    for new in turns:
        n_held = len(seq.tokens)
        c = seq.stream(list(seq.tokens) + new, max_tokens=12, ignore_eos=True, sampler=kept).result()
        assert c.n_cached == n_held         # only the new turn is evaluated
        got.append(c.tokens)
        seq.feed(c.tokens[-1:])             # sampled, not evaluated: in the cache before the next turn
    assert len(seq.tokens) == seq.session.n_past
    assert len(kept._prev) == len(seq.tokens)     # each token shown to the kept sampler once, cached ones not again
    session = open_session(open_model(path), model.run)      # the runtime's loop: one sampler, one context
    s, t = Sampler(SAMPLING, model.n_vocab, session.n_ctx, tokenizer=session.model.tokenizer), Timings()
    want = []
    for new in turns:
        gen = generate(session.ctx, session.model.tokenizer, new, 12, s, t, ignore_eos=True)
        want.append(gen.tokens)
        timed_decode(session.ctx, gen.tokens[-1:], t)
    assert got == want


def test_feed_and_reset(path):
    model = pi2.load(path, n_ctx=64, n_threads=1)
    seq = model.sequence()
    ids = model.tokenize("Hello there")
    seq.feed(ids)
    assert seq.tokens == ids and seq.session.n_past == len(ids)
    c = seq.stream(ids + [ids[-1]], max_tokens=2, ignore_eos=True).result()
    assert c.n_cached == len(ids)       # the fed tokens are the prompt cache
    seq.reset()
    assert seq.tokens == [] and seq.session.n_past == 0
    s = seq.stream(ids, max_tokens=4, ignore_eos=True)
    next(s)
    with pytest.raises(UsageError):     # not while it generates
        seq.reset()
    with pytest.raises(UsageError):
        seq.feed(ids)
    s.close()
    seq.reset()
    assert seq.session.n_past == 0
