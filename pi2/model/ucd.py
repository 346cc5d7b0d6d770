# ucd.py — code point properties exactly as llama.cpp's unicode tables give them (unicode-data.cpp of
# llama.cpp 0c1e570 is generated from UnicodeData 15.1; unicodedata2 15.1.0 ships the same database, so a
# character added later is "undefined" here as there, whatever Python's own unicodedata knows).
# Does: general-category class (llama.cpp's flag: N L P M S C Z, U = undefined), its White_Space set,
#       NFD's first code point, simple lowercase mapping.
# Does not: regexes (pretokenize.py) or word splitting (wpm.py).
from __future__ import annotations

from functools import lru_cache

import unicodedata2

UNICODE_VERSION = unicodedata2.unidata_version

# llama.cpp's whitespace set (unicode-data.cpp: PropList's White_Space)
WHITESPACE = frozenset(chr(c) for c in (*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                        0x2028, 0x2029, 0x202F, 0x205F, 0x3000))


@lru_cache(maxsize=1 << 16)
def category(ch: str) -> str:
    """One letter per llama.cpp flag: N L P M S C (Cc Cf Co Cs) Z (separators), U (unassigned)."""
    c = unicodedata2.category(ch)
    return "U" if c == "Cn" else c[0]


@lru_cache(maxsize=1 << 16)
def nfd_first(ch: str) -> str:
    """llama.cpp's NFD: each code point becomes the first code point of its canonical decomposition."""
    if "\ud800" <= ch <= "\udfff":
        return ch
    return unicodedata2.normalize("NFD", ch)[0]


@lru_cache(maxsize=1 << 16)
def lower(ch: str) -> str:
    """Simple (one code point) lowercase mapping of UnicodeData, as unicode_tolower."""
    if ch == "\u0130":                 # the one character whose full lowercase mapping is longer
        return "i"
    low = ch.lower()
    if len(low) != 1 or unicodedata2.category(ch) == "Cn":
        return ch
    return low
