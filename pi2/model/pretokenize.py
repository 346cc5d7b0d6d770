# pretokenize.py — BPE pre-tokenizers: the regex list for each `tokenizer.ggml.pre` name, the split
# that applies a list the way llama.cpp's unicode_regex_split does, and GPT-2 byte-level mapping.
# Does: name -> (regex list, flags); category "collapsing" so \p{L}, \p{N}, \p{P}, \p{M}, \p{S} and
#       \s mean exactly what they mean in llama.cpp (one byte per code point, ASCII-only classes);
#       bytes <-> byte-level unicode.
# Does not: merge (bpe.py) or split on special tokens (tokenizer.py).
# Non-ASCII characters in the lists are written as \u escapes: an editor that normalizes the file (NFC)
# would otherwise silently change llama.cpp's ranges (U+1F7D becomes U+03CE and "Ὗ-ώ" runs backwards).
from __future__ import annotations

from dataclasses import dataclass

import regex

from pi2.errors import UnsupportedError
from pi2.model import ucd

# --- regex lists (as llama.cpp src/llama-vocab.cpp spells them; (?i:...) already expanded) -------
_CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTR + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_UPPER_LOWER = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+{c}"
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*{c}")
_DS3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PORO = r" ?[^(\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+"
_DS_CJK = r"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"
_DS_LETTERS = (
    r"\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
    r"\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
    r"\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA"
    r"\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45"
    r"\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
    r"\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102"
    r"\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
    r"\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
    r"\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06"
    r"\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
    r"\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
    r"\U0001E900-\U0001E943]+")
NEWLINES = r"[^\n]+|[\n]+"
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTR + "?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTR + "?")
_CJK_KANA = r"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+"
DIGIT_GROUPS = "digit-groups"     # llama.cpp's custom split: number runs in threes from the right (afmoe)

