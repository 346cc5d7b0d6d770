"""channel.py — hands a request's events from the engine thread to the event loop, and renders its streamed text as
server-sent events cheaply.

Owns: Channel (put() from any thread; the loop is woken only while the request waits for events, at most once:
whatever arrived meanwhile is taken in one get()), and TextFrames (a request's text chunk rendered to JSON once;
each piece then costs one string escape). Does not: decide what a chunk says (pi2/serve/schema.py) or speak HTTP
(pi2/serve/app.py).
"""
from __future__ import annotations

import asyncio
import collections
import json
import threading
from typing import Optional

_MARK = "\u0001pi2-text\u0001"


FINAL = ("done", "error")      # the kinds that end a request's events


def _settle(fut: asyncio.Future) -> None:
    """End a wait (a wake-up or its timer, whichever comes first)."""
    if not fut.done():
        fut.set_result(None)


class Channel:
    """Events (kind, value) from the engine thread to one request's coroutine. The loop is woken only while the
    coroutine waits in get(), once for whatever arrives meanwhile; events that come while it is busy or pausing
    between writes (pi2 serve's --stream-interval) cost the engine thread a list append. final_only: only the end
    (FINAL) wakes it (a non-streamed request)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, final_only: bool = False):
        self._loop, self._final_only = loop, final_only
        self._items: collections.deque = collections.deque()
        self._fut: Optional[asyncio.Future] = None     # what the waiting coroutine awaits
        self._lock = threading.Lock()
        self._waiting: Optional[str] = None     # "all" / "final": what the coroutine waits for (None: it does not)
        self._armed = False         # a wake-up is scheduled on the loop and has not run yet

    def put(self, kind: str, value) -> None:
        """From any thread."""
        self._items.append((kind, value))
        with self._lock:
            if self._armed or self._waiting is None or (self._waiting == "final" and kind not in FINAL):
                return
            self._armed = True
        self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._armed = False
            fut = self._fut
        if fut is not None:
            _settle(fut)

    def _has(self, final: bool) -> bool:
        return bool(self._items) and (not final or self._items[-1][0] in FINAL)

    async def _wait(self, final: bool, timeout: Optional[float]) -> None:
        """Until an event it waits for arrives, or timeout seconds pass. A bare future and one timer: asyncio.wait_for
        made a task, a timer and an Event's waiter each time, the event loop's largest cost a write (pause's)."""
        fut = self._loop.create_future()
        with self._lock:
            self._waiting, self._fut = "final" if final else "all", fut
        timer = None
        try:
            if not self._has(final):
                if timeout is not None:
                    timer = self._loop.call_later(timeout, _settle, fut)
                await fut
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._waiting, self._fut = None, None

    async def get(self, pause: float = 0.0) -> list:
        """Every event that arrived since the last get(), at least one. pause: first let events gather for up to
        this many seconds (the request's end cuts it short)."""
        if pause > 0:
            await self._wait(True, pause)
        while not self._has(self._final_only):
            await self._wait(self._final_only, None)
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out


class TextFrames:
    """The server-sent event of a text chunk, its JSON rendered once: frame(text) is that event with `text`."""

    def __init__(self, body: dict):
        head, mark, tail = ("data: " + json.dumps(body, ensure_ascii=False) + "\n\n").rpartition(json.dumps(_MARK))
        if not mark:
            raise ValueError("the chunk body does not hold the text mark")
        self._head, self._tail = head, tail

    @staticmethod
    def mark() -> str:
        """The text to build the body with."""
        return _MARK

    def frame(self, text: str) -> str:
        return self._head + json.dumps(text, ensure_ascii=False) + self._tail
