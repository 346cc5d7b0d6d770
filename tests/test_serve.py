"""test_serve.py — `pi2 serve` on SmolLM2 with the official `openai` client (and raw HTTP for what a client library
cannot send): chat and completions, streamed and not; stop strings; seeded sampling equal to `pi2 run`; usage;
4 concurrent clients; a client that goes away mid-stream; every bad request answered with an OpenAI error object
and the right status while the server keeps serving; a full queue; Ctrl-C exits 130."""
from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from clirun import cli
from conftest import model_file
from servefix import LiveServer

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.model, pytest.mark.slow]
KEY = "sk-pi2-test"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def path():
    return model_file("smollm2-135m")


@pytest.fixture(scope="module")
def server(path):
    s = LiveServer(path, "-c", "1024", "-np", "4", "-t", "2", "--api-key", KEY)
    yield s
    code, err = s.stop()
    assert code == 130 and "Traceback" not in err, err


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def raw(server, method, path, body=None, headers=None):
    """(status, parsed JSON) of a request sent as given (body: bytes, or an object sent as JSON)."""
    c = http.client.HTTPConnection(server.url[7:], timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    c.request(method, path, body=data, headers={"Authorization": f"Bearer {KEY}",
                                                "Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, json.loads(out) if out else None


def test_models_and_health(server, client, path):
    models = client.models.list().data
    assert [m.id for m in models] == [path.name]
    h = server.get("/health")
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == 4


def test_completions_match_pi2_run_for_a_seed(client, path):
    res = cli("run", str(path), "-p", PROMPT, "-n", "12", "-s", "77", "-c", "1024", "--json")
    want = json.loads(res.out.strip().splitlines()[0])
    r = client.completions.create(model="pi2", prompt=PROMPT, max_tokens=12, seed=77)
    assert r.choices[0].text == want["text"] and r.choices[0].finish_reason == "length"
    assert r.object == "text_completion"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want["prompt_tokens"]), 12)
    assert r.usage.total_tokens == len(want["prompt_tokens"]) + 12
    stream = client.completions.create(model="pi2", prompt=PROMPT, max_tokens=12, seed=77, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_streamed_and_not(client):
    msgs = [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a fruit."}]
    r = client.chat.completions.create(model="pi2", messages=msgs, max_tokens=20, temperature=0)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant" and text
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 20
    chunks = list(client.chat.completions.create(model="pi2", messages=msgs, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.total_tokens == r.usage.total_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0      # the same prompt again: cached
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "And a vegetable?"}]
    r2 = client.chat.completions.create(model="pi2", messages=msgs, max_tokens=20, temperature=0,
                                        max_completion_tokens=8)
    assert r2.usage.completion_tokens <= 8 and r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens


def test_stop_sequences(client):
    free = client.completions.create(model="pi2", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    stop = free[4:7]
    r = client.completions.create(model="pi2", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == free[:free.index(stop)]
    s = client.completions.create(model="pi2", prompt=PROMPT, max_tokens=16, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_four_concurrent_clients_get_their_own_outputs(client):
    prompts = ["Once upon a time", "The best way to learn", "In 1969, the first", "My favourite recipe is"]
    alone = [client.completions.create(model="pi2", prompt=p, max_tokens=24, seed=i, extra_body={"ignore_eos": True})
             .choices[0].text for i, p in enumerate(prompts)]
    results, errors = [None] * 4, []

    def one(i):
        try:
            c = openai.OpenAI(base_url=client.base_url, api_key=KEY, max_retries=0, timeout=120)
            s = c.completions.create(model="pi2", prompt=prompts[i], max_tokens=24, seed=i, stream=True,
                                     extra_body={"ignore_eos": True})
            results[i] = "".join(ch.choices[0].text for ch in s if ch.choices)
        except Exception as e:      # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and results == alone
    assert len(set(alone)) == 4


def test_a_client_that_goes_away_frees_its_slot(server, client):
    c = http.client.HTTPConnection(server.url[7:], timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": PROMPT, "max_tokens": 900, "stream": True,
                                                          "ignore_eos": True}),
              headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    assert server.get("/health")["slots_processing"] == 1
    c.sock.close()          # goes away mid-stream
    c.close()
    for _ in range(100):
        if server.get("/health")["slots_processing"] == 0:
            break
        time.sleep(0.1)
    assert server.get("/health")["slots_processing"] == 0      # stopped long before 900 tokens
    assert client.completions.create(model="pi2", prompt=PROMPT, max_tokens=3, temperature=0,
                                    extra_body={"ignore_eos": True}).usage.completion_tokens == 3


BAD = [  # (body or raw bytes, status, code)
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_type"),
    ({"messages": "hello"}, 400, "invalid_type"),
    ({"model": "pi2"}, 400, "missing_required_parameter"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "invalid_type"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "invalid_type"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "invalid_value"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": -0.5}, 400, "invalid_value"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "invalid_value"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, 400, "invalid_type"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "invalid_type"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, 400, "invalid_type"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 3}, 400, "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": 1.5}, 400, "invalid_type"),
    ({"messages": [{"role": "user", "content": "word " * 1100}]}, 400, "context_length_exceeded"),
]


@pytest.mark.parametrize("body,status,code", BAD)
def test_bad_chat_requests(server, body, status, code):
    got, err = raw(server, "POST", "/v1/chat/completions", body)
    assert got == status and err["error"]["code"] == code, err
    assert err["error"]["message"] and err["error"]["type"] == "invalid_request_error"


def test_bad_completion_requests_and_other_errors(server, client):
    assert raw(server, "POST", "/v1/completions", {"prompt": 42})[0] == 400
    assert raw(server, "POST", "/v1/completions", {"prompt": ["a", "b"]})[0] == 400
    assert raw(server, "POST", "/v1/completions", {"prompt": [10 ** 9]})[0] == 400
    st, err = raw(server, "POST", "/v1/completions", {"prompt": PROMPT}, {"Authorization": "Bearer wrong"})
    assert st == 401 and err["error"]["code"] == "invalid_api_key" and err["error"]["type"] == "authentication_error"
    assert raw(server, "GET", "/v1/models", headers={"Authorization": ""})[0] == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="nope", max_retries=0).models.list()
    st, err = raw(server, "GET", "/v1/nothing")
    assert st == 404 and err["error"]["type"] == "not_found_error"
    assert raw(server, "GET", "/v1/chat/completions")[0] == 405
    st, err = raw(server, "POST", "/v1/completions", b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    assert st == 413 and err["error"]["code"] == "request_too_large"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="pi2", messages=[{"role": "user", "content": "x"}], temperature=7)
    assert raw(server, "POST", "/tokenize", {"content": 5})[0] == 400
    assert raw(server, "POST", "/detokenize", {"tokens": ["a"]})[0] == 400
    # the server keeps serving
    assert client.completions.create(model="pi2", prompt=PROMPT, max_tokens=2, temperature=0,
                                    extra_body={"ignore_eos": True}).usage.completion_tokens == 2


def test_tokenize_detokenize(server):
    st, out = raw(server, "POST", "/tokenize", {"content": "Hello world"})
    assert st == 200 and out["tokens"] and all(isinstance(t, int) for t in out["tokens"])
    st, back = raw(server, "POST", "/detokenize", {"tokens": out["tokens"]})
    assert st == 200 and back["content"] == "Hello world"
    st, wp = raw(server, "POST", "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert "".join(p["piece"] for p in wp["tokens"]) == "Hello world"
    assert raw(server, "POST", "/tokenize", {"content": "<|im_start|>"})[1]["tokens"] == [1]


def test_full_queue_is_503_and_ctrl_c_exits_130(path):
    s = LiveServer(path, "-c", "256", "-np", "1", "--queue", "0", "--max-body", "4K")
    try:
        st, err = raw(s, "POST", "/v1/completions", b'{"prompt": "' + b"a" * 5000 + b'"}')
        assert st == 413
        c = http.client.HTTPConnection(s.url[7:], timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": PROMPT, "max_tokens": 200, "stream": True,
                                                              "ignore_eos": True}))
        r = c.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")
        st, err = raw(s, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert st == 503 and err["error"]["code"] == "server_busy"
        c.close()
    finally:
        code, log = s.stop()
    assert code == 130 and "Traceback" not in log and "interrupted" in log, log


def test_serve_usage_errors_are_one_line(path, tmp_path):
    import socket
    import subprocess
    import sys
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "pi2", "serve", str(path), "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith(f"pi2: error: cannot listen on 127.0.0.1:{port}"), r.stderr
    for args, code in ((["-np", "0"], 2), (["--port", "70000"], 2), (["--max-body", "lots"], 2),
                       (["--stream-interval", "-1"], 2)):
        r = subprocess.run([sys.executable, "-m", "pi2", "serve", str(path), *args], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == code and r.stderr.startswith("pi2: error:") and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "pi2", "serve", str(tmp_path / "none.gguf"), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.startswith("pi2: error:") and "Traceback" not in r.stderr, r.stderr


def test_stream_interval_batches_writes_not_chunks(path):
    """--stream-interval: the first piece goes out at once, later ones in writes at most that often, still one
    event a token, the same text as a non-streamed request."""
    s = LiveServer(path, "-c", "256", "-np", "1", "-t", "2", "--stream-interval", "300")
    try:
        body = {"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "temperature": 0}
        st, whole = raw(s, "POST", "/v1/completions", body)
        assert st == 200
        c = http.client.HTTPConnection(s.url[7:], timeout=60)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}))
        r = c.getresponse()
        times, text = [], []
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
                text.append(json.loads(line[6:])["choices"][0]["text"])
        c.close()
        assert "".join(text) == whole["choices"][0]["text"]
        n_text = sum(1 for t in text if t)
        assert n_text >= 30          # one event a token (a few pieces may wait for a whole UTF-8 character)
        gaps = [b - a for a, b in zip(times, times[1:])]
        writes = 1 + sum(g > 0.1 for g in gaps)
        assert writes <= 2 + (times[-1] - t0) / 0.3 and writes < n_text / 3, (writes, n_text)
    finally:
        code, log = s.stop()
    assert code == 130 and "Traceback" not in log, log
