"""slots.py — pi2 serve's slots: `--parallel N` sequences of one model (each its own context and prompt cache), a
queue of requests beyond them, and the one engine thread that advances every busy slot a token at a time.

Owns: which slot a request gets (the idle one whose cache shares the longest prefix with its prompt, as
llama-server does), the queue's bound, cancellation (a request whose client went away is closed at its next
token and its slot freed), handing each piece to the request's callback, and decoding the busy slots' next
tokens in one batched step (pi2.engine.decode_multi: one pass over the weights for all) where the engine can. Does not: speak HTTP
(pi2/serve/app.py) or generate (pi2.api.Sequence.stream).
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from pi2.api import Model, Sequence, Stream
from pi2.engine import decode_multi
from pi2.errors import Pi2Error
from pi2.runtime.config import SamplerParams


class QueueFull(Pi2Error):
    """Every slot is busy and the queue is full."""


@dataclass(eq=False)
class Job:
    """One request: its prompt and how to generate, and `emit(kind, value)` called from the engine thread with
    ("piece", Piece), then ("done", Completion) or ("error", exception)."""
    tokens: List[int]
    max_tokens: int
    sampling: SamplerParams
    emit: Callable
    stop: List[str] = field(default_factory=list)
    ignore_eos: bool = False
    cancelled: bool = False
    slot: Optional[int] = None


class Slot:
    def __init__(self, index: int, seq: Sequence):
        self.index, self.seq = index, seq
        self.job: Optional[Job] = None
        self.stream: Optional[Stream] = None
        self.used = 0           # when it last took a job (Slots._uses)


class Slots:
    """The slots of one model and the engine thread that runs them (start() / stop())."""

    def __init__(self, model: Model, n_parallel: int = 1, max_queue: int = 64, batched: bool = True):
        self.model = model
        self.batched = batched      # decode the slots' tokens in one step (pi2_decode_multi) where the engine can
        self.slots = [Slot(i, model.sequence()) for i in range(n_parallel)]
        self.max_queue = max_queue
        self._uses = 0
        self.pending: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="pi2-serve-engine", daemon=True)

    def start(self) -> "Slots":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        with self._cond:
            idle = sum(s.job is None for s in self.slots)
            if len(self.pending) >= self.max_queue + idle:
                raise QueueFull(f"the server is busy: {len(self.slots)} slots busy and {len(self.pending)} "
                                f"requests queued")
            self.pending.append(job)
            self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job from the queue, or stop it at its next token."""
        with self._cond:
            job.cancelled = True
            if job in self.pending:
                self.pending.remove(job)
            self._cond.notify_all()

    def status(self) -> dict:
        with self._cond:
            busy = sum(s.job is not None for s in self.slots)
            return {"slots_idle": len(self.slots) - busy, "slots_processing": busy, "queued": len(self.pending)}

    # -- the engine thread --------------------------------------------------------------------------------

    def _assign(self) -> None:
        """Queued jobs to idle slots, first come first served; each to the idle slot sharing its longest prefix
        (the least recently used one on ties)."""
        while self.pending:
            idle = [s for s in self.slots if s.job is None]
            if not idle:
                return
            job = self.pending.popleft()
            best = max(idle, key=lambda s: (s.seq.common_prefix(job.tokens), -s.used))
            self._uses += 1
            best.job, job.slot, best.used = job, best.index, self._uses

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self.pending and all(s.job is None for s in self.slots):
                    self._cond.wait()
                if self._stopping:
                    for s in self.slots:
                        if s.stream is not None:
                            s.stream.close()
                    return
                self._assign()
                busy = [s for s in self.slots if s.job is not None]
            batch = [s for s in busy if self._batchable(s)] if self.batched and len(busy) > 1 else []
            done = self._decode_batch(batch) if len(batch) > 1 else {}
            for s in busy:
                self._step(s, done.get(s.index))

    def _batchable(self, s: Slot) -> bool:
        """A slot whose next step decodes one token it has sampled (not a prompt), on a dense C context."""
        st = s.stream
        return (st is not None and st.pending_token is not None and not s.job.cancelled and s.seq.batchable
                and s.seq.session.n_past + 1 < s.seq.n_ctx)

    def _decode_batch(self, batch: list) -> dict:
        """Their pending tokens decoded in one step: {slot index: (logits, ms)}; {} when the engine refuses (each
        slot then decodes alone)."""
        t0 = time.perf_counter()
        try:
            logits = decode_multi([s.seq.session.ctx for s in batch], [s.stream.pending_token for s in batch])
        except Pi2Error:
            self.batched = False     # e.g. a model whose FFN the batched step does not compute: stop trying
            return {}
        ms = (time.perf_counter() - t0) * 1e3 / len(batch)
        return {s.index: (row, ms) for s, row in zip(batch, logits)}

    def _free(self, s: Slot) -> None:
        with self._cond:
            s.job, s.stream = None, None

    def _step(self, s: Slot, decoded=None) -> None:
        """One token of the slot's job (the prompt and the first token when it starts); decoded: its pending
        token's (logits, ms) from a batched step."""
        job = s.job
        try:
            if job.cancelled:
                if s.stream is not None:
                    s.stream.close()
                self._free(s)
                return
            if s.stream is None:
                s.stream = s.seq.stream(job.tokens, max_tokens=job.max_tokens, sampling=job.sampling,
                                        stop=job.stop, ignore_eos=job.ignore_eos)
            piece = s.stream.advance(decoded)
            job.emit("piece", piece)
            if s.stream.completion is not None:
                job.emit("done", s.stream.completion)
                self._free(s)
        except Exception as e:     # noqa: BLE001 — the request fails, the server keeps serving
            if s.stream is not None and s.stream.completion is None:
                try:
                    s.stream.close()
                except Exception:   # noqa: BLE001
                    pass
            job.emit("error", e)
            self._free(s)
