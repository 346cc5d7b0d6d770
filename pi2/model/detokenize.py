# detokenize.py — token ids back to bytes, as llama_token_to_piece and llama_detokenize.
# Does: one token's piece by its attribute and the vocabulary's escaping (byte-level BPE, U+2581 for
#       SentencePiece, WordPiece and SentencePiece-style BPE, <0xXX> byte tokens), the
#       clean_up_tokenization_spaces passes, streaming UTF-8-safe decoding.
# Does not: choose what to print (tokenizer.py keeps the special/remove flags).
from __future__ import annotations

from pi2.model.bpe import decode_text
from pi2.model.specials import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED


def piece(text: str, attr: int, escaped: bool) -> bytes:
    """The bytes a token prints (special tokens included); `escaped`: spaces are stored as U+2581."""
    if attr & (UNKNOWN | CONTROL | USER_DEFINED):
        return text.encode("utf-8", "surrogatepass")
    if attr & NORMAL:
        return text.replace("\u2581", " ").encode("utf-8") if escaped else decode_text(text)
    if attr & BYTE:
        return bytes([hex_prefix(text[3:5])])
    return b""


def hex_prefix(s: str) -> int:
    """strtol(s, 16) on a two-character string: the leading hex digits, 0 if none."""
    v = 0
    for ch in s:
        if ch not in "0123456789abcdefABCDEF":
            break
        v = v * 16 + int(ch, 16)
    return v & 0xFF


def clean_spaces(t: bytearray) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces passes, done in place exactly as the C loop does."""
    n = len(t)
    total = 1 if n else 0
    for i in range(1, n):                       # " ?", " !", " .", " ,"
        x = t[i]
        if t[i - 1] == 32 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    n, total, i = total, (1 if total else 0), 1
    while i < n:                                # " ' " -> "'"
        x = t[i]
        if x == 39 and i + 1 < n and t[i - 1] == 32 and t[i + 1] == 32:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    n, total = total, (1 if total else 0)
    for i in range(1, n):                       # " 's", " 'm", " 're", " 've"
        x = t[i]
        if t[i - 1] == 32 and x == 39 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, t[i + 2]) in ((114, 101), (118, 101)):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


class StreamDecoder:
    """Token-by-token detokenization that never emits a broken UTF-8 sequence."""

    def __init__(self, tok, special: bool = True):
        self.tok, self.special, self._buf = tok, special, b""

    def push(self, id: int) -> str:
        buf = self._buf + self.tok.token_to_piece(id, self.special)
        cut = _complete_prefix(buf)
        self._buf = buf[cut:]
        return buf[:cut].decode("utf-8", "replace")

    def flush(self) -> str:
        buf, self._buf = self._buf, b""
        return buf.decode("utf-8", "replace")


def _complete_prefix(buf: bytes) -> int:
    """Length of `buf` without a trailing, still incomplete UTF-8 sequence."""
    n = len(buf)
    for k in range(1, min(4, n) + 1):
        b = buf[n - k]
        if b < 0x80:
            return n
        if b >= 0xC0:
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 1
            return n - k if need > k else n
    return n
