"""chat.py — a conversation on one sequence of the Python API (pi2.api.Sequence): each turn rendered with the model's
chat template, the KV cache kept across turns (only the text after what it holds is evaluated), and the turn's end
evaluated so the next one continues from it.

Owns: the template choice (--chat-template's built-in name or Jinja text; else the file's; else the built-in its
architecture and vocabulary imply; else ChatML, as llama.cpp falls back), the cached text and when it is dropped (the
template rewrote history, a reply was interrupted), /clear and /regen, and when the context is full (with
--context-shift never while a shift makes room: the engine drops half of what follows the kept tokens before a decode
that would fill it, as llama-completion does, and the conversation goes on). Does not: read input or print
(pi2/cli/run_chat.py), or decode and sample (the sequence's stream).
"""
from __future__ import annotations

from pi2.errors import UsageError
from pi2.model.chat import CHATML_TEMPLATE, model_template, render_chat
from pi2.model.chat_builtin import BUILTINS, detect, detect_from_vocab
from pi2.runtime.generate import Generation, Timings, check_prompt
from pi2.runtime.sampling import Sampler


def choose_template(kv: dict, tokens, arch: str, override: str | None = None) -> tuple:
    """(name, source or None, fallback): a built-in's name with no source, or "jinja" and the Jinja source.
    fallback is True when nothing chose a template and ChatML is used, as llama.cpp does (with a warning)."""
    if override:
        if override in BUILTINS:
            return override, None, False
        if "{{" in override or "{%" in override:
            return "jinja", override, False
        raise UsageError(f"unknown chat template {override!r}", hint="built-in names: " + ", ".join(BUILTINS))
    t = model_template(kv) or model_template(kv, "tool_use")
    if t is not None:
        return "jinja", t, False
    name = detect_from_vocab(arch, tokens)
    return (name, None, False) if name else ("chatml", CHATML_TEMPLATE, True)


class Chat:
    """Messages so far ([{"role", "content"}]) and the text whose tokens the sequence's cache holds."""

    def __init__(self, seq, system: str | None = None, template: str | None = None):
        self.seq, self.session = seq, seq.session
        m = self.session.model
        self.tok = m.tokenizer
        self.template_name, self.template, self.fallback = choose_template(m.file.kv, self.tok.tokens,
                                                                           m.config.arch, template)
        if self.template_name == "jinja" and detect(self.template) is not None:
            self.template_name = f"jinja ({detect(self.template)})"
        tok = self.tok
        self.bos = tok.token_to_piece(tok.bos_id).decode("utf-8", "replace") if tok.bos_id is not None else ""
        self.eos = tok.token_to_piece(tok.eos_id).decode("utf-8", "replace") if tok.eos_id is not None else ""
        self.system = system
        self.messages = [{"role": "system", "content": system}] if system else []
        self.cached = ""

    def render(self, messages: list, add_assistant: bool = True) -> str:
        if self.template is None:
            return BUILTINS[self.template_name](messages, add_assistant)
        return render_chat(self.template, messages, add_assistant, self.bos, self.eos)

    def room(self) -> int:
        """Tokens the next turn may add: what the context has left, or with a context shift (--context-shift) what
        it has left after the shift the engine makes first (half of the positions after the kept ones dropped,
        llama-completion's rule), less the 4 tokens check_prompt keeps free."""
        s, ctx = self.session, self.session.ctx
        n_past = s.n_past
        if getattr(ctx, "ctx_shift", False):
            n_past -= max(0, (n_past - getattr(ctx, "n_keep", 0)) // 2)
        return s.n_ctx - n_past - 4

    @property
    def full(self) -> bool:
        """No room for another turn (with a context shift, not even after one)."""
        return self.room() < 1

    def clear(self) -> None:
        """/clear: the conversation forgotten (the system message kept), the cache emptied."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.seq.reset()
        self.cached = ""

    def last_user(self) -> str | None:
        """/regen: drop the last reply and return the message it answered (None when there is none)."""
        while self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            return None
        return self.messages.pop()["content"]

    def reply(self, user: str, n_predict: int, sampler: Sampler, timings: Timings, on_text=None,
              stop=()) -> Generation | None:
        """The assistant's reply to `user` (streamed to on_text); None when the context cannot hold the message.
        Ctrl-C stops the reply: what was said so far is kept as the reply, the cache starts over next turn."""
        s, seq, tok = self.session, self.seq, self.tok
        self.messages.append({"role": "user", "content": user})
        full = self.render(self.messages, True)
        if not full.startswith(self.cached):     # the template rewrote history: start the cache over
            seq.reset()
            self.cached = ""
        new_tokens = tok.encode(full[len(self.cached):], add_special=(self.cached == ""), parse_special=True)
        if self.cached and len(new_tokens) > self.room():
            self.messages.pop()
            return None
        check_prompt(new_tokens, self.room() + 4)
        said: list = []
        stream = None
        try:      # the sequence holds every earlier turn: only new_tokens are evaluated, and shown to the sampler
            stream = seq.stream(list(seq.tokens) + new_tokens, max_tokens=max(n_predict, -1), special=False,
                                reverse=stop, timings=timings, sampler=sampler)
            for piece in stream:
                said.append(piece.text)
                if on_text and piece.text:
                    on_text(piece.text)
        except KeyboardInterrupt:
            if stream is not None:
                stream.close()
            self.messages.append({"role": "assistant", "content": "".join(said)})
            seq.reset()
            self.cached = ""
            raise
        gen = stream.generation
        self.messages.append({"role": "assistant", "content": gen.text})
        self.cached = full + gen.text
        if gen.stop_reason in ("length", "reverse") and gen.tokens and s.n_past < s.n_ctx:
            seq.feed(gen.tokens[-1:], timings)     # the last reply token was sampled, not evaluated
        if gen.eog_token is not None and s.n_past < s.n_ctx:
            seq.feed([gen.eog_token], timings)
            self.cached += tok.token_to_piece(gen.eog_token, special=True).decode("utf-8", "replace")
        return gen
