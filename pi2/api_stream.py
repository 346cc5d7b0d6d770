"""api_stream.py — what a generation of the Python API (pi2/api.py) hands back: a Stream of Pieces, iterated or run
to the end, and the Completion it leaves, with the stop strings held back and cut (OpenAI's `stop`).
Owns: the pieces' text as the client sees it (held while it may begin a stop string), finish_reason, usage counts, and
handing the sequence back (its prompt cache synced, its busy lock released) when the stream ends, fails or is closed.
Does not: tokenize, decode or sample (pi2/runtime/generate.py's generate_steps, which the stream drives), or start a
generation (pi2.api.Sequence.stream).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence as Seq

from pi2.runtime.generate import Generation

if TYPE_CHECKING:
    from pi2.api import Sequence


@dataclass(frozen=True)
class Piece:
    """One generated token and the text it completes. text is "" while a UTF-8 character or a possible stop
    string is still pending (it comes out with a later piece); the last piece of a stream may have token None
    (text held back until the end)."""
    text: str
    token: Optional[int]


@dataclass
class Completion:
    """A finished generation. finish_reason: "stop" (an end-of-generation token or a stop string), "length"
    (max_tokens) or "context" (the context is full). n_cached: prompt tokens the prompt cache reused. stop_reason:
    the generation loop's own word, as `pi2 run --json` prints it ("eog", "length", "context", "reverse"; "" when a
    stop string or close() ended it)."""
    text: str
    tokens: List[int]
    prompt_tokens: List[int]
    finish_reason: str
    n_cached: int = 0
    seed: int = 0
    timings: dict = field(default_factory=dict)
    stop_reason: str = ""

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_tokens), "completion_tokens": len(self.tokens),
                "total_tokens": len(self.prompt_tokens) + len(self.tokens)}


class StopFilter:
    """Holds back text that may begin a stop string; cuts the text at the first stop string."""

    def __init__(self, stops: Seq[str]):
        self.stops = [s for s in stops if s]
        self.buf, self.hit = "", False

    def push(self, text: str) -> str:
        self.buf += text
        if not self.stops:
            out, self.buf = self.buf, ""
            return out
        found = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if found:
            out, self.buf, self.hit = self.buf[:min(found)], "", True
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), hold, -1):
                if s.startswith(self.buf[-k:]):
                    hold = k
                    break
        out = self.buf[:len(self.buf) - hold]
        self.buf = self.buf[len(out):]
        return out


class Stream:
    """An iterator of Pieces; `completion` is set once it is exhausted. close() stops it early (the sequence keeps
    what it evaluated so far for its prompt cache)."""

    def __init__(self, seq: "Sequence", steps, gen, sampler, timings, stop: StopFilter, n_cached: int):
        self._seq, self._steps, self._gen, self._sampler = seq, steps, gen, sampler
        self._timings, self._stop, self._n_cached = timings, stop, n_cached
        self.completion: Optional[Completion] = None
        self.text = ""
        self._pending: Optional[int] = None

    def __iter__(self) -> Iterator[Piece]:
        return self

    def __next__(self) -> Piece:
        return self.advance()

    @property
    def generation(self) -> Generation:
        """The generation loop's record: tokens, text, stop_reason and the end-of-generation token that stopped it
        (sampled, not evaluated: pi2 run -cnv feeds it before the next turn)."""
        return self._gen

    @property
    def pending_token(self) -> Optional[int]:
        """The token last yielded, which the next step decodes (None before the first and after the last)."""
        return self._pending

    def advance(self, decoded=None) -> Piece:
        """The next piece; decoded = (logits, ms) when the caller decoded pending_token itself (batched)."""
        if self.completion is not None:
            raise StopIteration
        self._pending = None
        try:
            token, piece = next(self._steps) if decoded is None else self._steps.send(decoded)
        except StopIteration:
            return self._finish(self._stop.buf if not self._stop.hit else "", None)
        except BaseException:
            self._end("error")
            raise
        out = self._stop.push(piece)
        if self._stop.hit:
            self._steps.close()
            return self._finish(out, token, "stop")
        if token is None:    # the decoder's rest: the generation ended
            return self._finish(out + self._stop.buf, None)
        self.text += out
        self._pending = token
        return Piece(out, token)

    def _finish(self, text: str, token, reason: str = "") -> Piece:
        self.text += text
        if not reason:
            reason = {"eog": "stop", "length": "length", "context": "context"}.get(self._gen.stop_reason, "stop")
        self._end(reason)
        return Piece(text, token)

    def close(self) -> None:
        """Stop generating (a client went away): completion's finish_reason is then "cancelled"."""
        if self.completion is None:
            self._steps.close()
            self._end("cancelled")

    def _end(self, reason: str) -> None:
        g = self._gen
        self.completion = Completion(self.text, list(g.tokens), list(g.prompt_tokens), reason, self._n_cached,
                                     self._sampler.seed, self._timings.as_dict(), g.stop_reason)
        self._seq._sync(g)
        self._seq._busy.release()

    def result(self) -> Completion:
        """Run to the end and return the Completion."""
        for _ in self:
            pass
        return self.completion
