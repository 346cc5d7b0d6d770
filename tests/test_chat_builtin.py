"""test_chat_builtin.py — llama.cpp's built-in chat templates by name (against llama_chat_apply_template's output,
tests/data/chat_builtin_goldens.json), their detection from a template's text, and the choice for files without a
template (Gemma-3's architecture and vocabulary imply gemma)."""
import json
from pathlib import Path

import pytest

from pi2.errors import UsageError
from pi2.model.chat import CHATML_TEMPLATE
from pi2.model.chat_builtin import BUILTINS, detect, detect_from_vocab
from pi2.runtime.chat import choose_template

DOC = json.loads((Path(__file__).parent / "data" / "chat_builtin_goldens.json").read_text())


@pytest.mark.parametrize("case", DOC["cases"], ids=lambda c: f"{c['template']}-{c['chat']}-{c['add_assistant']}")
def test_builtin_renders_as_llama_cpp(case):
    assert BUILTINS[case["template"]](DOC["chats"][case["chat"]], case["add_assistant"]) == case["text"]


@pytest.mark.parametrize("text, name", [
    ("{% for m in messages %}<|im_start|>{{ m.role }}", "chatml"),
    ("{{ '<start_of_turn>' + role }}", "gemma"),
    ("<|start_header_id|>{{ role }}<|end_header_id|>", "llama3"),
    ("[SYSTEM_PROMPT] [INST]", "mistral-v7"),
    ("{{ '<|user|>' }}{{ '<|assistant|>' }}<|end|>", "phi3"),
    ("[INST] <<SYS>>", "llama2-sys"),
    ("gemma", "gemma"), ("nothing known", None),
])
def test_detect_from_template_text(text, name):
    assert detect(text) == name


def test_files_without_a_template():
    assert detect_from_vocab("gemma3", ["<pad>", "<eos>"]) == "gemma"
    assert detect_from_vocab("llama", ["<s>", "<|im_start|>", "<|im_end|>"]) == "chatml"
    assert detect_from_vocab("llama", ["<|start_header_id|>", "<|eot_id|>"]) == "llama3"
    assert detect_from_vocab("llama", ["<s>", "</s>"]) is None
    assert choose_template({}, ["<s>"], "gemma3") == ("gemma", None, False)
    assert choose_template({}, ["<s>"], "llama") == ("chatml", CHATML_TEMPLATE, True)    # llama.cpp's fallback
    assert choose_template({"tokenizer.chat_template": "T"}, [], "gemma3") == ("jinja", "T", False)


def test_override_by_name_or_jinja():
    kv = {"tokenizer.chat_template": "T"}
    assert choose_template(kv, [], "llama", "llama3") == ("llama3", None, False)
    assert choose_template(kv, [], "llama", "{{ messages }}") == ("jinja", "{{ messages }}", False)
    with pytest.raises(UsageError, match="unknown chat template 'nope'"):
        choose_template(kv, [], "llama", "nope")
