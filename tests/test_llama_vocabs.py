"""test_llama_vocabs.py — llama.cpp's own tokenizer test suite (test-tokenizer-0) on pi2's tokenizer.

Every `models/ggml-vocab-*.gguf` of llama.cpp 0c1e570 (fetched from the llama-cpp-python 0.3.36 sdist by
scripts/fetch_models.py llama-vocabs), every case of its `.inp`/`.out` files, tokenized as test-tokenizer-0
does (add_special = false, parse_special = false); the detokenized text is checked against what
test-tokenizer-0 prints (tests/data/llama-vocab-suite.json, scripts/make_vocab_goldens.py). The vocabularies
without cases are checked against llama.cpp's ids on the gpt-2 cases, and every vocabulary on texts that
stress Unicode handling, from the same file.
"""
import importlib.util
import json

import pytest
from conftest import DATA, ROOT, llama_vocab_dir

from pi2.errors import UnsupportedError
from pi2.model.gguf_file import GGUFFile
from pi2.model.tokenizer import Tokenizer

SUITE = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
         "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
WITHOUT_CASES = ["aquila", "baichuan", "gpt-neox"]
REFUSED = {"nomic-bert-moe": "tokenizer 't5' is not supported"}      # UGM (T5 unigram): not implemented
_GOLDEN: dict = {}
_spec = importlib.util.spec_from_file_location("tokenizer_suite", ROOT / "scripts" / "tokenizer_suite.py")
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)


def golden() -> dict:
    if not _GOLDEN:
        _GOLDEN.update(json.loads((DATA / "llama-vocab-suite.json").read_text(encoding="utf-8")))
    return _GOLDEN


def load(name: str) -> Tokenizer:
    f = GGUFFile(llama_vocab_dir() / f"ggml-vocab-{name}.gguf")
    try:
        return Tokenizer.from_kv(f.kv)
    finally:
        f.close()


def read_inputs(name: str) -> list:
    return suite.read_inputs(llama_vocab_dir() / f"ggml-vocab-{name}.gguf.inp")


def read_cases(name: str) -> dict:
    return suite.read_cases(llama_vocab_dir() / f"ggml-vocab-{name}.gguf")


def test_the_suite_is_every_vocabulary_with_cases():
    d = llama_vocab_dir()
    with_cases = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in d.glob("ggml-vocab-*.gguf.inp"))
    assert with_cases == SUITE
    rest = sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in d.glob("ggml-vocab-*.gguf"))
    assert sorted(set(rest) - set(SUITE)) == sorted(WITHOUT_CASES + list(REFUSED))


@pytest.mark.parametrize("name", SUITE)
def test_every_case(name):
    tok, cases = load(name), read_cases(name)
    detok = golden()["with_cases"][name]
    assert len(cases) == detok["n_cases"]
    wrong = []
    for text, want in cases.items():
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            wrong.append(f"{text[:40]!r}: {got[:12]} != {want[:12]}")
    assert not wrong, f"{name}: {len(wrong)} of {len(cases)} cases differ:\n" + "\n".join(wrong)
    for text, want in cases.items():
        assert tok.decode(want) == detok["detok"][text].encode("utf-8", "surrogateescape"), text[:40]


@pytest.mark.parametrize("name", WITHOUT_CASES)
def test_vocabularies_without_cases(name):
    tok, want = load(name), golden()["without_cases"][name]
    assert want["loads"]
    for text, r in want["cases"].items():
        assert tok.encode(text, add_special=False, parse_special=False) == r["ids"], text[:40]
        assert tok.decode(r["ids"]) == r["detok"].encode("utf-8", "surrogateescape"), text[:40]


@pytest.mark.parametrize("name", SUITE + WITHOUT_CASES)
def test_hard_texts(name):
    """Texts that stress Unicode handling (marks, exotic spaces, characters newer than Unicode 15.1, ...)."""
    tok, want = load(name), golden()["hard"][name]
    for text, r in want.items():
        assert tok.encode(text, add_special=False, parse_special=False) == r["ids"], text[:40]
        assert tok.decode(r["ids"]) == r["detok"].encode("utf-8", "surrogateescape"), text[:40]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_vocabularies_are_refused_in_one_line(name):
    with pytest.raises(UnsupportedError, match=REFUSED[name]) as e:
        load(name)
    assert "\n" not in str(e.value)


def test_the_suite_script_reports_every_vocabulary():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "tokenizer_suite.py"), str(llama_vocab_dir())],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == SUITE and lines[-1].split()[0] == "all"
