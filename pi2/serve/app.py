"""app.py — pi2 serve's HTTP endpoints (Starlette): OpenAI's /v1/chat/completions, /v1/completions and /v1/models,
and llama-server's /health, /tokenize and /detokenize.

Owns: the API key, the body size limit, streaming as server-sent events, noticing a client that went away
(its request is cancelled and its slot freed), and turning every failure into an OpenAI-style error object with
its status (400 bad request, 401 key, 404 path, 405 method, 413 body, 503 busy, 500 otherwise): a request fails,
the server keeps serving. Does not: schedule or generate (pi2/serve/slots.py).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from pi2.errors import ContextFullError, Pi2Error, UsageError
from pi2.serve.channel import Channel, TextFrames
from pi2.serve.schema import ApiError, GenRequest, bad, chunk_body, completion_body, finish_reason, new_id, \
    parse_gen, usage
from pi2.serve.slots import Job, QueueFull, Slots

_STATUS_TYPES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def api_error(e: BaseException, param: Optional[str] = None) -> ApiError:
    """The OpenAI-style error a failure is answered with: a prompt the context cannot hold 400
    context_length_exceeded, other usage errors 400, a full queue 503, any other failure 500."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ContextFullError):
        return bad(str(e), param, "context_length_exceeded")
    if isinstance(e, UsageError):
        return bad(str(e), param)
    if isinstance(e, QueueFull):
        return ApiError(503, str(e), "server_error", "server_busy")
    if isinstance(e, Pi2Error):
        return ApiError(500, str(e), "server_error")
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error")


def _sse(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)) + "\n\n"


