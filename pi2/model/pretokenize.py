# pretokenize.py — BPE pre-tokenizers: the regex list for each `tokenizer.ggml.pre` name, the split
# that applies a list the way llama.cpp's unicode_regex_split does, and GPT-2 byte-level mapping.
# Does: name -> (regex list, flags); category "collapsing" so \p{L}, \p{N}, \p{P}, \p{M}, \p{S} and
#       \s mean exactly what they mean in llama.cpp (one byte per code point, ASCII-only classes);
#       bytes <-> byte-level unicode.
# Does not: merge (bpe.py) or split on special tokens (tokenizer.py).
from __future__ import annotations

from dataclasses import dataclass

import regex

from pi2.errors import UnsupportedError

# --- regex lists (as llama.cpp src/llama-vocab.cpp spells them; (?i:...) already expanded) -------
_CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_UPPER_LOWER = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+{c}"
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*{c}")
_DS3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"

LISTS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "llama3": [LLAMA3],
    "qwen2": [QWEN2],
    "gpt2": [GPT2],
    "starcoder": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "deepseek-llm": [
        "[\r\n]",
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    ],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    "deepseek3": [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _DS3],
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
}


@dataclass(frozen=True)
class PreTokenizer:
    """What a `tokenizer.ggml.pre` name selects for a gpt2 (byte-level BPE) vocabulary."""
    name: str
    regexes: tuple
    ignore_merges: bool = False
    add_bos: bool = False
    clean_spaces: bool = True
    no_bos: bool = False          # chatglm: BOS id disabled


def _table():
    t = {}

    def add(names, lst, **flags):
        for n in names.split():
            t[n] = (lst, flags)
    add("default", "default")
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", "llama3",
        ignore_merges=True, add_bos=True)
    add("dbrx smaug-bpe", "llama3")
    add("glm4 chatglm-bpe", "llama3", no_bos=True)
    add("deepseek-llm", "deepseek-llm", clean_spaces=False)
    add("deepseek-coder", "deepseek-coder", clean_spaces=False)
    add("deepseek-v3 hunyuan-dense", "deepseek3", clean_spaces=False)
    add("falcon", "falcon")
    add("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert mpt olmo "
        "jais exaone4 jina-v1-en jina-v2-code roberta-bpe", "gpt2")
    add("trillion", "gpt2", clean_spaces=False)
    add("starcoder refact codeshell exaone minerva-7b", "starcoder")
    add("smollm command-r", "starcoder", clean_spaces=False)
    add("qwen2 deepseek-r1-qwen hunyuan grok-2", "qwen2", clean_spaces=False)
    add("stablelm2 megrez", "qwen2")
    add("poro-chat", "poro", clean_spaces=False)
    add("bloom gpt3-finnish", "poro")
    add("viking", "viking", clean_spaces=False)
    add("tekken", "tekken", clean_spaces=False, ignore_merges=True, add_bos=True)
    add("chameleon", "chameleon", clean_spaces=False, add_bos=True)
    add("gpt-4o llama4 minimax-m2", "gpt4o", clean_spaces=False)
    add("superbpe", "superbpe", clean_spaces=False)
    add("bailingmoe bailingmoe2 llada-moe", "bailingmoe", clean_spaces=False)
    add("seed-coder", "seed-coder", clean_spaces=False)
    return t


_PRE = _table()


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """Look up a pre-tokenizer; a missing name means 'default' (as llama.cpp); an unknown one is an error."""
    key = name or "default"
    if key not in _PRE:
        raise UnsupportedError(f"unknown pre-tokenizer type: '{key}'",
                               hint="llama.cpp refuses this vocabulary too; known: " + ", ".join(sorted(_PRE)))
    lst, flags = _PRE[key]
    return PreTokenizer(key, tuple(_compile(r) for r in LISTS[lst]), **flags)


# --- category collapsing (one char per code point, as unicode_regex_split) -------------------------
_CATS = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_ASCII_OF = {"N": "0-9", "L": "A-Za-z", "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}", "M": "", "S": r"\$\+<->^`\|"}
WHITESPACE = frozenset(chr(c) for c in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                                        0x202F, 0x205F, 0x3000))
_CLASSIFY = regex.compile(r"(?P<N>\p{N})|(?P<L>\p{L})|(?P<P>\p{P})|(?P<M>\p{M})|(?P<S>\p{S})")
_collapse_map: dict = {}
_wide_map: dict = {}


def _compile(expr: str):
    """-> (compiled, collapsed?) : \\p{X} rewritten to [marker + ASCII members], as llama.cpp does."""
    collapsed = any(f"\\p{{{c}}}" in expr for c in _CATS)
    if collapsed:
        out, inside, i = [], False, 0
        while i < len(expr):
            ch = expr[i]
            if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
                inside = True
            elif inside and ch == "]" and expr[i - 1] != "\\":
                inside = False
            elif expr.startswith("\\p{", i) and i + 4 < len(expr) and expr[i + 4] == "}" and expr[i + 3] in _CATS:
                c = expr[i + 3]
                body = _CATS[c] + _ASCII_OF[c]
                out.append(body if inside else "[" + body + "]")
                i += 5
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
    m = _CLASSIFY.match(ch)
    return _CATS[m.lastgroup] if m else "\xd0"


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
