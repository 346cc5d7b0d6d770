# spm.py — SentencePiece vocabularies (tokenizer.ggml.model = "llama") as llama.cpp's
# llm_tokenizer_spm_session: merge adjacent symbols whose concatenation is a token, highest score
# first (ties: leftmost), then emit ids, falling back to <0xXX> byte tokens.
# Text holding undecodable bytes is cut into llama.cpp's byte-run symbols and merged on its raw bytes.
# Does not: the ' ' -> '▁' escaping and the leading space (tokenizer.py decides per fragment).
from __future__ import annotations

import heapq

from pi2.errors import ModelFormatError
from pi2.model.utf8 import has_raw, raw_bytes, utf8_len

_CACHE_MAX = 4096


class SPM:
    def __init__(self, token_to_id: dict, scores):
        self.vocab = token_to_id
        self._raw_scores = scores             # numpy float32 array (or None: all 0.0)
        self._scores = None
        self._cache: dict = {}

    @property
    def scores(self) -> list:
        if self._scores is None:
            raw = self._raw_scores
            self._scores = [0.0] * len(self.vocab) if raw is None else raw.tolist()
        return self._scores

    def encode(self, text: str, out: list) -> None:
        """Append the ids of an already escaped fragment to `out`."""
        ids = self._cache.get(text)
        if ids is None:
            if has_raw(text):                  # undecodable bytes: llama.cpp's symbols are byte runs
                ids = self._encode(raw_bytes(text), _byte_runs(raw_bytes(text)), self._lookup_bytes)
            else:
                ids = self._encode(text, [1] * len(text), self.vocab.get)
            if len(self._cache) < _CACHE_MAX:
                self._cache[text] = ids
        out.extend(ids)

    def _lookup_bytes(self, b: bytes):
        try:
            return self.vocab.get(b.decode("utf-8"))
        except UnicodeDecodeError:
            return None

    def _encode(self, text, length: list, lookup) -> list:
        """llm_tokenizer_spm_session::tokenize over `text` (str, or bytes) cut into symbols of `length`."""
        n = len(length)
        start = [0] * n
        for i in range(1, n):
            start[i] = start[i - 1] + length[i - 1]
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list = []
        scores = self.scores

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            size = length[left] + length[right]
            tid = lookup(text[start[left]:start[left] + size])
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, size))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not length[left] or not length[right] or length[left] + length[right] != size:
                continue                       # one side already merged elsewhere
            length[left], length[right] = size, 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])

        ids, i = [], 0
        while n and i != -1:
            piece = text[start[i]:start[i] + length[i]]
            tid = lookup(piece)
            if tid is not None:
                ids.append(tid)
            else:
                raw = piece if isinstance(piece, bytes) else piece.encode("utf-8", "surrogatepass")
                ids.extend(self.byte_token(b) for b in raw)
            i = nxt[i]
        return ids

    def byte_token(self, b: int) -> int:
        """<0xXX>, else the one-byte string itself; llama.cpp throws when neither exists."""
        tid = self.vocab.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.vocab.get(chr(b))
        if tid is None:
            raise ModelFormatError(f"vocabulary has no byte token <0x{b:02X}> for a character of the input",
                                   hint="this SentencePiece vocabulary lacks byte fallback; llama.cpp fails here too")
        return tid


def _byte_runs(raw: bytes) -> list:
    """llama.cpp's initial SentencePiece symbols: as many bytes as each lead byte announces (clipped)."""
    out, i = [], 0
    while i < len(raw):
        n = min(utf8_len(raw[i]), len(raw) - i)
        out.append(n)
        i += n
    return out
