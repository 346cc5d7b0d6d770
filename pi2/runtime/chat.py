"""chat.py — a conversation on one session: each turn rendered with the model's chat template, the KV cache kept
across turns (only the text after what it holds is evaluated), and the turn's end evaluated so the next one
continues from it.

Owns: the template choice (the file's, else ChatML as llama.cpp does), the cached text and when it is dropped (the
template rewrote history), and when the context is full. Does not: read input or print (pi2/cli/commands.py).
"""
from __future__ import annotations

from pi2.model.chat import render_chat, select_template
from pi2.runtime.generate import Generation, Timings, check_prompt, generate, timed_decode
from pi2.runtime.sampling import Sampler


class Chat:
    """Messages so far ([{"role", "content"}]) and the text whose tokens the session's cache holds."""

    def __init__(self, session, system: str | None = None):
        self.session, self.tok = session, session.model.tokenizer
        self.template, self.fallback = select_template(session.model.file.kv)   # fallback: ChatML, no template
        tok = self.tok
        self.bos = tok.token_to_piece(tok.bos_id).decode("utf-8", "replace") if tok.bos_id is not None else ""
        self.eos = tok.token_to_piece(tok.eos_id).decode("utf-8", "replace") if tok.eos_id is not None else ""
        self.messages = [{"role": "system", "content": system}] if system else []
        self.cached = ""

    @property
    def full(self) -> bool:
        """No room for another turn."""
        s = self.session
        return s.n_past + 1 >= s.n_ctx

    def reply(self, user: str, n_predict: int, sampler: Sampler, timings: Timings, on_text=None) -> Generation | None:
        """The assistant's reply to `user` (streamed to on_text); None when the context cannot hold the message."""
        s, tok = self.session, self.tok
        self.messages.append({"role": "user", "content": user})
        full = render_chat(self.template, self.messages, True, self.bos, self.eos)
        if not full.startswith(self.cached):     # the template rewrote history: start the cache over
            s.reset()
            self.cached = ""
        new_tokens = tok.encode(full[len(self.cached):], add_special=(self.cached == ""), parse_special=True)
        if self.cached and len(new_tokens) > s.n_ctx - s.n_past - 4:
            return None
        check_prompt(new_tokens, s.n_ctx - s.n_past)
        gen = generate(s.ctx, tok, new_tokens, n_predict, sampler, timings, on_text=on_text, special=False)
        self.messages.append({"role": "assistant", "content": gen.text})
        self.cached = full + gen.text
        if gen.stop_reason == "length" and gen.tokens and s.n_past < s.n_ctx:
            timed_decode(s.ctx, gen.tokens[-1:], timings)     # the last reply token was sampled, not evaluated
        if gen.eog_token is not None and s.n_past < s.n_ctx:
            timed_decode(s.ctx, [gen.eog_token], timings)
            self.cached += tok.token_to_piece(gen.eog_token, special=True).decode("utf-8", "replace")
        return gen
