"""test_pretokenize.py — every pre-tokenizer llama.cpp 0c1e570 knows, against llama.cpp's own splits.

tests/data/llama-pretok-splits.json (scripts/make_pretok_goldens.py) holds, for each `tokenizer.ggml.pre`
name, how llama.cpp's unicode_regex_split cuts ~75 texts with that name's regex list. pi2 must cut them the
same way, or refuse the name in one line.
"""
import json

import pytest
from conftest import DATA

from pi2.errors import UnsupportedError
from pi2.model import pretokenize
from pi2.model.pretokenize import LISTS, REFUSED, pre_tokenizer, split

G = json.loads((DATA / "llama-pretok-splits.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(G["names"]))
def test_splits_like_llama_cpp(name):
    if name in REFUSED:
        with pytest.raises(UnsupportedError, match=f"pre-tokenizer '{name}' is not supported"):
            pre_tokenizer(name)
        return
    pre = pre_tokenizer(name)
    want = G["splits"][G["names"][name]]
    for text, lengths in zip(G["texts"], want):
        got = " ".join(str(len(w)) for w in split(text, pre) if w)
        assert got == lengths, f"{name}: {text[:40]!r}"


def test_every_pi2_name_is_a_llama_cpp_name():
    assert set(pretokenize._PRE) <= set(G["names"])


def test_regex_sources_are_ascii():
    # non-ASCII characters are \u escapes: normalizing the source file cannot change a range
    for lst in LISTS.values():
        for expr in lst:
            assert expr.isascii(), expr[:40]


def test_an_untranslatable_regex_is_a_one_line_error_naming_the_pre_tokenizer(monkeypatch):
    monkeypatch.setitem(LISTS, "qwen35", [r"[z-a]+"])
    with pytest.raises(UnsupportedError) as e:
        pre_tokenizer("qwen35")
    assert str(e.value).startswith("pre-tokenizer 'qwen35': cannot translate its regex") and "\n" not in str(e.value)
    monkeypatch.setitem(LISTS, "qwen35", [r"[\u00e9\p{L}]+"])        # llama.cpp refuses this mix too
    with pytest.raises(UnsupportedError, match="pre-tokenizer 'qwen35'"):
        pre_tokenizer("qwen35")


def test_unknown_pre_tokenizer():
    with pytest.raises(UnsupportedError, match="unknown pre-tokenizer type: 'no-such'"):
        pre_tokenizer("no-such")


def test_the_cli_reports_an_untranslatable_regex_in_one_line(tmp_path, monkeypatch):
    from clirun import assert_error, cli
    from fixtures import write_model
    model = write_model(tmp_path / "m.gguf")                   # a byte-level BPE vocabulary, pre 'smollm'
    monkeypatch.setitem(LISTS, "starcoder", [r"[z-a]+"])
    line = assert_error(cli("tokenize", "-m", model, "-p", "hi"), 1, "pre-tokenizer 'smollm'")
    assert line.startswith("pi2: error: pre-tokenizer 'smollm': cannot translate its regex")