class Server:
    """The endpoints over one model's slots. api_key: required as `Authorization: Bearer KEY` (None: open);
    max_body: the largest request body in bytes; stream_interval: seconds a stream waits after a write before
    the next, so that pieces decoded meanwhile go out together (the first piece at once; 0: each as it comes)."""

    def __init__(self, slots: Slots, api_key: Optional[str] = None, max_body: int = 8 << 20,
                 stream_interval: float = 0.0):
        self.slots, self.model = slots, slots.model
        self.api_key, self.max_body = api_key, max_body
        self.stream_interval = stream_interval
        self.created = int(time.time())
        routes = [Route("/health", self.health, methods=["GET"]), Route("/v1/health", self.health, methods=["GET"]),
                  Route("/v1/models", self.models, methods=["GET"]), Route("/models", self.models, methods=["GET"]),
                  Route("/v1/chat/completions", self.chat, methods=["POST"]),
                  Route("/chat/completions", self.chat, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/completions", self.completions, methods=["POST"]),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"])]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                                Exception: self._internal_error})

    # -- plumbing -----------------------------------------------------------------------------------------

    async def _http_error(self, request: Request, exc: HTTPException) -> JSONResponse:
        type_, code = _STATUS_TYPES.get(exc.status_code, ("invalid_request_error", None))
        msg = f"no endpoint {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return error_response(ApiError(exc.status_code, msg, type_, code))

    async def _internal_error(self, request: Request, exc: Exception) -> JSONResponse:
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))

    def _auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not given.startswith("Bearer ") or given[7:].strip() != self.api_key:
            raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           "authentication_error", "invalid_api_key")

    async def _json(self, request: Request):
        """The request's JSON body, read within max_body."""
        n = request.headers.get("content-length")
        if n is not None and n.isdigit() and int(n) > self.max_body:
            raise ApiError(413, f"the request body is {n} bytes; the limit is {self.max_body}",
                           "invalid_request_error", "request_too_large")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > self.max_body:
                raise ApiError(413, f"the request body exceeds {self.max_body} bytes", "invalid_request_error",
                               "request_too_large")
        try:
            return json.loads(bytes(buf).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad(f"the request body is not valid JSON: {e}", None, "invalid_json") from None

    def _guard(handler):    # noqa: N805 — a decorator of the methods below
        async def run(self, request: Request):
            try:
                self._auth(request)
                return await handler(self, request)
            except ContextFullError as e:
                return error_response(api_error(e, "messages" if handler.__name__ == "chat" else "prompt"))
            except (ApiError, Pi2Error) as e:
                return error_response(api_error(e))
        return run

    # -- endpoints ----------------------------------------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", **self.slots.status()})

    @_guard
    async def models(self, request: Request) -> JSONResponse:
        m = self.model
        return JSONResponse({"object": "list", "data": [{
            "id": m.name, "object": "model", "created": self.created, "owned_by": "pi2",
            "meta": {"n_ctx": m.n_ctx, "n_vocab": m.n_vocab, "n_params": None, "path": m.path,
                     "slots": len(self.slots.slots)}}]})

    @_guard
    async def tokenize(self, request: Request) -> JSONResponse:
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            raise bad("'content' must be a string", "content", "invalid_type")
        add_special, with_pieces = body.get("add_special", False), body.get("with_pieces", False)
        parse_special = body.get("parse_special", True)
        if not all(isinstance(v, bool) for v in (add_special, with_pieces, parse_special)):
            raise bad("'add_special', 'parse_special' and 'with_pieces' must be booleans", None, "invalid_type")
        ids = await run_in_threadpool(self.model.tokenize, body["content"], add_special, parse_special)
        if not with_pieces:
            return JSONResponse({"tokens": ids})
        tok = self.model.tokenizer
        pieces = []
        for i in ids:
            raw = tok.token_to_piece(i, special=True)
            try:
                pieces.append({"id": i, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:
                pieces.append({"id": i, "piece": list(raw)})
        return JSONResponse({"tokens": pieces})

    @_guard
    async def detokenize(self, request: Request) -> JSONResponse:
        body = await self._json(request)
        toks = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise bad("'tokens' must be an array of integers", "tokens", "invalid_type")
        return JSONResponse({"content": self.model.detokenize(toks)})

    @_guard
    async def chat(self, request: Request):
        return await self._generate(request, chat=True)

    @_guard
    async def completions(self, request: Request):
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool):
        req = parse_gen(await self._json(request), chat, self.model.sampling)
        tokens = await run_in_threadpool(self._prompt_tokens, req)
        limit = self.model.n_ctx - 4
        if len(tokens) > limit and not self.model.run.ctx_shift:   # shifting: the slot's sequence decides
            raise ApiError(400, f"the prompt is {len(tokens)} tokens; the context holds {limit} (-c {self.model.n_ctx})",
                           "invalid_request_error", "context_length_exceeded", "messages" if chat else "prompt")
        q = Channel(asyncio.get_running_loop(), final_only=not req.stream)
        job = Job(tokens, req.max_tokens, req.sampling, q.put, stop=req.stop, ignore_eos=req.ignore_eos)
        self.slots.submit(job)
        rid, name = new_id(chat), self.model.name
        if req.stream:      # as llama-server: a failure before the first piece is a plain error response
            first = await self._first(request, job, q)
            if first is None:
                return JSONResponse({}, status_code=499)
            return StreamingResponse(self._events(req, job, q, rid, name, first), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._collect(request, req, job, q, rid, name)

    def _prompt_tokens(self, req: GenRequest) -> list:
        m = self.model
        if req.chat:
            return m.chat_tokens(req.messages)
        if isinstance(req.prompt, str):
            if not req.prompt:
                raise bad("'prompt' is empty", "prompt")
            return m.tokenize(req.prompt)
        if any(not 0 <= t < m.n_vocab for t in req.prompt):
            raise bad(f"token ids must be in [0, {m.n_vocab})", "prompt")
        return list(req.prompt)

    async def _wait(self, request: Request, job: Job, q: Channel) -> Optional[list]:
        """The job's next events (None: the client went away meanwhile, and the job is cancelled)."""
        try:
            while True:
                try:
                    return await asyncio.wait_for(q.get(), 0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        self.slots.cancel(job)
                        return None
        except asyncio.CancelledError:
            self.slots.cancel(job)
            raise

    async def _first(self, request: Request, job: Job, q: Channel) -> Optional[list]:
        """A stream's first events, once its slot has started it (None: the client went away). A failure before
        any piece (a prompt the context cannot hold even after a shift, an engine error in the prompt) is raised:
        the request gets an error response with its status, not a stream (llama-server and OpenAI do so)."""
        events = await self._wait(request, job, q)
        if events and events[0][0] == "error":
            raise events[0][1]
        return events

    async def _collect(self, request: Request, req: GenRequest, job: Job, q: Channel, rid: str, name: str):
        """A non-streamed answer; a client that goes away meanwhile cancels the job."""
        while True:
            events = await self._wait(request, job, q)
            if events is None:
                return JSONResponse({}, status_code=499)
            for kind, v in events:
                if kind == "done":
                    return JSONResponse(completion_body(req, rid, name, v))
                if kind == "error":
                    raise v

    async def _events(self, req: GenRequest, job: Job, q: Channel, rid: str, name: str, events: list):
        """Server-sent events, from `events` (the first ones, already taken) on: a chunk per piece of text, the
        finish reason ("length" also when the context filled up without --context-shift, as llama-server says),
        usage (stream_options), [DONE]. A failure after the first piece (an engine error) is an error object event
        that ends the stream without [DONE], as llama-server sends it. The pieces that arrived since the last write
        (while the loop was busy, or within stream_interval) go out in one write."""
        finished, first, pause = False, True, 0.0
        text = TextFrames(chunk_body(req, rid, name, TextFrames.mark()))
        try:
            while True:
                out = []
                if events is None:
                    events = await q.get(pause)
                for kind, v in events:
                    if kind == "piece":
                        if first and req.chat:
                            out.append(_sse(chunk_body(req, rid, name, v.text, first=True)))
                            first = False
                        elif v.text:
                            out.append(text.frame(v.text))
                            first = False
                    elif kind == "done":
                        finished = True
                        out.append(_sse(chunk_body(req, rid, name, "", finish_reason(v), first=first and req.chat)))
                        if req.include_usage:
                            out.append(_sse(chunk_body(req, rid, name, None, use=usage(v))))
                        out.append(_sse("[DONE]"))
                        yield "".join(out)
                        return
                    else:
                        finished = True
                        out.append(_sse(api_error(v, "messages" if req.chat else "prompt").body()))
                        yield "".join(out)
                        return
                events = None
                if out:
                    yield "".join(out)
                    pause = self.stream_interval     # the next pieces gather meanwhile: one write, one wake-up
        finally:
            if not finished:        # the client went away (or the server is stopping): free the slot
                self.slots.cancel(job)
