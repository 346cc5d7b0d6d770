"""generate.py — the generation loop: prompt evaluation, sampling, stop conditions, streaming, timings.

Works with any context object offering `decode(tokens) -> logits of the last token`, `n_ctx` and
`n_past` (reference.ReferenceContext, the C engine's context). Timings follow llama.cpp's meaning:
every decode of more than one token counts as prompt eval, every single-token decode as eval, and
load time runs from the start of loading to the end of the first decode.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from pi2.errors import UsageError
from pi2.model.tokenizer import StreamDecoder, Tokenizer
from pi2.runtime.sampling import Sampler


@dataclass
class Timings:
    t_start: float = field(default_factory=time.perf_counter)   # when loading began
    load_ms: float = 0.0
    prompt_ms: float = 0.0
    n_prompt: int = 0
    eval_ms: float = 0.0
    n_eval: int = 0
    sample_ms: float = 0.0
    n_sample: int = 0
    first_decode_done: bool = False

    def record_decode(self, n_tokens: int, ms: float) -> None:
        if n_tokens > 1:
            self.prompt_ms += ms
            self.n_prompt += n_tokens
        else:
            self.eval_ms += ms
            self.n_eval += 1
        if not self.first_decode_done:
            self.first_decode_done = True
            self.load_ms = (time.perf_counter() - self.t_start) * 1e3

    def total_ms(self) -> float:
        return (time.perf_counter() - self.t_start) * 1e3

    def as_dict(self) -> dict:
        per = lambda ms, n: (ms / n if n else 0.0, 1e3 * n / ms if ms > 0 else 0.0)  # noqa: E731
        p_ms, p_ts = per(self.prompt_ms, self.n_prompt)
        e_ms, e_ts = per(self.eval_ms, self.n_eval)
        return {"load_ms": self.load_ms, "prompt_ms": self.prompt_ms, "prompt_n": self.n_prompt,
                "prompt_per_token_ms": p_ms, "prompt_per_second": p_ts, "eval_ms": self.eval_ms,
                "eval_n": self.n_eval, "eval_per_token_ms": e_ms, "eval_per_second": e_ts,
                "sample_ms": self.sample_ms, "total_ms": self.total_ms()}

    def report(self, prefix: str = "pi2_perf_print") -> str:
        d = self.as_dict()
        n_total = self.n_prompt + self.n_eval
        return "\n".join([
            f"{prefix}:    sampling time = {self.sample_ms:10.2f} ms / {self.n_sample:5d} runs",
            f"{prefix}:        load time = {self.load_ms:10.2f} ms",
            f"{prefix}: prompt eval time = {self.prompt_ms:10.2f} ms / {self.n_prompt:5d} tokens "
            f"({d['prompt_per_token_ms']:8.2f} ms per token, {d['prompt_per_second']:8.2f} tokens per second)",
            f"{prefix}:        eval time = {self.eval_ms:10.2f} ms / {self.n_eval:5d} runs   "
            f"({d['eval_per_token_ms']:8.2f} ms per token, {d['eval_per_second']:8.2f} tokens per second)",
            f"{prefix}:       total time = {d['total_ms']:10.2f} ms / {n_total:5d} tokens",
        ])


def timed_decode(ctx, tokens, timings: Timings):
    t0 = time.perf_counter()
    logits = ctx.decode(tokens)
    timings.record_decode(len(tokens), (time.perf_counter() - t0) * 1e3)
    return logits


@dataclass
class Generation:
    prompt_tokens: list
    tokens: list = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""     # "eog" | "length" | "context"
    eog_token: int | None = None   # the end-of-generation token that stopped it (sampled, not evaluated)


def check_prompt(prompt_tokens: list, n_ctx: int) -> None:
    if not prompt_tokens:
        raise UsageError("the prompt is empty", hint="pass text with -p or -f")
    if n_ctx - 4 < 1:
        raise UsageError(f"no room for a prompt: {n_ctx} tokens of context left", hint="raise -c")
    if len(prompt_tokens) > n_ctx - 4:
        raise UsageError(f"prompt is too long ({len(prompt_tokens)} tokens, max {n_ctx - 4})",
                         hint="raise -c or shorten the prompt")


def generate(ctx, tok: Tokenizer, prompt_tokens: list, n_predict: int, sampler: Sampler,
             timings: Timings, ignore_eos: bool = False, on_text=None, special: bool = True,
             stop=()) -> Generation:
    """Evaluate the prompt (continuing ctx's cache) and generate up to n_predict tokens (-1: until an
    end-of-generation token or a full context), or until the text ends with one of `stop` (-r, llama.cpp's
    reverse prompts; stop_reason "reverse"). `on_text(str)` receives text as it completes."""
    gen = Generation(list(prompt_tokens))
    for _token, piece in generate_steps(ctx, tok, gen, n_predict, sampler, timings, ignore_eos, special, stop=stop):
        if on_text and piece:
            on_text(piece)
    return gen


def generate_steps(ctx, tok: Tokenizer, gen: Generation, n_predict: int, sampler: Sampler, timings: Timings,
                   ignore_eos: bool = False, special: bool = True, n_cached: int = 0, stop=(), n_seen: int = 0):
    """generate() one token at a time: yields (token, text it completes) per generated token, then
    (None, the decoder's rest) once; fills `gen`. n_cached: the prompt's first tokens the context's cache already
    holds (ctx.n_past == n_cached < len(prompt)); the sampler still sees the whole prompt but its first n_seen
    tokens (a sampler kept across turns has seen them). The caller may stop
    iterating at any yield (gen then says what was generated so far), or send (logits, ms) of the token just yielded,
    decoded by the caller (pi2.engine.decode_multi: several sequences in one step), instead of next()."""
    stream = StreamDecoder(tok, special=special)
    for t in gen.prompt_tokens[n_seen:]:
        sampler.accept(t)
    logits = timed_decode(ctx, gen.prompt_tokens[n_cached:], timings)
    while True:
        if n_predict >= 0 and len(gen.tokens) >= n_predict:
            gen.stop_reason = "length"
            break
        t0 = time.perf_counter()
        token = sampler.sample(logits)
        sampler.accept(token)
        timings.sample_ms += (time.perf_counter() - t0) * 1e3
        timings.n_sample += 1
        if tok.is_eog(token) and not ignore_eos:
            gen.stop_reason, gen.eog_token = "eog", token
            break
        gen.tokens.append(token)
        piece = stream.push(token)
        gen.text += piece
        done = yield token, piece         # (logits, ms): the caller decoded `token` already (batched with others)
        if stop and piece and any(gen.text[-len(r) - len(piece):].find(r) >= 0 for r in stop if r):
            gen.stop_reason = "reverse"
            break
        if n_predict >= 0 and len(gen.tokens) >= n_predict:
            gen.stop_reason = "length"
            break
        if ctx.n_past + 1 >= ctx.n_ctx and not getattr(ctx, "ctx_shift", False):
            gen.stop_reason = "context"     # llama-completion without --context-shift: stop when n_past + 1 >= n_ctx
            break
        if done is None:
            logits = timed_decode(ctx, [token], timings)
        else:
            logits = done[0]
            timings.record_decode(1, done[1])
    rest = stream.flush()
    gen.text += rest
    yield None, rest
