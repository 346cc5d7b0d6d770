"""test_tokenizer.py — tokenizer against llama.cpp goldens (real vocabularies) and tiny synthetic vocabularies."""
import json
import time

import numpy as np
import pytest
from conftest import DATA, model_file

from pi2.errors import ModelFormatError, UnsupportedError
from pi2.model.pretokenize import BYTE_CHARS, pre_tokenizer, split
from pi2.model.tokenizer import CONTROL, StreamDecoder, Tokenizer
from pi2.model.vocab_order import iteration_order, string_hashes

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]
_TOK: dict = {}


def real(key):
    if key not in _TOK:
        from pi2.model.gguf_file import GGUFFile
        kv = GGUFFile(model_file(key)).kv
        t0 = time.perf_counter()
        tok = Tokenizer.from_kv(kv)
        _TOK[key] = (tok, time.perf_counter() - t0, kv)
    return _TOK[key]


def golden(key):
    return json.loads((DATA / f"{key}.tokenize.json").read_text(encoding="utf-8"))


# --- goldens (llama.cpp 0c1e570) -------------------------------------------------------------------
@pytest.mark.model
@pytest.mark.parametrize("key", MODELS)
def test_model_fields(key):
    tok, load_s, _ = real(key)
    m = golden(key)["model"]
    assert (tok.n_vocab, tok.bos_id, tok.eos_id, tok.eot_id) == (m["n_vocab"], m["bos_id"], m["eos_id"], m["eot_id"])
    assert tok.add_bos == m["tokenizer.ggml.add_bos_token"] == golden(key)["add_special"]
    assert load_s < 1.0


@pytest.mark.model
@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("key", MODELS)
def test_golden_cases(key, parse_special):
    tok = real(key)[0]
    g = golden(key)
    for case in g["cases"]:
        r = case[f"parse_special_{str(parse_special).lower()}"]
        assert tok.encode(case["text"], parse_special=parse_special) == r["ids"], case["name"]
        assert tok.encode(case["text"], add_special=g["add_special"], parse_special=parse_special) == r["ids"]
        assert tok.decode(r["ids"]).decode("utf-8") == r["detok"], case["name"]
        plain = tok.decode(r["ids"], remove_special=True, unparse_special=False)
        assert plain.decode("utf-8") == r["detok_plain"], case["name"]
        body = r["ids"][1:] if g["add_special"] else r["ids"]
        assert tok.decode(body) == case["text"].encode("utf-8")


@pytest.mark.model
@pytest.mark.parametrize("key", MODELS)
def test_golden_pieces(key):
    tok = real(key)[0]
    for p in golden(key)["pieces"]:
        i = p["id"]
        assert tok.token_to_piece(i, special=False).hex() == p["piece_hex"], i
        assert tok.token_to_piece(i, special=True).hex() == p["piece_special_hex"], i
        assert tok.token_attr(i) == p["attr"], i
        assert tok.is_eog(i) == p["is_eog"], i
        assert tok.is_control(i) == bool(p["attr"] & CONTROL)


@pytest.mark.model
@pytest.mark.parametrize("key", MODELS)
def test_paragraph_encodes_fast(key):
    tok = real(key)[0]
    text = next(c["text"] for c in golden(key)["cases"] if c["name"] == "paragraph_2000")
    tok.encode(text + " warm-up")
    t0 = time.perf_counter()
    tok.encode(text[::-1])                     # a text whose pieces are mostly not cached yet
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.model
def test_qwen_fim_tokens_are_eog():
    tok = real("qwen2.5-coder-0.5b")[0]
    ids = [tok.token_to_id[t] for t in ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")]
    assert all(tok.is_eog(i) for i in ids)


@pytest.mark.model
def test_map_order_matches_libstdcxx_on_smollm():
    from pi2.model.gguf_file import GGUFFile
    tokens = GGUFFile(model_file("smollm2-135m")).kv["tokenizer.ggml.tokens"]
    where = np.argsort(iteration_order(tokens))
    assert (where[0], where[2]) == (20758, 22934)     # positions printed by a libstdc++ (GCC 12) program


def test_std_hash_values():
    # std::hash<std::string> values from libstdc++ (x86-64, GCC 12)
    assert string_hashes(["", "a", "hello", "<|im_end|>", "0123456789abcdefXYZ"]).tolist() == [
        6142509188972423790, 4993892634952068459, 2762169579135187400, 2038672007907099973, 3947215215395305647]


# --- synthetic SPM vocabulary ----------------------------------------------------------------------
def spm_kv(extra=(), byte_tokens=True, **over):
    toks = [("<unk>", 2, 0.0), ("<s>", 3, 0.0), ("</s>", 3, 0.0)]
    if byte_tokens:
        toks += [(f"<0x{b:02X}>", 6, 0.0) for b in range(256)]
    toks += [("▁", 1, -1.0), ("a", 1, -2.0), ("b", 1, -2.0), ("c", 1, -2.0), ("▁a", 1, -1.5), ("ab", 1, -0.5),
             ("bc", 1, -0.2), ("▁▁", 1, -3.0), ("<br>", 4, 0.0)] + list(extra)
    kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [t for t, _, _ in toks],
          "tokenizer.ggml.token_type": np.array([y for _, y, _ in toks], dtype=np.int32),
          "tokenizer.ggml.scores": np.array([s for _, _, s in toks], dtype=np.float32)}
    kv.update({"tokenizer.ggml." + k: v for k, v in over.items()})
    return kv


