"""sampling_dry.py — llama.cpp's DRY ("don't repeat yourself") sampler: a penalty multiplier * base^(n - allowed)
on each token that would extend a repeat of n >= allowed tokens of the last `last_n`, sequence breakers limiting how
far back a repeat may reach (src/llama-sampler.cpp, llama_sampler_dry_*).

Owns: the breakers as token sequences (each token whose text contains a breaker string, or ends with its start and
is followed by the tokens of the rest), the history window, and the penalty on the candidates' float32 logits.
"""
from __future__ import annotations

from collections import deque

import numpy as np

_MAX_CHAR_LEN, _MAX_SEQ_LEN = 40, 20
_FLOAT_MAX_LOG = np.float32(88.7228391)


def breaker_sequences(tokenizer, breakers) -> dict:
    """{head token: [tail token lists]}: get_overlapping_token_sequences over every token of the vocabulary."""
    out: dict = {}
    if tokenizer is None:
        return out
    pieces = [tokenizer.token_to_piece(t, special=True) for t in range(tokenizer.n_vocab)]
    for text in breakers:
        s = text.encode("utf-8", "surrogateescape")[:_MAX_CHAR_LEN]
        if not s:
            continue
        for tid, word in enumerate(pieces):
            if s in word:
                tails = out.setdefault(tid, [])
                if [] not in tails:
                    tails.append([])
                continue
            pos = word.find(s[:1])
            while pos >= 0:
                i = 1
                while i < len(s) and pos + i < len(word) and word[pos + i] == s[i]:
                    i += 1
                if i == len(s) or pos + i >= len(word):     # the word ends inside the breaker: its rest follows
                    rest = s[i:].decode("utf-8", "surrogateescape")
                    tail = tokenizer.encode(rest, add_special=False, parse_special=False)[:_MAX_SEQ_LEN] if rest else []
                    tails = out.setdefault(tid, [])
                    if tail not in tails:
                        tails.append(tail)
                pos = word.find(s[:1], pos + 1)
    return out


class Dry:
    """One DRY stage: accept() every token the context sees, apply() to the candidates' logits."""

    def __init__(self, multiplier: float, base: float, allowed_length: int, last_n: int, breakers: dict):
        self.multiplier, self.base = np.float32(multiplier), np.float32(base)
        self.allowed, self.last_n = int(allowed_length), max(int(last_n), 0)
        self.breakers = breakers
        self.last: deque = deque(maxlen=self.last_n or None)

    def reset(self) -> None:
        self.last.clear()

    def accept(self, token: int) -> None:
        self.last.append(int(token))

    def apply(self, ids: np.ndarray, logits: np.ndarray) -> None:
        n = min(len(self.last), self.last_n)
        if n <= self.allowed:
            return
        rat = list(self.last)[::-1]          # rat[i]: the i-th most recent token
        rep_limit = n
        for i in range(n):                   # step 1: the nearest restart sequence bounds a repeat's length
            longest = -1
            for tail in self.breakers.get(rat[i], ()):
                L = len(tail)
                if longest < L <= i and all(tail[o] == rat[i - o - 1] for o in range(L)):
                    longest = L
            if longest >= 0:
                rep_limit = i - longest
                break
        if rep_limit < self.allowed:
            return
        count = [0] * n                      # step 2: reverse Z-algorithm, repeat lengths of suffixes
        last, lt, rt = n - 1, 0, 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and rat[m] == rat[m + k]:
                    m += 1
                count[last - k] = min(m, rep_limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p, right = k - lt, rt - k + 1
                if count[last - p] < right:
                    count[last - k] = min(count[last - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat[i] == rat[i - k]:
                        i += 1
                    count[last - k] = min(i - k, rep_limit)
                    lt, rt = k, i - 1
        best: dict = {}                      # step 3: the longest repeat each next token would extend
        for i in range(n - 1):
            r = count[i]
            if r >= self.allowed:
                tok = rat[n - 2 - i]
                if best.get(tok, -1) < r:
                    best[tok] = r
        if not best:
            return
        max_exp = int(_FLOAT_MAX_LOG / np.float32(np.log(self.base))) if self.base > np.float32(1.000001) else 0
        pos = {int(t): j for j, t in enumerate(ids)} if len(best) < len(ids) else None
        for tok, r in best.items():          # step 4: the penalty, unless the token is a one-token breaker
            j = pos.get(tok) if pos is not None else (int(np.flatnonzero(ids == tok)[0]) if tok in ids else None)
            if j is None or [] in self.breakers.get(tok, ()):
                continue
            e = r - self.allowed
            if max_exp > 0 and e > max_exp:
                e = max_exp
            logits[j] = logits[j] - np.float32(np.float64(self.multiplier) * np.power(np.float64(self.base), e))
