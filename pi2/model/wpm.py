# wpm.py — WordPiece vocabularies (tokenizer.ggml.model = "bert") as llama.cpp's llm_tokenizer_wpm_session:
# BertNormalizer-style preprocessing (NFD accent stripping and lowercasing by default, control characters
# dropped, punctuation, ASCII symbols and CJK ideographs as words of their own, split at whitespace), then
# each word, prefixed with U+2581, taken greedily as the longest tokens from the left; a word that cannot be
# spelled entirely becomes the unknown token.
# Does not: special tokens, [CLS]/[SEP] (tokenizer.py).
from __future__ import annotations

from pi2.errors import ModelFormatError
from pi2.model import ucd
from pi2.model.utf8 import llama_text

_CACHE_MAX = 1 << 16
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))   # llama.cpp's is_chinese_char


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return any(a <= o <= b for a, b in _CJK)


class WordPiece:
    def __init__(self, token_to_id: dict, unk_id, lowercase: bool = True, strip_accents: bool = True):
        self.vocab = token_to_id
        self.unk_id = unk_id
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.max_len = max((len(t) for t in token_to_id), default=1)
        self._cache: dict = {}

    def words(self, text: str) -> list:
        """llm_tokenizer_wpm_session::preprocess: normalized words."""
        words, cur = [], []
        for ch in llama_text(text):
            if self.strip_accents:
                ch = ucd.nfd_first(ch)
            if ch in ucd.WHITESPACE:
                if cur:
                    words.append("".join(cur))
                    cur = []
                continue
            cat = ucd.category(ch)
            if ch in "\x00\ufffd" or cat == "C" or (self.strip_accents and cat == "M"):
                continue
            s = ucd.lower(ch) if self.lowercase else ch
            if cat == "P" or (ch < "\x7f" and cat == "S") or _is_cjk(ch):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(s)
            else:
                cur.append(s)
        if cur:
            words.append("".join(cur))
        return words

    def encode(self, text: str, out: list) -> None:
        """Append the ids of a raw-text fragment (no special tokens in it) to `out`."""
        for word in self.words(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._word("\u2581" + word)
                if len(self._cache) < _CACHE_MAX:
                    self._cache[word] = ids
            out.extend(ids)

    def _word(self, word: str) -> list:
        vocab, n, ids, i = self.vocab, len(word), [], 0
        while i < n:
            for j in range(min(n, i + self.max_len), i, -1):
                tid = vocab.get(word[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                ids = []                    # a piece no token spells: the whole word is unknown
                break
        if ids:
            return ids
        if self.unk_id is None:
            raise ModelFormatError("WordPiece vocabulary has no unknown token for a word it cannot spell")
        return [self.unk_id]
