# utf8.py — text that is not valid UTF-8, read the way llama.cpp reads it. pi2 holds such text as Python
# str with each undecodable byte as a lone surrogate U+DC80..U+DCFF ("surrogateescape", as the CLI gets
# it from argv and files); llama.cpp sees the raw bytes.
# Does: the raw bytes back; llama.cpp's lenient decoder (unicode_cpts_from_utf8: overlong forms and
#       encoded surrogates accepted, each byte it cannot start a character with becomes U+FFFD); the
#       lead-byte length SentencePiece symbols start with.
# Does not: tokenize (bpe.py, spm.py use these when a text holds undecodable bytes).
from __future__ import annotations

import re

from pi2.errors import UsageError

_RAW = re.compile("[\udc80-\udcff]")
_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)      # unicode_len_utf8, by the lead byte's high nibble


def has_raw(text: str) -> bool:
    """Whether `text` holds undecodable bytes."""
    return _RAW.search(text) is not None


def raw_bytes(text: str) -> bytes:
    """The bytes llama.cpp would be given: undecodable bytes as they were, other surrogates as UTF-8."""
    return b"".join(ch.encode("utf-8", "surrogateescape" if "\udc80" <= ch <= "\udcff" else "surrogatepass")
                    for ch in text) if has_raw(text) else text.encode("utf-8", "surrogatepass")


def utf8_len(lead: int) -> int:
    return _LEN[lead >> 4]


def llama_text(text: str) -> str:
    """`text` as the code points llama.cpp's unicode_cpts_from_utf8 reads from its bytes."""
    if not has_raw(text):
        return text
    b, out, i, n = raw_bytes(text), [], 0, 0
    n = len(b)
    while i < n:
        c = b[i]
        need = 1 if c < 0x80 else 0 if c < 0xC0 else 2 if c < 0xE0 else 3 if c < 0xF0 else 4 if c < 0xF8 else 0
        if need == 0 or i + need > n or any(b[i + k] & 0xC0 != 0x80 for k in range(1, need)):
            out.append(0xFFFD)
            i += 1
            continue
        cp = c if need == 1 else c & (0xFF >> (need + 1))
        for k in range(1, need):
            cp = cp << 6 | b[i + k] & 0x3F
        if cp > 0x10FFFF:
            raise UsageError(f"the text holds a byte sequence that decodes above U+10FFFF at byte {i}; "
                             "llama.cpp aborts on it too")
        out.append(cp)
        i += need
    return "".join(map(chr, out))
