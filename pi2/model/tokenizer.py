# tokenizer.py — the public tokenizer: GGUF vocabulary -> ids and back, as llama.cpp's llama_vocab.
# Does: read the tokenizer model and its flags (defaults per model, pre-tokenizer, GGUF overrides), split
#       out special tokens, dispatch fragments to SPM (spm.py), BPE (bpe.py) or WordPiece (wpm.py),
#       token_to_piece / detokenize (pieces in detokenize.py).
# Does not: regexes (pretokenize.py), merging (bpe.py, spm.py), which tokens are special (specials.py),
#       chat templates (chat.py).
from __future__ import annotations

from pi2.errors import ModelFormatError, UnsupportedError, UsageError
from pi2.model import specials
from pi2.model.bpe import BPE
from pi2.model.detokenize import StreamDecoder, clean_spaces, piece
from pi2.model.pretokenize import pre_tokenizer
from pi2.model.specials import (BYTE, CONTROL, LSTRIP, NORMAL, RSTRIP, UNKNOWN,  # noqa: F401
                                USER_DEFINED, K)
from pi2.model.spm import SPM
from pi2.model.vocab_order import map_order
from pi2.model.wpm import WordPiece

__all__ = ["Tokenizer", "StreamDecoder", "CONTROL", "USER_DEFINED", "UNKNOWN", "NORMAL", "BYTE"]

MODELS = ("llama", "gpt2", "gemma4", "bert")
_SPACES = " \t\n\v\f\r"


class Tokenizer:
    """A GGUF vocabulary that tokenizes exactly like llama.cpp: SentencePiece (llama), BPE (gpt2, gemma4)
    and WordPiece (bert)."""

    def __init__(self, kv: dict):
        model = kv.get(K + "model")
        if model is None:
            raise ModelFormatError("GGUF has no tokenizer.ggml.model key: no vocabulary to tokenize with")
        if model not in MODELS:
            raise UnsupportedError(f"tokenizer '{model}' is not supported",
                                   hint="pi2 supports llama (SentencePiece), gpt2 and gemma4 (BPE), bert (WordPiece)")
        tokens = kv.get(K + "tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ModelFormatError("GGUF has no tokenizer.ggml.tokens array")
        n = len(tokens)
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens, self.n_vocab = tokens, n
        self.token_to_id = dict(zip(tokens, range(n)))
        if len(self.token_to_id) != n:
            seen = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise ModelFormatError(f"duplicate token in vocabulary: '{t}' has ids {seen[t]} and {i}")
                seen[t] = i
        attrs = specials.token_attrs(kv, n)
        self.pre = None
        self.add_space_prefix, self.add_eos = False, False
        if model == "llama":
            self.kind, self.escaped, defaults = "spm", True, dict(bos=1, eos=2, unk=0)
            self.add_space_prefix, self.clean_spaces, self.add_bos = True, False, True
            scores = kv.get(K + "scores")
            if scores is not None and len(scores) < n:
                raise ModelFormatError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
            self.model = SPM(self.token_to_id, scores)
        elif model == "bert":
            self.kind, self.escaped = "wpm", True
            defaults = dict(bos=101, unk=100, sep=102, pad=0, mask=103)
            self.clean_spaces, self.add_bos = True, True
        else:
            merges = kv.get(K + "merges")
            if not isinstance(merges, list):
                raise ModelFormatError("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")
            # a gemma4 vocabulary always uses the gemma4 pre-tokenizer, whatever tokenizer.ggml.pre says
            self.pre = pre_tokenizer("gemma4" if model == "gemma4" else kv.get(K + "pre"))
            self.kind, self.escaped = "bpe", not self.pre.byte_encode
            defaults = {} if model == "gemma4" else dict(bos=None if self.pre.no_bos else 11, eos=11)
            self.clean_spaces, self.add_bos = self.pre.clean_spaces, self.pre.add_bos
            self.model = BPE(self.token_to_id, merges, self.pre)
        if kv.get(K + "add_space_prefix") is not None:
            self.add_space_prefix = bool(kv[K + "add_space_prefix"])
        ids = specials.special_ids(kv, n, defaults)
        for flag in ("add_bos", "add_eos"):
            if kv.get(K + flag + "_token") is not None:
                setattr(self, flag, bool(kv[K + flag + "_token"]))
        if self.pre is not None and self.pre.force_bos:
            self.add_bos = True
        if self.add_bos and ids["bos"] is None:
            raise ModelFormatError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
        if self.add_eos and ids["eos"] is None:
            raise ModelFormatError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")
        if self.kind == "wpm":
            lowercase = bool(kv.get(K + "normalizer.lowercase", True))
            strip = bool(kv.get(K + "normalizer.strip_accents", lowercase))
            self.model = WordPiece(self.token_to_id, ids["unk"], lowercase, strip)
        self._special_attrs_and_eog(kv, ids, attrs)

    @classmethod
    def from_kv(cls, kv: dict) -> "Tokenizer":
        return cls(kv)

    # --- loading ----------------------------------------------------------------------------------
    def _special_attrs_and_eog(self, kv, ids, attrs) -> None:
        eog, self._eot_candidates = specials.detect(self.tokens, self.token_to_id, ids, attrs)
        self.ids = ids
        self.bos_id, self.eos_id, self.eom_id = ids["bos"], ids["eos"], ids["eom"]
        self.eog_ids = frozenset(eog)
        specials.name_attrs(kv, self.token_to_id, attrs)
        self.attrs = attrs.tolist()
        self._pieces: dict = {}
        self._build_special_index()

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
        if add_special and (self.add_bos or self.kind == "wpm"):
            if self.bos_id is None:
                raise ModelFormatError("the vocabulary has no BOS token to start the text with")
            out.append(self.bos_id)
        if self.kind != "spm":
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
        if add_special and self.kind == "wpm":
            if self.ids["sep"] is None:
                raise ModelFormatError("WordPiece vocabulary has no separator token to end the text with")
            out.append(self.ids["sep"])
        elif add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    # --- decoding ---------------------------------------------------------------------------------
    def _piece(self, id: int) -> bytes:
        p = self._pieces.get(id)
        if p is None:
            if not 0 <= id < self.n_vocab:
                raise UsageError(f"token id {id} is outside the vocabulary (n_vocab = {self.n_vocab})")
            p = self._pieces[id] = piece(self.tokens[id], self.attrs[id], self.escaped)
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
        return clean_spaces(out) if self.clean_spaces else bytes(out)
