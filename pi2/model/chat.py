# chat.py — chat prompts: pick the model's Jinja chat template (tokenizer.chat_template) and render
# messages with it, as HF transformers and llama.cpp's Jinja path do.
# Does: template lookup with llama.cpp's ChatML fallback; rendering (trim_blocks, lstrip_blocks,
#       raise_exception, strftime_now, a JSON `tojson` that keeps non-ASCII and key order).
# Does not: tokenize the result (tokenizer.py: encode(prompt, parse_special=True)).
from __future__ import annotations

import json
from datetime import datetime

from pi2.errors import ModelFormatError, UsageError

# llama.cpp's fallback (common/chat.cpp CHATML_TEMPLATE_SRC) for models without a template
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


def model_template(kv: dict, name: str | None = None) -> str | None:
    """The GGUF's template (`tokenizer.chat_template` or `tokenizer.chat_template.<name>`), or None."""
    t = kv.get("tokenizer.chat_template" + (f".{name}" if name else ""))
    return t if isinstance(t, str) and t else None


def select_template(kv: dict, override: str | None = None, fallback: bool = True) -> tuple[str, bool]:
    """(template source, used_fallback). As llama.cpp: an override wins ("chatml" names the built-in
    one); a model without a template gets its "tool_use" template, else ChatML."""
    if override:
        return (CHATML_TEMPLATE, False) if override == "chatml" else (override, False)
    t = model_template(kv)
    if t is not None:
        return t, False
    t = model_template(kv, "tool_use")
    if t is not None:
        return t, False
    if not fallback:
        raise UsageError("this model has no chat template (no tokenizer.chat_template in the GGUF)",
                         hint="pass a template file, or use ChatML ('chatml') as llama.cpp does by default")
    return CHATML_TEMPLATE, True


def _raise_exception(message):
    raise UsageError(f"chat template refused the messages: {message}")


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        _ENV = env
    return _ENV


_COMPILED: dict = {}


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool, bos_token: str,
                eos_token: str, **extra) -> str:
    """Render `messages` ([{"role": ..., "content": ...}, ...]) with a Jinja chat template."""
    import jinja2
    tpl = _COMPILED.get(template)
    if tpl is None:
        try:
            tpl = _env().from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ModelFormatError(f"chat template is not valid Jinja (line {e.lineno}): {e.message}") from None
        _COMPILED[template] = tpl
    try:
        return tpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                          bos_token=bos_token, eos_token=eos_token, **extra)
    except jinja2.TemplateError as e:
        raise UsageError(f"chat template failed: {e}") from None
