"""test_api.py — the Python API (pi2.load) on SmolLM2: streamed and whole generation agree with each other and with
`pi2 run` for a seed, stop strings, the prompt cache (a second turn evaluates only its new tokens and gives the
same tokens as a fresh context), chat with the model's template, tokenize / detokenize, options and their errors."""
from __future__ import annotations

import json

import pytest

import pi2
from clirun import cli
from conftest import model_file
from pi2.errors import ContextFullError, Pi2Error, UsageError

pytestmark = pytest.mark.model
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def path():
    return model_file("smollm2-135m")


@pytest.fixture(scope="module")
def model(path):
    return pi2.load(path, n_ctx=512, n_threads=2)


def run_json(path, *args):
    res = cli("run", str(path), *args, "--json")
    assert res.code == 0, res.err
    return json.loads(res.out.strip().splitlines()[0])


def test_generate_matches_pi2_run_for_a_seed(model, path):
    want = run_json(path, "-p", PROMPT, "-n", "12", "-s", "1234", "-c", "512")
    c = model.generate(PROMPT, max_tokens=12, seed=1234)
    assert c.tokens == want["tokens"] and c.text == want["text"] and c.prompt_tokens == want["prompt_tokens"]
    assert c.finish_reason == "length" and c.seed == 1234
    assert c.usage == {"prompt_tokens": len(want["prompt_tokens"]), "completion_tokens": 12,
                       "total_tokens": len(want["prompt_tokens"]) + 12}


def test_stream_pieces_carry_token_ids_and_join_to_the_text(model):
    whole = model.generate(PROMPT, max_tokens=10, temperature=0)
    stream = model.generate(PROMPT, max_tokens=10, temperature=0, stream=True)
    pieces = list(stream)
    assert [p.token for p in pieces if p.token is not None] == whole.tokens
    assert "".join(p.text for p in pieces) == whole.text == stream.completion.text
    assert stream.completion.n_cached == len(whole.prompt_tokens) - 1    # the same prompt again: all but one cached


def test_prompt_cache_evaluates_only_new_tokens(model, path):
    first = model.generate(PROMPT, max_tokens=8, temp=0)
    longer = PROMPT + first.text + " It is also known for"
    cached = model.generate(longer, max_tokens=8, temp=0)
    assert cached.n_cached >= len(first.prompt_tokens)
    assert cached.timings["prompt_n"] == len(cached.prompt_tokens) - cached.n_cached
    # a fresh context given the same history in the same steps gives the same tokens (the cache's KV entries of
    # generated tokens come from one-token decodes, which need not round as a prompt batch does)
    other = pi2.load(path, n_ctx=512)
    assert other.generate(PROMPT, max_tokens=8, temp=0).tokens == first.tokens
    assert other.generate(longer, max_tokens=8, temp=0).tokens == cached.tokens


def test_the_same_request_again_gives_the_same_output(model):
    a = model.generate(PROMPT, max_tokens=16, seed=5)
    b = model.generate(PROMPT, max_tokens=16, seed=5)
    assert b.n_cached == len(a.prompt_tokens) - 1 and b.tokens == a.tokens


def test_stop_strings(model):
    free = model.generate(PROMPT, max_tokens=16, temp=0)
    assert len(free.text) > 6
    stop = free.text[3:6]
    c = model.generate(PROMPT, max_tokens=16, temp=0, stop=[stop, "never"])
    assert c.finish_reason == "stop" and c.text == free.text[:free.text.index(stop)]
    s = model.generate(PROMPT, max_tokens=16, temp=0, stop=stop, stream=True)
    assert "".join(p.text for p in s) == c.text      # nothing of the stop string leaks into the stream


def test_chat_uses_the_template_and_reuses_the_conversation(model):
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
    prompt = model.apply_chat_template(msgs)
    assert prompt.startswith("<|im_start|>system\nYou are brief.") and prompt.endswith("<|im_start|>assistant\n")
    a = model.chat(msgs, max_tokens=12, temp=0)
    assert a.text and a.finish_reason in ("stop", "length")
    msgs += [{"role": "assistant", "content": a.text}, {"role": "user", "content": "Another one."}]
    b = model.chat(msgs, max_tokens=12, temp=0)
    assert b.n_cached > len(a.prompt_tokens)           # the first turn's tokens were not evaluated again


def test_tokenize_detokenize(model):
    ids = model.tokenize("Hello world")
    assert model.detokenize(ids) == "Hello world"
    assert model.tokenize("<|im_start|>", parse_special=True) == [1]
    assert len(model.tokenize("<|im_start|>", parse_special=False)) > 1
    with pytest.raises(UsageError):
        model.detokenize([model.n_vocab])


def test_errors_are_pi2_errors(model, path, tmp_path):
    with pytest.raises(UsageError, match="unknown option"):
        pi2.load(path, n_ctxx=5)
    with pytest.raises(UsageError):
        pi2.load(tmp_path / "missing.gguf")
    with pytest.raises(UsageError, match="temp must be a float"):
        model.generate(PROMPT, temp="hot")
    with pytest.raises(UsageError, match="unknown sampling option"):
        model.generate(PROMPT, tempp=1.0)
    with pytest.raises(ContextFullError):
        model.generate("word " * 600)
    with pytest.raises(UsageError):
        model.chat([{"content": "no role"}])
    assert issubclass(ContextFullError, Pi2Error)


def test_sequences_are_independent(model):
    a, b = model.sequence(), model.sequence()
    s1 = model.generate(PROMPT, max_tokens=6, temp=0, sequence=a, stream=True)
    s2 = model.generate("Once upon a time", max_tokens=6, temp=0, sequence=b, stream=True)
    out1, out2 = [], []
    for p1, p2 in zip(s1, s2):          # interleaved, one token each
        out1.append(p1.text)
        out2.append(p2.text)
    assert "".join(out1) == model.generate(PROMPT, max_tokens=6, temp=0).text
    s3 = model.generate(PROMPT, max_tokens=20, temp=0, sequence=b, stream=True)
    next(s3)
    with pytest.raises(UsageError, match="already generating"):
        model.generate(PROMPT, sequence=b, stream=True)
    s3.close()
    assert s3.completion.finish_reason == "cancelled"
    assert model.generate(PROMPT, max_tokens=6, temp=0, sequence=b).text == "".join(out1)   # b is free again
