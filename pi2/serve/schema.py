"""schema.py — OpenAI's request and response bodies for pi2 serve, checked by hand (no pydantic: it needs a Rust
toolchain to install on Termux).

Owns: what a request may hold (types and ranges of the fields pi2 uses; unknown fields are ignored as OpenAI's
clients send extras; features pi2 lacks are refused), OpenAI-style error bodies, and the completion, chunk and
usage objects. Sampling fields are SamplerParams' (temperature, top_p, seed, and llama-server's top_k, min_p,
repeat_penalty, ...): a field SamplerParams gains is accepted by name.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import List, Optional

from pi2.api import SAMPLER_ALIASES, Completion, check_messages, sampler_params
from pi2.errors import UsageError
from pi2.runtime.config import SamplerParams

_SAMPLE_FIELDS = {f.name for f in dataclasses.fields(SamplerParams)}
ROLES = ("system", "developer", "user", "assistant", "tool")
# (low, high) of the fields OpenAI bounds; others get SamplerParams' own checks
_RANGES = {"temperature": (0.0, 2.0), "temp": (0.0, 2.0), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
           "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0), "top_k": (0, None),
           "repeat_last_n": (-1, None), "repeat_penalty": (0.0, None)}
_UNSUPPORTED = ("tools", "functions", "logit_bias", "suffix", "audio", "prediction")


class ApiError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: Optional[str] = None,
                 param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


@dataclass
class GenRequest:
    """A checked /v1/chat/completions or /v1/completions request."""
    chat: bool
    messages: list = field(default_factory=list)
    prompt: object = None                   # str or a list of token ids (completions)
    max_tokens: int = -1
    stop: List[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    sampling: SamplerParams = field(default_factory=SamplerParams)
    ignore_eos: bool = False
    model: str = ""


def _num(body: dict, key: str, kind=float):
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) if kind is int else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        raise bad(f"'{key}' must be {'an integer' if kind is int else 'a number'}, not {type(v).__name__}", key,
                  "invalid_type")
    lo, hi = _RANGES.get(key, (None, None))
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise bad(f"'{key}' is {v}: it must be {rng}", key)
    return v


def _bool(body: dict, key: str) -> bool:
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be a boolean", key, "invalid_type")
    return v


def parse_gen(body, chat: bool, defaults: SamplerParams) -> GenRequest:
    """A request body (parsed JSON) as a GenRequest, or ApiError 400 naming the field at fault."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    req = GenRequest(chat=chat)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", "model", "invalid_type")
    req.model = model or ""
    for key in _UNSUPPORTED:
        if body.get(key):
            raise bad(f"'{key}' is not supported by pi2 serve", key, "unsupported_parameter")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise bad("logprobs are not supported by pi2 serve", "logprobs", "unsupported_parameter")
    n = _num(body, "n", int)
    if n is not None and n != 1:
        raise bad(f"'n' is {n}: pi2 serve makes one choice per request", "n", "unsupported_parameter")
    if body.get("echo"):
        raise bad("'echo' is not supported by pi2 serve", "echo", "unsupported_parameter")
    if chat:
        msgs = body.get("messages")
        if msgs is None:
            raise bad("'messages' is required", "messages", "missing_required_parameter")
        if not isinstance(msgs, list) or not msgs:
            raise bad("'messages' must be a non-empty array", "messages", "invalid_type")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
            if m.get("role") not in ROLES:
                raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        try:
            req.messages = check_messages(msgs)
        except UsageError as e:
            raise bad(str(e), "messages", "invalid_type") from None
        for m in req.messages:       # OpenAI's newer name of the system role
            if m["role"] == "developer":
                m["role"] = "system"
    else:
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            req.prompt = p
        elif isinstance(p, str):
            req.prompt = p
        elif p is None:
            raise bad("'prompt' is required", "prompt", "missing_required_parameter")
        else:
            raise bad("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt",
                      "invalid_type")
    mt = body.get("max_completion_tokens", body.get("max_tokens", body.get("n_predict")))
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if mt is not None:
        if isinstance(mt, bool) or not isinstance(mt, int):
            raise bad(f"'{key}' must be an integer", key, "invalid_type")
        if mt < 1 and not (mt == -1 and "n_predict" in body):
            raise bad(f"'{key}' is {mt}: it must be at least 1", key)
        req.max_tokens = mt
    stop = body.get("stop")
    if isinstance(stop, str):
        req.stop = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > 16:
            raise bad("'stop' holds at most 16 strings", "stop")
        req.stop = stop
    elif stop is not None:
        raise bad("'stop' must be a string or an array of strings", "stop", "invalid_type")
    req.stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("'stream_options' must be an object", "stream_options", "invalid_type")
        req.include_usage = _bool(so, "include_usage")
    req.ignore_eos = _bool(body, "ignore_eos")
    samp = {}
    for key in body:
        name = SAMPLER_ALIASES.get(key, key)
        if name in _SAMPLE_FIELDS and body[key] is not None:
            default = getattr(defaults, name)
            samp[key] = body[key] if isinstance(default, bool) else _num(body, key, int if isinstance(default, int)
                                                                           else float)
    try:
        req.sampling = sampler_params(defaults, **samp)
    except UsageError as e:
        raise bad(str(e), None, "invalid_type") from None
    return req


# -- responses -----------------------------------------------------------------------------------------------

def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(c: Completion) -> str:
    return "stop" if c.finish_reason == "stop" else "length"


def usage(c: Completion) -> dict:
    return {**c.usage, "prompt_tokens_details": {"cached_tokens": c.n_cached}}


def completion_body(req: GenRequest, rid: str, model: str, c: Completion) -> dict:
    created = int(time.time())
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                  "finish_reason": finish_reason(c)}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": c.text, "logprobs": None, "finish_reason": finish_reason(c)}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": "pi2",
            "choices": [choice], "usage": usage(c), "timings": c.timings}


def chunk_body(req: GenRequest, rid: str, model: str, text: Optional[str], reason: Optional[str] = None,
               first: bool = False, use: Optional[dict] = None) -> dict:
    """A streamed chunk: text (None: no choice, only usage), the finish reason on the last one."""
    if req.chat:
        delta = ({"role": "assistant", "content": text or ""} if first else
                 {} if reason and not text else {"content": text})
        choices = [] if text is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        obj = "chat.completion.chunk"
    else:
        choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "system_fingerprint": "pi2",
           "choices": choices}
    if use is not None:
        out["usage"] = use
    return out