def ids_of(tok, *texts):
    return [tok.token_to_id[t] for t in texts]


def test_spm_merges_by_score_then_leftmost():
    tok = Tokenizer.from_kv(spm_kv(add_space_prefix=False))
    assert tok.encode("abc", add_special=False) == ids_of(tok, "a", "bc")       # bc (-0.2) beats ab (-0.5)
    tok = Tokenizer.from_kv(spm_kv([("xy", 1, -1.0), ("yx", 1, -1.0), ("x", 1, -5.0), ("y", 1, -5.0)],
                                   add_space_prefix=False))
    assert tok.encode("xyx", add_special=False) == ids_of(tok, "xy", "x")        # tie -> leftmost pair


def test_spm_bos_space_prefix_and_empty():
    tok = Tokenizer.from_kv(spm_kv())
    assert tok.add_bos and tok.add_space_prefix
    assert tok.encode("") == [1] and tok.encode("", add_special=False) == []
    assert tok.encode("a") == [1] + ids_of(tok, "▁a")
    assert tok.encode("   ", add_special=False) == ids_of(tok, "▁▁", "▁▁")
    assert tok.decode(tok.encode("a b")) == b"<s> a b"                           # the strip hits BOS only
    assert tok.decode(tok.encode("a b")[1:]) == b"a b"                           # leading space stripped once
    assert tok.decode(tok.encode("a"), remove_special=True) == b" a"             # llama.cpp keeps it here


def test_spm_prompt_already_starting_with_bos():
    tok = Tokenizer.from_kv(spm_kv())
    assert tok.encode("<s>a") == [1, 1] + ids_of(tok, "▁a")                      # double BOS, as llama.cpp
    assert tok.encode("<s>a", parse_special=False)[:2] == [1, tok.token_to_id["▁"]]
    # USER_DEFINED tokens match even without parse_special; the text after them gets the space prefix
    assert tok.encode("a<br>b", add_special=False, parse_special=False) == ids_of(tok, "▁a", "<br>", "▁", "b")


def test_spm_byte_fallback_and_missing_bytes():
    tok = Tokenizer.from_kv(spm_kv(add_space_prefix=False))
    assert tok.encode("é", add_special=False) == [3 + 0xC3, 3 + 0xA9]
    assert tok.decode([3 + 0xC3, 3 + 0xA9]) == "é".encode()
    tok = Tokenizer.from_kv(spm_kv(byte_tokens=False, add_space_prefix=False))
    with pytest.raises(ModelFormatError):
        tok.encode("é", add_special=False)


def test_stream_decoder_holds_back_split_emoji():
    tok = Tokenizer.from_kv(spm_kv(add_space_prefix=False))
    emoji = "😀".encode()
    sd = StreamDecoder(tok)
    outs = [sd.push(tok.encode("a", add_special=False)[0])] + [sd.push(3 + b) for b in emoji]
    assert outs == ["a", "", "", "", "😀"] and sd.flush() == ""
    sd.push(3 + emoji[0])
    sd.push(3 + emoji[1])
    assert sd.flush() == "\ufffd"
    assert StreamDecoder(tok, special=False).push(1) == "" and StreamDecoder(tok).push(1) == "<s>"


