"""test_tokenizer_kinds.py — the SentencePiece-style BPE (gemma4) and WordPiece (bert) tokenizers on tiny
synthetic vocabularies: each rule of llama.cpp's sessions that the real vocabularies may not exercise."""
import numpy as np
import pytest

from pi2.errors import ModelFormatError
from pi2.model.tokenizer import Tokenizer


def gemma4_kv(**over):
    toks = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2)] + [(f"<0x{b:02X}>", 6) for b in range(256)]
    toks += [(t, 1) for t in ("▁", "a", "b", "\n", "▁a", "ab", "\n\n", "\n\n\n")]
    kv = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.pre": "gpt-2",       # the pre key is ignored
          "tokenizer.ggml.tokens": [t for t, _ in toks],
          "tokenizer.ggml.token_type": np.array([y for _, y in toks], dtype=np.int32),
          "tokenizer.ggml.merges": ["▁ a", "a b", "\n \n"], "tokenizer.ggml.bos_token_id": 2,
          "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.add_bos_token": False}
    kv.update({"tokenizer.ggml." + k: v for k, v in over.items()})
    return kv


def ids(tok, *texts):
    return [tok.token_to_id[t] for t in texts]


def test_gemma4_spaces_become_u2581_and_merge_on_raw_text():
    tok = Tokenizer.from_kv(gemma4_kv())
    assert tok.pre.name == "gemma4" and tok.add_bos           # add_bos is forced, as llama.cpp does
    assert tok.encode("a ab", add_special=False) == ids(tok, "a", "▁a", "b")
    assert tok.encode("ab") == [2] + ids(tok, "ab")
    assert tok.decode(ids(tok, "a", "▁a", "b")) == b"a ab"


def test_gemma4_newline_runs_and_byte_fallback():
    tok = Tokenizer.from_kv(gemma4_kv())
    # a run of newlines that is a token is taken whole, even without a merge that makes it
    assert tok.encode("a\n\n\nb", add_special=False) == ids(tok, "a", "\n\n\n", "b")
    assert tok.encode("\n\n\n\n", add_special=False) == ids(tok, "\n\n", "\n\n")
    e = tok.encode("é", add_special=False)
    assert e == ids(tok, "<0xC3>", "<0xA9>") and tok.decode(e) == "é".encode()


def wpm_kv(**over):
    toks = [("[PAD]", 3), ("[UNK]", 3), ("[CLS]", 3), ("[SEP]", 3), ("[MASK]", 3)]
    toks += [(t, 1) for t in ("▁hello", "▁world", "▁un", "aff", "able", "▁,", "▁!", "▁中", "▁cafe", "▁$", "▁a")]
    kv = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": [t for t, _ in toks],
          "tokenizer.ggml.token_type": np.array([y for _, y in toks], dtype=np.int32),
          "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.bos_token_id": 2,
          "tokenizer.ggml.seperator_token_id": 3, "tokenizer.ggml.padding_token_id": 0}
    kv.update({"tokenizer.ggml." + k: v for k, v in over.items()})
    return kv


def test_wordpiece_normalizes_and_takes_longest_pieces():
    tok = Tokenizer.from_kv(wpm_kv())
    assert tok.encode("Hello, WORLD!", add_special=False) == ids(tok, "▁hello", "▁,", "▁world", "▁!")
    assert tok.encode("Unaffable", add_special=False) == ids(tok, "▁un", "aff", "able")
    assert tok.encode("Café\u0301 $a", add_special=False) == ids(tok, "▁cafe", "▁$", "▁a")   # accents dropped
    assert tok.encode("中文 x\x00\u200b", add_special=False) == ids(tok, "▁中", "[UNK]", "[UNK]")
    assert tok.encode("unaffablex", add_special=False) == ids(tok, "[UNK]")   # no partial word survives


def test_wordpiece_cls_sep_and_decode():
    tok = Tokenizer.from_kv(wpm_kv())
    assert tok.add_bos and tok.encode("hello") == ids(tok, "[CLS]", "▁hello", "[SEP]")
    assert tok.decode(ids(tok, "▁hello", "▁,", "▁world", "▁!")) == b" hello, world!"
    assert tok.decode(tok.encode("hello"), unparse_special=False) == b" hello"


def test_wordpiece_normalizer_options():
    tok = Tokenizer.from_kv(wpm_kv(**{"normalizer.lowercase": False}))
    assert tok.encode("Hello hello", add_special=False) == ids(tok, "[UNK]", "▁hello")
    tok = Tokenizer.from_kv(wpm_kv(**{"normalizer.strip_accents": False}))
    assert tok.encode("café", add_special=False) == ids(tok, "[UNK]")


def test_wordpiece_without_unknown_or_separator():
    tok = Tokenizer.from_kv(wpm_kv(unknown_token_id=999, seperator_token_id=999))
    with pytest.raises(ModelFormatError):
        tok.encode("zzz", add_special=False)
    with pytest.raises(ModelFormatError):
        tok.encode("hello", add_special=True)
