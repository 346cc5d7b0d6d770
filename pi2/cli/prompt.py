"""prompt.py — the prompt as the user gave it: -p text with llama.cpp's escape processing, or -f read byte for byte
(bytes that are not UTF-8 are kept as surrogates and written back as the same bytes)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pi2.errors import FileError, UsageError


def read_prompt(prompt: Optional[str], file: Optional[Path], escape: bool) -> Optional[str]:
    """The text of -p (escapes processed unless --no-escape) or -f; None when neither was given."""
    if prompt is not None and file is not None:
        raise UsageError("give the prompt once (-p or -f)")
    if file is not None:
        try:
            return file.read_bytes().decode("utf-8", "surrogateescape")
        except OSError as e:
            raise FileError(f"cannot read prompt file {file}: {e.strerror}") from None
    if prompt is not None:
        return process_escapes(prompt) if escape else prompt
    return None


def _strtol2(two: bytes):
    """strtol(two, &end, 16) on a 2-char buffer, as llama.cpp calls it for \\xHH: the value if it consumed
    both chars (two hex digits, or one hex digit after a space or a sign), else None."""
    hexd = b"0123456789abcdefABCDEF"
    if len(two) == 2 and two[0] in hexd and two[1] in hexd:
        return int(two, 16)
    if len(two) == 2 and two[0] in b" \t\n\v\f\r+-" and two[1] in hexd:
        v = int(two[1:], 16)
        return -v if two[0] == ord("-") else v
    return None


def process_escapes(s: str) -> str:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xHH (a raw byte); other escapes
    and a trailing backslash stay as written. Works on the UTF-8 bytes; non-UTF-8 results are surrogates."""
    b = s.encode("utf-8", "surrogateescape")
    out = bytearray()
    i, n = 0, len(b)
    simple = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
    while i < n:
        c = b[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = b[i]
            v = _strtol2(b[i + 1:i + 3]) if e == ord("x") and i + 2 < n else None
            if e in simple:
                out += simple[e]
            elif v is not None:
                out.append(v & 0xFF)
                i += 2
            else:
                out += b"\\" + bytes([e])
        else:
            out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")
