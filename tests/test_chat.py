"""test_chat.py — chat template rendering against the prompts llama.cpp's goldens were generated from."""
import json

import pytest
from conftest import DATA, model_file

from pi2.errors import ModelFormatError, UsageError
from pi2.model.chat import CHATML_TEMPLATE, render_chat, select_template

CHAT = json.loads((DATA / "chat_prompts.json").read_text(encoding="utf-8"))["models"]


@pytest.mark.parametrize("key", sorted(CHAT))
def test_model_templates_render_golden_prompts(key):
    m = CHAT[key]
    for p in m["prompts"]:
        out = render_chat(m["chat_template"], p["chat_messages"], add_generation_prompt=True,
                          bos_token=m["bos_token"], eos_token=m["eos_token"])
        assert out == p["prompt"], p["name"]


@pytest.mark.model
@pytest.mark.parametrize("key", sorted(CHAT))
def test_rendered_prompt_tokenizes_like_llama_cpp(key):
    from pi2.model.gguf_file import GGUFFile
    from pi2.model.tokenizer import Tokenizer
    kv = GGUFFile(model_file(key)).kv
    tok = Tokenizer.from_kv(kv)
    template, fallback = select_template(kv)
    assert not fallback and template == CHAT[key]["chat_template"]
    for p in CHAT[key]["prompts"]:
        assert tok.encode(p["prompt"], add_special=True, parse_special=True) == p["prompt_ids"]


def test_missing_template_falls_back_to_chatml():
    template, fallback = select_template({})
    assert fallback and template == CHATML_TEMPLATE
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert render_chat(template, msgs, True, "", "") == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert select_template({}, override="chatml") == (CHATML_TEMPLATE, False)
    assert select_template({"tokenizer.chat_template.tool_use": "T"}) == ("T", False)
    with pytest.raises(UsageError):
        select_template({}, fallback=False)


def test_template_helpers_and_errors():
    t = "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}{{ eos_token }}"
    assert render_chat(t, [{"role": "user", "content": "é<"}], False, "<s>", "</s>") == \
        '<s>{"role": "user", "content": "é<"}</s>'
    with pytest.raises(UsageError, match="alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [], False, "", "")
    with pytest.raises(ModelFormatError):
        render_chat("{% for %}", [], False, "", "")
    # trim_blocks / lstrip_blocks
    assert render_chat("  {% if true %}\nx\n  {% endif %}\n", [], False, "", "") == "x\n"