LISTS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "llama3": [LLAMA3],
    "qwen2": [QWEN2],
    "qwen35": [QWEN35],
    "gpt2": [GPT2],
    "starcoder": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "deepseek-llm": ["[\r\n]", _DS_LETTERS, r"\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
                     r"\s+$", _DS_CJK, r"\p{N}+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DS_CJK, r"\p{N}"],
    "deepseek3": [r"\p{N}{1,3}", _CJK_KANA, _DS3],
    "poro": [_PORO],
    "viking": [_PORO, r"\p{N}"],
    "tekken": [_UPPER_LOWER.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "gpt4o": [_UPPER_LOWER.replace("{c}", _CONTR + "?")
              + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "chameleon": [r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                  r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2],
    "superbpe": [r"\p{N}+", r"(?=(\d{3})+(?!\d))"],
    "bailingmoe": [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"],
    "seed-coder": [_CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "newlines": [NEWLINES],
    "laguna": [NEWLINES, QWEN2],
    "ufakzeka": [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "minicpm5": [r"\p{N}{1,3}", LLAMA3.replace(r"|\p{N}{1,3}|", r"|\p{N}+|")],
    "mellum2": [r"\p{N}", GPT2],
    "jais2": [LLAMA3.replace(r"|\s+(?!\S)|\s+", "")
              + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s{1}"],
    "exaone-moe": [_CONTR + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
                   r"|\s*[\r\n]|\s+(?!\S)|\s+"],
    "granite-97m": [_UPPER_LOWER.replace("{c}", _CONTR + "?").replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
                    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "tiny-aya": [DIGIT_GROUPS, _CASED + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "afmoe": [DIGIT_GROUPS, r"[\u4E00-\u9FFF\u3400-\u4DBF\u8C48-\uFAFF\u3040-\u309F\u30A0-\u30FF\uFF65-\uFF9F"
              r"\u2F00-\u2FDF\u0E40-\u0E7F\u0E80-\u0EFF\u1780-\u17FF\u1000-\u109F\uAA60-\uAA7F\uA9E0-\uA9FF"
              r"\uAC00-\uD7AF\u1100-\u11FF]+", _DS3],
    "spark2_5": [r"\p{N}{1,3}", _CJK_KANA, r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
                 r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"],
    "youtu": [r"[\uAC00-\uD7A3\u3131-\u318E]+|[\uFF01\u2026\u201C\u201D\u2018\u2019\u2014\uFF1A\uFF1B\uFF0C"
              r"\u3001-\u303F\uFE30-\uFE4F]+|[\u3105-\u312F]+|" + _CJK_KANA,
              _CASED + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
}


@dataclass(frozen=True)
class PreTokenizer:
    """What a `tokenizer.ggml.pre` name selects for a BPE vocabulary."""
    name: str
    regexes: tuple
    ignore_merges: bool = False
    add_bos: bool = False
    clean_spaces: bool = True
    no_bos: bool = False          # chatglm: BOS id disabled
    byte_encode: bool = True      # GPT-2 byte-level symbols; False: raw UTF-8 with <0xXX> byte fallback
    escape_spaces: bool = False   # ' ' -> U+2581 before splitting (SentencePiece-style BPE)
    newline_tokens: bool = False  # gemma4: a run of newlines that is a token is taken whole
    force_bos: bool = False       # gemma4: add_bos is true whatever the file says


def _table():
    t = {}

    def add(names, lst, **flags):
        for n in names.split():
            t[n] = (lst, flags)
    add("default", "default")
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", "llama3",
        ignore_merges=True, add_bos=True)
    add("dbrx smaug-bpe", "llama3")
    add("chatglm-bpe", "llama3", no_bos=True)
    add("glm4 glm5", "llama3", no_bos=True, ignore_merges=True)
    add("deepseek-llm", "deepseek-llm", clean_spaces=False)
    add("deepseek-coder", "deepseek-coder", clean_spaces=False)
    add("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", "deepseek3", clean_spaces=False)
    add("falcon", "falcon")
    add("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert mpt olmo "
        "jais exaone4 jina-v1-en jina-v2-code roberta-bpe", "gpt2")
    add("trillion granite-docling", "gpt2", clean_spaces=False)
    add("starcoder refact codeshell exaone minerva-7b", "starcoder")
    add("smollm command-r", "starcoder", clean_spaces=False)
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan grok-2 solar-open", "qwen2", clean_spaces=False)
    add("qwen35", "qwen35", clean_spaces=False)
    add("stablelm2 megrez", "qwen2")
    add("poro-chat", "poro", clean_spaces=False)
    add("bloom gpt3-finnish", "poro")
    add("viking", "viking", clean_spaces=False)
    add("tekken", "tekken", clean_spaces=False, ignore_merges=True, add_bos=True)
    add("chameleon", "chameleon", clean_spaces=False, add_bos=True)
    add("gpt-4o llama4 kanana2 talkie minimax-m2", "gpt4o", clean_spaces=False)
    add("superbpe", "superbpe", clean_spaces=False)
    add("bailingmoe bailingmoe2 llada-moe", "bailingmoe", clean_spaces=False)
    add("seed-coder", "seed-coder", clean_spaces=False)
    add("gemma4 granite-embed-multi-311m", "newlines", byte_encode=False, escape_spaces=True,
        newline_tokens=True, force_bos=True)
    add("sarvam-moe", "newlines", byte_encode=False, escape_spaces=True, clean_spaces=False)
    add("minicpm5", "minicpm5", ignore_merges=True)
    add("youtu", "youtu", clean_spaces=False, ignore_merges=True)
    add("granite-embed-multi-97m", "granite-97m", clean_spaces=False, ignore_merges=True)
    add("jais-2", "jais2")
    add("exaone-moe", "exaone-moe")
    add("mellum2", "mellum2")
    add("laguna", "laguna", clean_spaces=False)
    add("ufakzeka", "ufakzeka", clean_spaces=False)
    add("tiny_aya cohere2moe", "tiny-aya", clean_spaces=False)
    add("afmoe", "afmoe", clean_spaces=False)
    add("spark2_5", "spark2_5", clean_spaces=False)
    return t


_PRE = _table()
# names llama.cpp knows whose splitting pi2 does not reproduce
REFUSED = {"kimi-k2": "llama.cpp cuts its text with custom code (Han runs, cased words) that pi2 does not have",
           "whitespace": "it belongs to the 'whitespace' tokenizer model, which pi2 does not support"}


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """Look up a pre-tokenizer; a missing name means 'default' (as llama.cpp); an unknown one is an error."""
    key = name or "default"
    if key in REFUSED:
        raise UnsupportedError(f"pre-tokenizer '{key}' is not supported: {REFUSED[key]}")
    if key not in _PRE:
        raise UnsupportedError(f"unknown pre-tokenizer type: '{key}'",
                               hint="llama.cpp refuses this vocabulary too; known: " + ", ".join(sorted(_PRE)))
    lst, flags = _PRE[key]
    compiled = []
    for expr in LISTS[lst]:
        if expr == DIGIT_GROUPS:
            compiled.append((None, True))
            continue
        try:
            compiled.append(_compile(expr))
        except regex.error as e:
            raise UnsupportedError(f"pre-tokenizer '{key}': cannot translate its regex {expr!r} ({e})") from None
    return PreTokenizer(key, tuple(compiled), **flags)


# --- category collapsing (one char per code point, as unicode_regex_split) -------------------------
_CATS = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_ASCII_OF = {"N": "0-9", "L": "A-Za-z", "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}", "M": "", "S": r"\$\+<->^`\|\~"}
# \p{...} names llama.cpp collapses (the letter subclasses all become "letter")
_PROPS = {"\\p{N}": "N", "\\p{L}": "L", "\\p{P}": "P", "\\p{M}": "M", "\\p{S}": "S", "\\p{Lu}": "L",
          "\\p{Ll}": "L", "\\p{Lt}": "L", "\\p{Lm}": "L", "\\p{Lo}": "L"}
WHITESPACE = frozenset(ch for ch in ucd.WHITESPACE if ch >= "\x80")
_collapse_map: dict = {}
_wide_map: dict = {}


def _compile(expr: str):
    """-> (compiled, collapsed?) : \\p{X} rewritten to [marker + ASCII members], as llama.cpp does."""
    collapsed = any(p in expr for p in _PROPS)
    if collapsed:
        if not expr.isascii() or regex.search(r"\\[uU][0-9a-fA-F]{4}", expr):
            raise regex.error("a regex with both unicode categories and non-ASCII characters")
        out, inside, i = [], False, 0
        while i < len(expr):
            ch = expr[i]
            if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
                inside = True
            elif inside and ch == "]" and expr[i - 1] != "\\":
                inside = False
            elif expr.startswith("\\p{", i) and i + 3 < len(expr):
                close = expr.find("}", i + 3)
                c = _PROPS.get(expr[i:close + 1]) if 0 <= close <= i + 10 else None
                if c is not None:
                    body = _CATS[c] + _ASCII_OF[c]
                    out.append(body if inside else "[" + body + "]")
                    i = close + 1
                    continue
            out.append(ch)
            i += 1
        expr = "".join(out)
    if expr.endswith("$") and not expr.endswith("\\$"):
        expr = expr[:-1] + r"\Z"        # ECMAScript '$' never matches before a final newline
    return regex.compile(expr, regex.ASCII | regex.VERSION0), collapsed


def _collapse_char(ch: str) -> str:
    if ch in WHITESPACE:
        return "\x0b"
    return _CATS.get(ucd.category(ch), "\xd0")


def _views(text: str):
    """(collapsed, wide): the text as the category regexes and the plain regexes see it."""
    if text.isascii():
        return text, text
    for ch in set(text):
        o = ord(ch)
        if o >= 128 and o not in _collapse_map:
            _collapse_map[o] = _collapse_char(ch)
            _wide_map[o] = "\x0b" if ch in WHITESPACE else ch
    return text.translate(_collapse_map), text.translate(_wide_map)


def split(text: str, pre: PreTokenizer) -> list[str]:
    """Apply the regex list: each regex splits every piece left by the previous one; matches and the
    text between them become pieces (zero-length matches give empty pieces, as llama.cpp)."""
    collapsed, wide = _views(text)
    offsets = [len(text)]
    for rx, use_collapsed in pre.regexes:
        if rx is None:
            offsets = _digit_groups(collapsed, offsets)
            continue
        src = collapsed if use_collapsed else wide
        new, start = [], 0
        for off in offsets:
            chunk, pos = src[start:start + off], 0
            for m in rx.finditer(chunk):
                s, e = m.span()
                if s > pos:
                    new.append(s - pos)
                new.append(e - s)
                pos = e
            if pos < off:
                new.append(off - pos)
            start += off
        offsets = new
    words, start = [], 0
    for off in offsets:
        words.append(text[start:start + off])
        start += off
    return words


_DIGITS = frozenset("0123456789\xd1")


def _digit_groups(collapsed: str, offsets: list) -> list:
    """llama.cpp's unicode_regex_split_custom_afmoe: a run of numbers is cut in threes from the right; the
    text before a run goes with its first group (later regexes split it off)."""
    new, start = [], 0
    for off in offsets:
        end, prev, pos = start + off, start, start
        while pos < end:
            if collapsed[pos] not in _DIGITS:
                pos += 1
                continue
            cur = pos
            while pos < end and collapsed[pos] in _DIGITS:
                pos += 1
            cut = cur + (pos - cur) % 3
            if cut == cur:
                cut += 3
            while cut <= pos:
                new.append(cut - prev)
                prev, cut = cut, cut + 3
        if prev < end:
            new.append(end - prev)
        start = end
    return new


# --- GPT-2 byte-level mapping -----------------------------------------------------------------------
def _byte_chars() -> list[str]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_CHARS = _byte_chars()
_ENCODE = {b: c for b, c in enumerate(BYTE_CHARS)}          # latin-1 code point -> byte-level char
CHAR_BYTE = {c: b for b, c in enumerate(BYTE_CHARS)}         # byte-level char -> byte


def byte_encode(word: str) -> str:
    """UTF-8 bytes of `word`, each mapped to its byte-level unicode character."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_ENCODE)
