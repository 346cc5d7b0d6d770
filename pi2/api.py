"""api.py — pi2's Python API: `pi2.load(path, **options)` opens a model once; the Model it returns generates (a
stream of pieces with their token ids, or one Completion), chats with the model's chat template, tokenizes and
detokenizes. `pi2 serve` (pi2/serve/) is built on it.

Owns: the options of load() and generate() as keywords (RunConfig's and SamplerParams' field names, and the
OpenAI-style aliases temperature / max_tokens), sequences (a context with its prompt cache: each prompt reuses the
longest token prefix it shares with what the context holds, one generation at a time), and chat messages' checks.
Does not: plan, decode or sample (pi2/runtime/: plan_run, open_session, generate_steps, Sampler), or hand out what a
generation yields: Stream, Piece, Completion, stop strings and usage counts are in pi2/api_stream.py (its names are
imported here too, so pi2.api.Stream and pi2.Stream still name them).
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import List, Optional, Sequence as Seq, Union

from pi2.api_stream import Completion, Piece, StopFilter, Stream  # noqa: F401 — Piece: pi2.Piece, from here
from pi2.errors import ContextFullError, UsageError
from pi2.model.chat import render_chat, select_template
from pi2.runtime.config import RunConfig, SamplerParams
from pi2.runtime.generate import Generation, Timings, generate_steps, timed_decode
from pi2.runtime.kept_tokens import KeptTokens, common_prefix
from pi2.runtime.plan import plan_run
from pi2.runtime.sampling import Sampler
from pi2.runtime.session import open_model, open_session

_RUN_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
_SAMPLE_FIELDS = {f.name: f for f in dataclasses.fields(SamplerParams)}
SAMPLER_ALIASES = {"temperature": "temp", "repetition_penalty": "repeat_penalty"}   # OpenAI / HF spellings
_LOAD_ALIASES = {"ctx_size": "n_ctx", "threads": "n_threads"}                       # pi2 run's flag names


def sampler_params(base: SamplerParams, **kw) -> SamplerParams:
    """`base` with the given SamplerParams fields (or their aliases) replaced; every value checked for its type.
    New fields of SamplerParams are accepted as they appear."""
    changes = {}
    for key, value in kw.items():
        name = SAMPLER_ALIASES.get(key, key)
        f = _SAMPLE_FIELDS.get(name)
        if f is None:
            raise UsageError(f"unknown sampling option {key!r}")
        if value is None:
            continue
        default = getattr(base, name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        else:
            ok = True
        if not ok:
            raise UsageError(f"{key} must be a {type(default).__name__}, not {type(value).__name__}")
        changes[name] = value
    return dataclasses.replace(base, **changes)


class Sequence:
    """A context of the model with its prompt cache: `tokens` are those its KV cache holds. One generation at a
    time (a second one raises UsageError until the first is exhausted or closed)."""

    def __init__(self, model: "Model"):
        self.model = model
        self.session = open_session(model.model, model.plan)
        self.kept = KeptTokens(self.session.ctx)    # what the cache holds, through context shifts (ctx_shift=True)
        self._busy = threading.Lock()

    @property
    def tokens(self) -> List[int]:
        """The tokens evaluated since the cache was emptied (after a context shift, the dropped ones too)."""
        return self.kept.history

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    @property
    def batchable(self) -> bool:
        """Whether its decodes may join others in one step (pi2.engine.decode_multi): the C engine's dense FFN,
        not streamed, no NNAPI hot prefix, and ffn_down stored as a matrix."""
        s = self.session
        return (s.engine == "c" and s.cache is None and s.plan.rule.rule == "dense" and s.npu.state != "nnapi"
                and not s.model.config.ffn_down_t and not s.model.config.pi2 and not s.plan.cfg.ctx_shift)

    def _sync(self, gen) -> None:
        self.kept.synced(list(gen.prompt_tokens) + list(gen.tokens))

    def reset(self) -> None:
        """Empty the context (its KV cache and prompt cache)."""
        if not self._busy.acquire(blocking=False):
            raise UsageError("this sequence is generating")
        try:
            self.kept.reset()
        finally:
            self._busy.release()

    def feed(self, tokens: Seq[int], timings: Optional[Timings] = None) -> None:
        """Evaluate `tokens` after what the context holds, without sampling (a token that was sampled but not
        evaluated, before the next turn)."""
        if not self._busy.acquire(blocking=False):
            raise UsageError("this sequence is generating")
        try:
            toks = [int(t) for t in tokens]
            timed_decode(self.kept, toks, timings or Timings())
        finally:
            self._busy.release()

    def common_prefix(self, tokens: Seq[int]) -> int:
        return common_prefix(self.tokens, tokens)

    def stream(self, prompt_tokens: Seq[int], *, max_tokens: int = -1, sampling: SamplerParams | None = None,
               stop: Seq[str] = (), ignore_eos: bool = False, special: bool = False, reverse: Seq[str] = (),
               timings: Optional[Timings] = None, sampler: Optional[Sampler] = None) -> Stream:
        """Generate after `prompt_tokens`, evaluating only what follows their longest prefix already cached.
        stop: strings that end the text before them (OpenAI's stop); reverse: strings that end it after them
        (llama.cpp's reverse prompts, -r). timings: the Timings to fill (one begun when loading began counts the
        load time as pi2 run reports it; default: a new one). sampler: one kept across calls (pi2 run -i / -cnv,
        as llama.cpp keeps one sampler for a session) instead of a new one from `sampling`; it has seen the tokens
        the cache holds, so it is shown only the rest of the prompt."""
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise UsageError("the prompt is empty")
        n_vocab = self.model.n_vocab
        if any(not 0 <= t < n_vocab for t in prompt):
            raise UsageError(f"token ids must be in [0, {n_vocab})")
        n_keep = self.kept.reusable(prompt)     # after a context shift, a conversation extended goes on from it
        if not self.kept.fits(n_keep, len(prompt) - n_keep):
            if self.kept.positions(n_keep) != n_keep:     # it would go on from a shifted cache
                msg = f"the new tokens ({len(prompt) - n_keep}) do not fit in the context even after a shift"
            else:
                msg = f"the prompt is too long ({len(prompt)} tokens, the context holds {self.n_ctx - 4})"
            raise ContextFullError(msg, hint="raise -c or shorten the prompt")
        if max_tokens < -1:
            raise UsageError(f"invalid max_tokens {max_tokens}")
        own_sampler = sampler is not None      # kept across calls: it has seen the cached tokens
        if not own_sampler:
            sampler = Sampler(sampling or self.model.sampling, n_vocab, self.n_ctx, tokenizer=self.model.tokenizer)
        if not self._busy.acquire(blocking=False):
            raise UsageError("this sequence is already generating")
        try:
            self.kept.keep(n_keep)      # at least one token is evaluated: it gives the logits
        except BaseException:
            self._busy.release()
            raise
        gen, timings = Generation(prompt), timings or Timings()
        steps = generate_steps(self.kept, self.model.tokenizer, gen, max_tokens, sampler, timings, ignore_eos,
                               special, n_cached=n_keep, stop=tuple(reverse), n_seen=n_keep if own_sampler else 0)
        return Stream(self, steps, gen, sampler, timings, StopFilter(list(stop)), n_keep)


Messages = List[dict]


class Model:
    """A model opened by load(): its plan (RunConfig), default sampling (SamplerParams), tokenizer and chat
    template; generate() and chat() run on one default Sequence (more with sequence())."""

    def __init__(self, path: Union[str, os.PathLike], run: RunConfig, sampling: SamplerParams,
                 chat_template: Optional[str] = None):
        self.path = os.fspath(path)
        self.model = open_model(self.path)
        self.run, self.sampling = run, sampling
        self.plan = plan_run(self.model, run)
        self.tokenizer = self.model.tokenizer
        self.template, self.template_fallback = select_template(self.model.file.kv, chat_template)
        tok = self.tokenizer
        piece = lambda i: tok.token_to_piece(i).decode("utf-8", "replace") if i is not None else ""  # noqa: E731
        self._bos, self._eos = piece(tok.bos_id), piece(tok.eos_id)
        self._default: Optional[Sequence] = None

    @property
    def n_ctx(self) -> int:
        return self.plan.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.model.config.n_vocab

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def sequence(self) -> Sequence:
        """A new context on this model (its own KV cache and prompt cache)."""
        return Sequence(self)

    def close(self) -> None:
        """Let go of the default sequence now (the model and it refer to each other, so without close() its context
        and the C model's repacked copies wait for the garbage collector)."""
        self._default = None

    @property
    def default_sequence(self) -> Sequence:
        if self._default is None:
            self._default = Sequence(self)
        return self._default

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]:
        """Token ids of `text`; add_special adds BOS/EOS as the model asks."""
        return self.tokenizer.encode(text, add_special=None if add_special else False, parse_special=parse_special)

    def detokenize(self, tokens: Seq[int], special: bool = True) -> str:
        """The text of `tokens` (special tokens rendered unless special=False)."""
        n = self.n_vocab
        if any(not 0 <= int(t) < n for t in tokens):
            raise UsageError(f"token ids must be in [0, {n})")
        return self.tokenizer.decode([int(t) for t in tokens], remove_special=not special).decode("utf-8", "replace")

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        return render_chat(self.template, list(messages), add_generation_prompt, self._bos, self._eos)

    def chat_tokens(self, messages: Messages) -> List[int]:
        """The prompt of a chat: the messages rendered with the chat template, then tokenized (as pi2 run -cnv)."""
        return self.tokenizer.encode(self.apply_chat_template(messages), add_special=True, parse_special=True)

    def generate(self, prompt: Union[str, Seq[int]], *, max_tokens: int = -1, stream: bool = False,
                 stop: Union[str, Seq[str], None] = None, ignore_eos: bool = False, special: bool = False,
                 sequence: Optional[Sequence] = None, **sampling) -> Union[Completion, Stream]:
        """Generate after `prompt` (text, tokenized as pi2 run does, or token ids). stream=True returns a Stream
        of Pieces, else the Completion. Sampling options are SamplerParams' fields (temp, top_k, top_p, min_p,
        repeat_penalty, seed, ...) or temperature; the defaults are load()'s."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self._run(tokens, max_tokens, stream, stop, ignore_eos, special, sequence, sampling)

    def chat(self, messages: Messages, *, max_tokens: int = -1, stream: bool = False,
             stop: Union[str, Seq[str], None] = None, sequence: Optional[Sequence] = None,
             **sampling) -> Union[Completion, Stream]:
        """The assistant's reply to `messages` ([{"role": "system"|"user"|"assistant", "content": str}]), with
        the model's chat template. A later call with the conversation extended evaluates only the new tokens."""
        return self._run(self.chat_tokens(check_messages(messages)), max_tokens, stream, stop, False, False,
                         sequence, sampling)

    def _run(self, tokens, max_tokens, stream, stop, ignore_eos, special, sequence, sampling):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        params = sampler_params(self.sampling, **sampling)
        s = (sequence or self.default_sequence).stream(tokens, max_tokens=max_tokens, sampling=params, stop=stops,
                                                       ignore_eos=ignore_eos, special=special)
        return s if stream else s.result()


def check_messages(messages) -> Messages:
    """Chat messages as the template expects them; UsageError for anything else."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise UsageError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise UsageError(f"messages[{i}] must be an object with a role")
        content = m.get("content")
        if isinstance(content, list):    # OpenAI's content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise UsageError(f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise UsageError(f"messages[{i}].content must be a string")
        out.append({**m, "content": content})
    return out


def load(path: Union[str, os.PathLike], *, chat_template: Optional[str] = None, **options) -> Model:
    """Open a model for generation. options: RunConfig's fields (n_ctx, n_threads, engine, keep, dense,
    predictor, memory_budget, io, npu, ...; ctx_size and threads as pi2 run spells them) and the default sampling
    (SamplerParams' fields: temp, top_k, top_p, min_p, repeat_penalty, seed, ...). chat_template: a Jinja
    template (or "chatml") instead of the model's own."""
    run, samp = {}, {}
    for key, value in options.items():
        name = _LOAD_ALIASES.get(key, key)
        if name in _RUN_FIELDS:
            run[name] = value
        elif SAMPLER_ALIASES.get(name, name) in _SAMPLE_FIELDS:
            samp[name] = value
        else:
            raise UsageError(f"unknown option {key!r} for pi2.load")
    if not os.path.exists(path):
        raise UsageError(f"no such model file: {os.fspath(path)}")
    return Model(path, RunConfig(**run), sampler_params(SamplerParams(), **samp), chat_template)
