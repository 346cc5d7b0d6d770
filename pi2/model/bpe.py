# bpe.py — BPE vocabularies as llama.cpp's llm_tokenizer_bpe_session: byte-level (tokenizer.ggml.model =
# "gpt2") and SentencePiece-style on raw UTF-8 with spaces as U+2581 ("gemma4").
# Does: pre-tokenize a text fragment, byte-level encode each piece (or not), merge adjacent pairs lowest
#       rank first (ties: leftmost) with a heap, map symbols to ids (unknown symbols fall back to one-byte
#       tokens: the byte-level character, or <0xXX>); byte-level token text -> bytes.
# Does not: special tokens, BOS/EOS (tokenizer.py). Caches ids per pre-tokenized piece.
from __future__ import annotations

import heapq

from pi2.model.pretokenize import CHAR_BYTE, PreTokenizer, byte_encode, split
from pi2.model.utf8 import llama_text

_CACHE_MAX = 1 << 16


class BPE:
    def __init__(self, token_to_id: dict, merges: list, pre: PreTokenizer):
        self.vocab = token_to_id
        self.pre = pre
        self._merges = merges
        self._ranks = None                    # built on first use: "left right" -> rank
        self._cache: dict = {}

    @property
    def ranks(self) -> dict:
        if self._ranks is None:
            # rank = index of the first occurrence (llama.cpp emplace keeps the first)
            n = len(self._merges)
            self._ranks = dict(zip(reversed(self._merges), range(n - 1, -1, -1)))
        return self._ranks

    def rank(self, left: str, right: str):
        key = left + " " + right
        r = self.ranks.get(key)
        # a merge line is split at its first space after position 0; the pair must be that split
        if r is not None and key.find(" ", 1) == len(left):
            return r
        return None

    def encode(self, text: str, out: list) -> None:
        """Append the ids of a raw-text fragment (no special tokens in it) to `out`."""
        cache, pre = self._cache, self.pre
        text = llama_text(text)                 # undecodable bytes as llama.cpp reads them
        if pre.escape_spaces:
            text = text.replace(" ", "\u2581")
        for word in split(text, pre):
            if not word:
                continue
            enc = byte_encode(word) if pre.byte_encode else word
            ids = cache.get(enc)
            if ids is None:
                ids = self._word(enc)
                if len(cache) < _CACHE_MAX:
                    cache[enc] = ids
            out.extend(ids)

    def _word(self, word: str) -> list:
        vocab = self.vocab
        if self.pre.ignore_merges and word in vocab:
            return [vocab[word]]
        if self.pre.newline_tokens and not word.strip("\n") and word in vocab:
            return [vocab[word]]                # gemma4: a run of newlines is never merged apart
        sym = list(word)
        n = len(sym)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            r = self.rank(sym[left], sym[right])
            if r is not None:
                heapq.heappush(heap, (r, left, right, sym[left] + sym[right]))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
                continue                       # outdated pair
            sym[left], sym[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        ids = []
        for s in sym:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            if not self.pre.byte_encode:      # each UTF-8 byte as a <0xXX> token, where there is one
                for b in s.encode("utf-8", "surrogatepass"):
                    tid = vocab.get(f"<0x{b:02X}>")
                    if tid is not None:
                        ids.append(tid)
                continue
            # not a token: llama.cpp looks up each UTF-8 byte as a 1-byte string; only ASCII can match
            for ch in s:
                if ch < "\x80" and ch in vocab:
                    ids.append(vocab[ch])
        return ids


def decode_text(text: str) -> bytes:
    """Byte-level token text -> raw bytes (llama_decode_text, including its [UNK_BYTE_0x..] marker)."""
    out = bytearray()
    for ch in text:
        b = CHAR_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)
