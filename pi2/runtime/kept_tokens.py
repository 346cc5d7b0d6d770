"""kept_tokens.py — which tokens a context's KV cache holds when context shifts have dropped some, so that a prompt
cache (pi2.api's sequences, pi2 serve's slots) can go on from a shifted cache as llama-server's slots do.

A shift (--context-shift, csrc/forward.c: llama-completion's rule) keeps the first n_keep positions and drops the
oldest half of the rest; any number of them leave the cache holding history[:n_keep] + history[n_keep + dropped:],
where history is every token decoded since the cache was last emptied. KeptTokens wraps a context (the generation
loop decodes through it) and counts what each decode dropped: a decode that shifted returns with n_past lower than
before + n. Does not: decide when to shift (the engines do) or sample.
"""
from __future__ import annotations

from typing import List, Sequence

MARGIN = 4      # positions a prompt leaves free (pi2.api.Sequence.stream, generate.check_prompt)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class KeptTokens:
    """The context `ctx` (its decode, n_past, n_ctx, ...) with the history of what it holds: `history` (tokens
    decoded since the cache was emptied, in order, the dropped ones included) and `dropped` (how many a shift
    removed, from position n_keep on)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.n_keep = int(getattr(ctx, "n_keep", 0))
        self.shifts = bool(getattr(ctx, "ctx_shift", False))
        self.history: List[int] = []
        self.dropped = 0

    def __getattr__(self, name: str):
        return getattr(self.ctx, name)

    @property
    def held(self) -> List[int]:
        """The tokens in the cache, in position order."""
        if not self.dropped:
            return list(self.history)
        return self.history[:self.n_keep] + self.history[self.n_keep + self.dropped:]

    def reusable(self, prompt: Sequence[int]) -> int:
        """How many of prompt's first tokens the cache can go on from (one token at least is left to evaluate): their
        shared prefix with history, unless it ends among the dropped tokens (then only the kept ones before them)."""
        d = min(common_prefix(self.history, prompt), len(prompt) - 1)
        if self.dropped and d < self.n_keep + self.dropped:
            d = min(d, self.n_keep)
        return max(d, 0)

    def positions(self, d: int) -> int:
        """Cache positions holding prompt[:d] (d from reusable())."""
        return d - self.dropped if self.dropped and d >= self.n_keep + self.dropped else d

    def fits(self, d: int, n: int) -> bool:
        """Whether n tokens after prompt[:d] fit with MARGIN positions free, after the shift the engine makes first
        when it would fill the context."""
        p, n_ctx = self.positions(d), self.ctx.n_ctx
        if p + n <= n_ctx - MARGIN:
            return True
        return self.shifts and p - max(0, (p - self.n_keep) // 2) + n <= n_ctx - MARGIN

    def keep(self, d: int) -> None:
        """Keep prompt[:d] (d from reusable()) in the cache, forget what follows it."""
        p = self.positions(d)
        self.ctx.truncate(p)
        if p == d:
            self.dropped = 0
        self.history = self.history[:d]

    def reset(self) -> None:
        self.ctx.reset()
        self.history, self.dropped = [], 0

    def decode(self, tokens, all_logits: bool = False):
        before = self.ctx.n_past
        out = self.ctx.decode(tokens, all_logits)
        self.dropped += before + len(tokens) - self.ctx.n_past
        self.history.extend(int(t) for t in tokens)
        return out

    def synced(self, tokens: Sequence[int]) -> None:
        """After a generation: `tokens` (prompt + generated) of which the cache holds what n_past says. Without a
        shift that is their first n_past (a step decoded outside decode(), pi2.engine.decode_multi, included); after
        one, the history decode() kept."""
        if not self.dropped:
            self.history = [int(t) for t in tokens[:self.ctx.n_past]]
