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


class Channel:
    """Events (kind, value) from the engine thread to one request's coroutine. The loop is woken only while the
    coroutine waits in get(), once for whatever arrives meanwhile; events that come while it is busy (or pausing
    between writes, pi2 serve's --stream-interval) cost the engine thread a list append. `wake_on`: the kinds that
    wake it (None: every kind; a non-streamed request needs only "done" and "error")."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake_on: Optional[tuple] = None):
        self._loop, self._wake_on = loop, wake_on
        self._items: collections.deque = collections.deque()
        self._ready = asyncio.Event()
        self._lock = threading.Lock()
        self._waiting = False       # the coroutine waits in get()
        self._armed = False         # a wake-up is scheduled on the loop and has not run yet

    def put(self, kind: str, value) -> None:
        """From any thread."""
        self._items.append((kind, value))
        if self._wake_on is not None and kind not in self._wake_on:
            return
        with self._lock:
            if self._armed or not self._waiting:
                return
            self._armed = True
        self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._armed = False
        self._ready.set()

    async def get(self) -> list:
        """Every event that arrived since the last get() (at least one; waits for it)."""
        while not self._items:
            self._ready.clear()
            with self._lock:
                self._waiting = True
            try:
                if not self._items:
                    await self._ready.wait()
            finally:
                with self._lock:
                    self._waiting = False
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
