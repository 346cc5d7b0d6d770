# tokenizer.py — the public tokenizer: GGUF vocabulary -> ids and back, as llama.cpp's llama_vocab.
# Does: load tokens/types/special ids from GGUF metadata (the same defaults, overrides and
#       text-based detection of EOT/EOG/FIM tokens), split out special tokens, dispatch fragments to
#       BPE (bpe.py) or SPM (spm.py), token_to_piece / detokenize, streaming UTF-8-safe decoding.
# Does not: regexes (pretokenize.py), merging (bpe.py, spm.py), chat templates (chat.py).
from __future__ import annotations

import numpy as np

from pi2.errors import ModelFormatError, UnsupportedError, UsageError
from pi2.model.bpe import BPE, decode_text
from pi2.model.pretokenize import pre_tokenizer
from pi2.model.spm import SPM
from pi2.model.vocab_order import map_order

# llama_token_attr bits
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32
LSTRIP, RSTRIP = 128, 256
_TYPE_ATTR = np.array([UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE], dtype=np.int32)

_K = "tokenizer.ggml."
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
                        "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>"))
_ID_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
            ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
            ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
            ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
            ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
            ("fim_mid", "middle_token_id"))
_SPACES = " \t\n\v\f\r"


class Tokenizer:
    """A GGUF vocabulary that tokenizes exactly like llama.cpp (SPM and byte-level BPE)."""

    def __init__(self, kv: dict):
        model = kv.get(_K + "model")
        if model is None:
            raise ModelFormatError("GGUF has no tokenizer.ggml.model key: no vocabulary to tokenize with")
        tokens = kv.get(_K + "tokens")
        if model not in ("llama", "gpt2"):
            raise UnsupportedError(f"tokenizer '{model}' is not supported", hint="pi2 supports llama (SPM) and gpt2 (BPE)")
        if not isinstance(tokens, list) or not tokens:
            raise ModelFormatError("GGUF has no tokenizer.ggml.tokens array")
        n = len(tokens)
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens, self.n_vocab, self.kind = tokens, n, ("spm" if model == "llama" else "bpe")
        self.token_to_id = dict(zip(tokens, range(n)))
        if len(self.token_to_id) != n:
            seen = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise ModelFormatError(f"duplicate token in vocabulary: '{t}' has ids {seen[t]} and {i}")
                seen[t] = i
        attrs = self._attrs(kv, n)
        ids = {k: None for k, _ in _ID_KEYS}
        self.pre, self._eot_candidates = None, None
        if self.kind == "spm":
            ids.update(bos=1, eos=2, unk=0)
            self.add_space_prefix, self.clean_spaces, self.add_bos, self.add_eos = True, False, True, False
            scores = kv.get(_K + "scores")
            if scores is not None and len(scores) < n:
                raise ModelFormatError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
            self.model = SPM(self.token_to_id, scores)
        else:
            merges = kv.get(_K + "merges")
            if not isinstance(merges, list):
                raise ModelFormatError("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")
            self.pre = pre_tokenizer(kv.get(_K + "pre"))
            ids.update(bos=None if self.pre.no_bos else 11, eos=11)
            self.add_space_prefix, self.clean_spaces = False, self.pre.clean_spaces
            self.add_bos, self.add_eos = self.pre.add_bos, False
            self.model = BPE(self.token_to_id, merges, self.pre)
        if kv.get(_K + "add_space_prefix") is not None:
            self.add_space_prefix = bool(kv[_K + "add_space_prefix"])
        for k, _ in _ID_KEYS:                  # defaults outside the vocabulary are disabled
            if ids[k] is not None and ids[k] >= n:
                ids[k] = None
        for k, key in _ID_KEYS:
            v = kv.get(_K + key)
            if v is not None and 0 <= int(v) < n:
                ids[k] = int(v)
        for flag in ("add_bos", "add_eos"):
            if kv.get(_K + flag + "_token") is not None:
                setattr(self, flag, bool(kv[_K + flag + "_token"]))
        if self.add_bos and ids["bos"] is None:
            raise ModelFormatError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
        if self.add_eos and ids["eos"] is None:
            raise ModelFormatError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")
        eog = self._detect_specials(ids, attrs)
        self.ids = ids
        self.bos_id, self.eos_id, self.eom_id = ids["bos"], ids["eos"], ids["eom"]
        self.eog_ids = frozenset(eog)
        self._name_attrs(kv, attrs)
        self.attrs = attrs.tolist()
        self._pieces: dict = {}
        self._build_special_index()

    @classmethod
    def from_kv(cls, kv: dict) -> "Tokenizer":
        return cls(kv)

    # --- loading ----------------------------------------------------------------------------------
    @staticmethod
    def _attrs(kv, n):
        types = kv.get(_K + "token_type")
        if types is None:
            return np.full(n, NORMAL, dtype=np.int32)
        types = np.asarray(types, dtype=np.int64)
        if len(types) < n:
            raise ModelFormatError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        types = types[:n]
        ok = (types >= 0) & (types < len(_TYPE_ATTR))
        return np.where(ok, _TYPE_ATTR[np.where(ok, types, 0)], UNDEFINED).astype(np.int32)

    def _detect_specials(self, ids: dict, attrs) -> set:
        """Text-based detection of EOT/EOM/FIM ids, 'unused' control tokens and the EOG set."""
        t2i = self.token_to_id
        present = lambda texts: [t2i[t] for t in texts if t in t2i]   # noqa: E731
        groups = [("eot", _EOT_TEXTS), ("eom", ("<|eom_id|>",))] + list(_FIM_TEXTS.items())
        for name, texts in groups:
            if ids[name] is None:
                found = present(texts)
                if len(found) > 1 and name == "eot" and all(self.tokens[i] in _EOG_TEXTS for i in found):
                    self._eot_candidates = found      # resolved on first use: the choice changes nothing else
                elif found:
                    # llama.cpp takes the first hit while iterating its unordered_map
                    ids[name] = found[0] if len(found) == 1 else map_order(self.tokens, found)[0]
                    attrs[ids[name]] |= CONTROL
        for i in np.nonzero(attrs & CONTROL)[0].tolist():
            if "unused" in self.tokens[i]:
                attrs[i] |= UNUSED
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for i in present(_EOG_TEXTS):
            eog.add(i)
            attrs[i] |= CONTROL
        for i in present(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")):
            attrs[i] = USER_DEFINED
        eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
        eog |= set(self._eot_candidates or ())
        texts = {self.tokens[i]: i for i in eog}
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            attrs[texts["<|end|>"]] = USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = NORMAL
        return eog

    def _name_attrs(self, kv, attrs) -> None:
        name = str(kv.get("general.name", "")).lower()
        pre, arch = str(kv.get(_K + "pre", "")), str(kv.get("general.architecture", ""))
        t2i = self.token_to_id
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in t2i:
                attrs[t2i["<mask>"]] |= LSTRIP
        elif "phi-3" in name or "phi3" in name:
            special = np.nonzero(attrs & (CONTROL | USER_DEFINED | UNKNOWN))[0]
            attrs[special] |= RSTRIP
            if "</s>" in t2i:
                attrs[t2i["</s>"]] |= RSTRIP
            for t in ("<unk>", "<s>", "<|endoftext|>"):
                if t in t2i:
                    attrs[t2i[t]] &= ~RSTRIP
        elif "modern-bert" in name and "[MASK]" in t2i:
            attrs[t2i["[MASK]"]] |= LSTRIP

    def _build_special_index(self) -> None:
        """Special tokens in llama.cpp's matching order (longest first) and a prefix index to find the
        few that occur in a text without scanning them all."""
        attrs, toks = self.attrs, self.tokens
        special = [i for i, a in enumerate(attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
        special.sort(key=lambda i: (-len(toks[i].encode("utf-8", "surrogatepass")), i))
        self._special = special
        index: dict = {}
        for rank, i in enumerate(special):
            index.setdefault(toks[i][:4], []).append(rank)
        self._special_index = index
        self._special_first = frozenset(k[0] for k in index)

    @property
    def eot_id(self) -> int | None:
        if self._eot_candidates:
            self.ids["eot"] = map_order(self.tokens, self._eot_candidates)[0]
            self._eot_candidates = None
        return self.ids["eot"]

    # --- queries ----------------------------------------------------------------------------------
    def is_eog(self, id: int) -> bool:
        return id in self.eog_ids

    def is_control(self, id: int) -> bool:
        return bool(self.attrs[id] & CONTROL)

    def token_attr(self, id: int) -> int:
        return self.attrs[id]

    # --- encoding ---------------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list:
        """Cut special tokens out of `text` (llama.cpp tokenizer_st_partition): list of str | int."""
        index, firsts, toks, attrs = self._special_index, self._special_first, self.tokens, self.attrs
        found = set()
        for pos, ch in enumerate(text):
            if ch in firsts:
                for k in range(1, 5):
                    for rank in index.get(text[pos:pos + k], ()):
                        if text.startswith(toks[self._special[rank]], pos):
                            found.add(rank)
        frags = [text]
        for rank in sorted(found):
            tid = self._special[rank]
            attr, stext = attrs[tid], toks[tid]
            if not parse_special and attr & (CONTROL | UNKNOWN):
                continue
            out = []
            for f in frags:
                if isinstance(f, int) or stext not in f:
                    out.append(f)
                    continue
                pos, end = 0, len(f)
                while True:
                    m = f.find(stext, pos)
                    if m < 0:
                        if pos < end:
                            out.append(f[pos:])
                        break
                    left = f[pos:m]
                    if attr & LSTRIP:
                        left = left.rstrip(_SPACES)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = m + len(stext)
                    if attr & RSTRIP:
                        while pos < end and f[pos] in _SPACES:
                            pos += 1
            frags = out
        return frags

    def encode(self, text: str, add_special: bool | None = None, parse_special: bool = True) -> list[int]:
        """llama_tokenize. add_special None = what llama.cpp's tools pass: the model's add_bos flag."""
        if add_special is None:
            add_special = self.add_bos
        frags = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        if self.kind == "bpe":
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                else:
                    self.model.encode(f, out)
        else:
            prev_special = True
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    f = " " + f
                self.model.encode(f.replace(" ", "\u2581"), out)
                prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    # --- decoding ---------------------------------------------------------------------------------
    def _piece(self, id: int) -> bytes:
        p = self._pieces.get(id)
        if p is None:
            if not 0 <= id < self.n_vocab:
                raise UsageError(f"token id {id} is outside the vocabulary (n_vocab = {self.n_vocab})")
            attr, text = self.attrs[id], self.tokens[id]
            if attr & (UNKNOWN | CONTROL | USER_DEFINED):
                p = text.encode("utf-8", "surrogatepass")
            elif attr & NORMAL:
                p = text.replace("\u2581", " ").encode("utf-8") if self.kind == "spm" else decode_text(text)
            elif attr & BYTE:
                p = bytes([_hex_prefix(text[3:5])])
            else:
                p = b""
            self._pieces[id] = p
        return p

    def token_to_piece(self, id: int, special: bool = True) -> bytes:
        """llama_token_to_piece with lstrip = 0: control/unknown tokens print only when `special`."""
        piece = self._piece(id)
        if not special and self.attrs[id] & (UNKNOWN | CONTROL):
            return b""
        return piece

    def decode(self, ids, remove_special: bool = False, unparse_special: bool = True) -> bytes:
        """llama_detokenize: bytes (the caller decodes them)."""
        ids = [int(i) for i in ids]
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        out = bytearray()
        for i in ids:
            p = self.token_to_piece(i, unparse_special)
            if remove_space and p[:1] == b" ":
                p = p[1:]
            remove_space = False
            out += p
        return _clean_spaces(out) if self.clean_spaces else bytes(out)


def _hex_prefix(s: str) -> int:
    """strtol(s, 16) on a two-character string: the leading hex digits, 0 if none."""
    v = 0
    for ch in s:
        if ch not in "0123456789abcdefABCDEF":
            break
        v = v * 16 + int(ch, 16)
    return v & 0xFF


def _clean_spaces(t: bytearray) -> bytes:
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

    def __init__(self, tok: Tokenizer, special: bool = True):
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