# --- synthetic byte-level BPE vocabulary -----------------------------------------------------------
def bpe_kv(pre="gpt-2", merges=("a b", "b c", "Ġ a"), extra=(), **over):
    toks = [("<|endoftext|>", 3), ("<|im_end|>", 3), ("<tag>", 4)] + [(c, 1) for c in BYTE_CHARS[:128]]
    toks += [(a + b, 1) for a, b in (m.split(" ") for m in merges)] + list(extra)
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.merges": list(merges),
          "tokenizer.ggml.tokens": [t for t, _ in toks],
          "tokenizer.ggml.token_type": np.array([y for _, y in toks], dtype=np.int32)}
    kv.update({"tokenizer.ggml." + k: v for k, v in over.items()})
    return kv


def test_bpe_lowest_rank_first_and_unknown_bytes_dropped():
    tok = Tokenizer.from_kv(bpe_kv())
    assert tok.encode("abc") == ids_of(tok, "ab", "c")                 # "a b" has rank 0
    assert tok.encode("") == [] and tok.encode(" a") == ids_of(tok, "Ġa")
    tok = Tokenizer.from_kv(bpe_kv(merges=("b c", "a b")))
    assert tok.encode("abc") == ids_of(tok, "a", "bc")
    assert tok.encode("a é") == ids_of(tok, "a", "Ġ")                  # bytes >= 0x80 missing: dropped


def test_bpe_only_spaces_and_clean_spaces():
    tok = Tokenizer.from_kv(bpe_kv())
    assert tok.encode("   ") == ids_of(tok, "Ġ", "Ġ", "Ġ")
    assert tok.encode("  a") == ids_of(tok, "Ġ", "Ġa")
    assert tok.decode(ids_of(tok, "a", "Ġ", ",", "Ġ", "'", "s")) == b"a,'s"    # gpt-2 cleans spaces
    tok = Tokenizer.from_kv(bpe_kv(pre="smollm"))
    assert tok.decode(ids_of(tok, "a", "Ġ", ",")) == b"a ,"


def test_bpe_ignore_merges_and_llama3_bos():
    tok = Tokenizer.from_kv(bpe_kv(pre="llama-bpe", extra=[("abc", 1)], bos_token_id=0))
    assert tok.add_bos and tok.encode("abc") == [0, tok.token_to_id["abc"]]
    tok = Tokenizer.from_kv(bpe_kv(pre="gpt-2", extra=[("abc", 1)]))
    assert tok.encode("abc") == ids_of(tok, "ab", "c")


def test_bpe_special_tokens_and_eog():
    tok = Tokenizer.from_kv(bpe_kv(eos_token_id=0))
    text = "a<|im_end|><tag>b"
    assert tok.encode(text) == ids_of(tok, "a", "<|im_end|>", "<tag>", "b")
    plain = tok.encode(text, parse_special=False)
    assert tok.token_to_id["<|im_end|>"] not in plain and tok.token_to_id["<tag>"] in plain
    assert tok.eog_ids == {0, 1} and tok.eot_id in (0, 1)
    assert tok.decode(tok.encode(text), unparse_special=False) == b"a<tag>b"


def test_pretokenizer_lists():
    assert split("Hello world123!!", pre_tokenizer("gpt-2")) == ["Hello", " world", "123", "!!"]
    assert split("x 12345", pre_tokenizer("llama-bpe")) == ["x", " ", "123", "45"]
    assert split("x 12345", pre_tokenizer("qwen2")) == ["x", " ", "1", "2", "3", "4", "5"]
    assert split("ab12 \u00a0\u00a0c", pre_tokenizer("smollm")) == ["ab", "1", "2", " \u00a0", "\u00a0", "c"]
    assert split("I'M x", pre_tokenizer("llama3")) == ["I", "'M", " x"]


def test_bad_vocabularies():
    with pytest.raises(UnsupportedError):
        Tokenizer.from_kv(bpe_kv(pre="no-such-pre"))
    with pytest.raises(ModelFormatError):
        Tokenizer.from_kv({k: v for k, v in bpe_kv().items() if k != "tokenizer.ggml.merges"})
    kv = bpe_kv()
    kv["tokenizer.ggml.tokens"] = kv["tokenizer.ggml.tokens"][:-1] + ["a"]
    with pytest.raises(ModelFormatError):
        Tokenizer.from_kv(kv)
    with pytest.raises(ModelFormatError):
        Tokenizer.from_kv({})
    with pytest.raises(UnsupportedError):
        Tokenizer.from_kv({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]})
