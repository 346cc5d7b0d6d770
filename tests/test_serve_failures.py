"""test_serve_failures.py — how `pi2 serve` ends a request that cannot go on, over HTTP, as llama-server does: a
context that fills up without --context-shift ends the text with finish_reason "length" (streamed and not); a
failure before a stream's first piece (a prompt the context cannot hold even after a shift, an engine error in
the prompt) is a plain error response with its status, not a stream; an engine error after the first piece is an
error object event that ends the stream without [DONE]; the server keeps serving after each."""
from __future__ import annotations

import http.client
import json
import threading

import pytest
import uvicorn

import pi2
from conftest import model_file
from pi2.errors import FlashIOError
from pi2.serve.app import Server
from pi2.serve.main import bind
from pi2.serve.slots import Slots
from servefix import LiveServer

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.model, pytest.mark.slow]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def path():
    return model_file("smollm2-135m")


def sse(url: str, route: str, body: dict) -> tuple:
    """(status, content type, the parsed `data:` events, [DONE] last) of a streamed request sent as raw HTTP."""
    c = http.client.HTTPConnection(url[7:], timeout=120)
    c.request("POST", route, body=json.dumps({**body, "stream": True}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    ctype = r.getheader("content-type", "")
    if not ctype.startswith("text/event-stream"):
        out = json.loads(r.read())
        c.close()
        return r.status, ctype, [out], False
    events, done = [], False
    for line in r:
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                done = True
            else:
                events.append(json.loads(line[6:]))
    c.close()
    return r.status, ctype, events, done


def test_a_full_context_ends_with_length(path):
    """-c 64, no shift: the text ends where the next token would not fit (n_ctx - prompt tokens), finish_reason
    "length", streamed and not, with the same text."""
    s = LiveServer(path, "-c", "64", "-np", "1", "-t", "1")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
        body = dict(model="pi2", prompt=PROMPT, max_tokens=500, temperature=0, extra_body={"ignore_eos": True})
        whole = client.completions.create(**body)
        n_prompt = whole.usage.prompt_tokens
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage.completion_tokens == 64 - n_prompt
        chunks = list(client.completions.create(**body, stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage.completion_tokens == 64 - n_prompt
        msgs = [{"role": "user", "content": "Tell me a long story."}]
        chat = list(client.chat.completions.create(model="pi2", messages=msgs, max_tokens=500, temperature=0,
                                                   stream=True, extra_body={"ignore_eos": True}))
        assert chat[-1].choices[0].finish_reason == "length"
    finally:
        code, log = s.stop()
    assert code == 130 and "Traceback" not in log, log


def test_a_prompt_too_long_for_a_shift_is_400_not_a_stream(path):
    """--context-shift skips the up-front length check (a conversation may go on from a shifted cache); a prompt
    that does not fit even after a shift fails when its slot starts it: a 400 context_length_exceeded response,
    streamed request or not, then the server answers the next request."""
    s = LiveServer(path, "-c", "64", "-np", "1", "-t", "1", "--context-shift")
    try:
        long = "word " * 100
        for route, body, param in (("/v1/completions", {"prompt": long}, "prompt"),
                                   ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]},
                                    "messages")):
            status, ctype, events, _ = sse(s.url, route, {**body, "max_tokens": 4})
            assert status == 400 and ctype.startswith("application/json"), (status, ctype, events)
            err = events[0]["error"]
            assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
            assert err["param"] == param and "context" in err["message"]
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="pi2", prompt=long, max_tokens=4, stream=True)
        assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
        status, _, events, done = sse(s.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                                               "ignore_eos": True})
        assert status == 200 and done and events[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        code, log = s.stop()
    assert code == 130 and "Traceback" not in log, log


class FailingReads:
    """A context whose decodes fail as a model file's failed read does (FlashIOError, an EngineError) once `after`
    more decodes have run; `after` None: never."""

    def __init__(self, ctx):
        self._ctx, self.after = ctx, None

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def decode(self, tokens, all_logits: bool = False):
        if self.after is not None:
            if self.after == 0:
                raise FlashIOError("cannot read model.gguf: Input/output error", sys_errno=5, filename="model.gguf")
            self.after -= 1
        return self._ctx.decode(tokens, all_logits)


@pytest.fixture(scope="module")
def faulty(path):
    """(url, the slot's FailingReads) of a server run in this process (its one slot's reads can be made to fail)."""
    model = pi2.load(path, n_ctx=256, n_threads=1)
    slots = Slots(model, 1).start()
    ctx = FailingReads(slots.slots[0].seq.kept.ctx)
    slots.slots[0].seq.kept.ctx = ctx
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(Server(slots).app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(200):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield url, ctx
    server.should_exit = True
    t.join(30)
    slots.stop()
    sock.close()
    model.close()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_an_engine_error_mid_stream_is_an_error_event(faulty, route):
    url, ctx = faulty
    body = ({"prompt": PROMPT} if route == "/v1/completions" else
            {"messages": [{"role": "user", "content": "Tell me a story."}]})
    body = {**body, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    ctx.after = 6          # the prompt and five tokens decode, then a read fails
    status, ctype, events, done = sse(url, route, body)
    ctx.after = None
    assert status == 200 and ctype.startswith("text/event-stream")
    pieces = [e for e in events if "choices" in e]
    assert len(pieces) >= 6 and all(e["choices"][0]["finish_reason"] is None for e in pieces)
    err = events[-1]["error"]
    assert "choices" not in events[-1] and not done       # the stream ends on the error, without [DONE]
    assert err["type"] == "server_error" and "Input/output error" in err["message"]
    status, _, events, done = sse(url, route, body)          # the slot was freed: the next request is served
    assert status == 200 and done and events[-1]["choices"][0]["finish_reason"] == "length"


def test_an_engine_error_in_the_prompt_is_a_500_response(faulty):
    """A failure before the first piece: a plain 500 error object (the openai client raises it at create())."""
    url, ctx = faulty
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    ctx.after = 0
    try:
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model="pi2", prompt=PROMPT + " again", max_tokens=8, stream=True)
        assert e.value.status_code == 500 and "Input/output error" in str(e.value)
        ctx.after = 3
        stream = client.completions.create(model="pi2", prompt=PROMPT + " and again", max_tokens=8, stream=True,
                                           temperature=0, extra_body={"ignore_eos": True})
        with pytest.raises(openai.APIError, match="Input/output error"):
            for _ in stream:
                pass
    finally:
        ctx.after = None
    r = client.completions.create(model="pi2", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
