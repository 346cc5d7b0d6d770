"""run_chat.py — the library functions behind `pi2 run`: one prompt in and text out (run), llama-completion's
interactive mode (-i, -if) and the chat (-cnv, -st), with their options (RunOptions). They open the model through
the Python API and decide what is printed where: generated text on stdout (or one JSON object), diagnostics, notes
and timings on stderr.
Does not: parse flags (pi2/cli/app.py) or generate (pi2/api.py, pi2/runtime/).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pi2.api import Model
from pi2.cli.report import verbose_report
from pi2.errors import UsageError
from pi2.runtime.chat import Chat
from pi2.runtime.config import RunConfig, SamplerParams
from pi2.runtime.generate import Timings, check_prompt
from pi2.runtime.sampling import Sampler
from pi2.runtime.session import keep_routing


MIN_CTX = 8      # run and chat: a prompt of a token, the 4 tokens generate keeps free, and a reply


@dataclass(frozen=True)
class RunOptions:
    """`pi2 run`: the model and prompt, how it runs (RunConfig) and samples, and what is printed."""
    model: Path
    prompt: Optional[str]
    run: RunConfig = field(default_factory=RunConfig)
    sampling: SamplerParams = field(default_factory=SamplerParams)
    n_predict: int = -1
    ignore_eos: bool = False
    display_prompt: bool = True
    json_out: bool = False
    verbose: bool = False           # --verbose: also why NNAPI was not used, and the neuron cache's figures
    system: Optional[str] = None    # -sys: the chat's system message
    reverse: tuple = ()             # -r: stop a reply when one of these texts appears
    single_turn: bool = False       # -st: answer -p once, then exit
    chat_template: Optional[str] = None   # --chat-template / --chat-template-file: a built-in name or Jinja text
    special: bool = False           # -sp: print special tokens' text
    mlock: bool = False             # --mlock: lock the model's pages in memory
    interactive_first: bool = False  # -if: read the user's input before generating


def _check(opts: RunOptions) -> None:
    if opts.n_predict < -2:     # llama.cpp runs forever on -n -5; -2 is its 'until the context is full'
        raise UsageError(f"invalid -n {opts.n_predict}", hint="-n -1 generates until end of generation or a full context")
    if 0 < opts.run.n_ctx < MIN_CTX:
        raise UsageError(f"context size -c {opts.run.n_ctx} is too small (at least {MIN_CTX}: the prompt, a few "
                         "tokens of margin and the reply must fit)")


def _open(opts: RunOptions) -> tuple:
    """The model through the Python API and its default sequence, -c checked and --mlock applied, and the timings
    (begun before loading: the load time runs to the end of the first decode)."""
    _check(opts)
    timings = Timings()
    model = Model(opts.model, opts.run, opts.sampling)
    seq = model.default_sequence
    _mlock(opts, seq.session)
    return model, seq, timings


def _open_api(opts: RunOptions):
    """-i and -cnv: _open's, and one sampler for the whole session (as llama.cpp keeps one: its random state and
    penalty window run on across turns)."""
    model, seq, timings = _open(opts)
    sampler = Sampler(opts.sampling, model.n_vocab, seq.n_ctx, tokenizer=model.tokenizer)
    return model, seq, sampler, timings


def _mlock(opts: RunOptions, session) -> None:
    if opts.mlock:
        if session.cache is not None:
            print("pi2: note: --mlock not applied: the FFN streams within --memory-budget", file=sys.stderr)
        else:
            why = session.model.file.lock()
            if why:
                print(f"pi2: warning: {why}", file=sys.stderr)


def _write(text: str) -> None:
    """Text to stdout as it comes. A prompt may hold bytes that are not UTF-8 (-f, or \\xHH escapes, kept as
    surrogates): they go out as the raw bytes, as llama.cpp writes them, whatever stdout's encoding."""
    out = sys.stdout
    try:
        out.write(text)
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape")
        buf = getattr(out, "buffer", None)
        if buf is None:
            out.write(raw.decode("utf-8", "replace"))
        else:
            out.flush()
            buf.write(raw)
    out.flush()


def run(opts: RunOptions) -> None:
    """One prompt in, tokens out, through the Python API (pi2.api): text streams to stdout, timings to stderr (or
    one JSON object)."""
    if opts.prompt is None:
        raise UsageError("no prompt given", hint="pass -p TEXT or -f FILE (or -cnv to chat)")
    model, seq, timings = _open(opts)
    prompt_tokens = model.tokenize(opts.prompt)
    check_prompt(prompt_tokens, seq.n_ctx)
    try:                            # from the prompt's echo on: a signal once output began prints the timings
        if not opts.json_out and opts.display_prompt:
            _write(opts.prompt)
        stream = seq.stream(prompt_tokens, max_tokens=max(opts.n_predict, -1), ignore_eos=opts.ignore_eos,
                            special=opts.special, reverse=opts.reverse, timings=timings)
        for piece in stream:
            if piece.text and not opts.json_out:
                _write(piece.text)
    except KeyboardInterrupt:       # as llama-completion: the timings so far, then exit 130 (pi2/cli/main.py)
        if not opts.json_out:
            print("\n" + timings.report(), file=sys.stderr)
        raise
    finally:
        keep_routing(seq.session)   # a run that streamed experts leaves its routing for the next one
        model.close()               # the context goes when run() returns, not at the next garbage collection
    c = stream.completion
    if opts.json_out:
        print(json.dumps({"prompt_tokens": c.prompt_tokens, "tokens": c.tokens, "text": c.text,
                          "stop_reason": c.stop_reason, "seed": c.seed, "timings": timings.as_dict()},
                         ensure_ascii=False))
    else:
        _write("\n")
        print(timings.report(), file=sys.stderr)
    if opts.verbose:
        verbose_report(seq.session)


def interactive(opts: RunOptions) -> None:
    """llama-completion's interactive mode (-i, -if): the prompt, then text until an end-of-generation token, -n
    tokens or a reverse prompt (-r); then each line typed is appended as text (no template) and generation goes
    on from it. Ctrl-C during generation returns control; at the prompt, or EOF, it quits."""
    if opts.json_out:
        raise UsageError("--json is not available with -i")
    model, seq, sampler, timings = _open_api(opts)
    session, tok = seq.session, model.tokenizer
    pending = tok.encode(opts.prompt, add_special=None, parse_special=True) if opts.prompt else []
    if pending:
        check_prompt(pending, session.n_ctx)
    if opts.display_prompt and opts.prompt:
        _write(opts.prompt)
    if _interactive():
        print("pi2: interactive mode. Ctrl-C returns control to you; Ctrl-C at the prompt, Ctrl-D or /exit quits.",
              file=sys.stderr)
    wait = opts.interactive_first
    while True:
        if wait:
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                break
            if not line or line.rstrip("\n") in ("/exit", "/quit"):
                break
            first = session.n_past == 0 and not pending          # -if without -p: BOS first, as llama.cpp
            pending = pending + tok.encode(line, add_special=None if first else False, parse_special=True)
        wait = True
        if not pending:
            continue
        if len(pending) > session.n_ctx - session.n_past - 4:
            print("pi2: the context is full; ending", file=sys.stderr)
            break
        stream = None
        try:        # the sequence holds what came before: only `pending` is evaluated, and shown to the sampler
            stream = seq.stream(list(seq.tokens) + pending, max_tokens=max(opts.n_predict, -1), sampler=sampler,
                                ignore_eos=opts.ignore_eos, special=opts.special, reverse=opts.reverse, timings=timings)
            for piece in stream:
                if piece.text:
                    _write(piece.text)
        except KeyboardInterrupt:       # control back to the user; the cache is as before the interrupted decode
            if stream is not None:
                stream.close()
            _write("\n")
            pending = []
            continue
        gen = stream.generation
        pending = gen.tokens[-1:] if gen.stop_reason in ("length", "reverse") and gen.tokens else []
        if gen.stop_reason == "context":
            print("\npi2: the context is full; ending", file=sys.stderr)
            break
    keep_routing(session)
    _write("\n")
    print(timings.report(), file=sys.stderr)
    model.close()


CHAT_HELP = ("pi2: chatting. Ctrl-C stops a reply; Ctrl-C at the prompt, Ctrl-D or /exit quits.\n"
             "  /clear  forget the conversation (the system message stays)\n"
             "  /regen  answer the last message again")


def _interactive() -> bool:
    """A person at a terminal (the banner and the '> ' prompt), not piped input."""
    return sys.stdin.isatty()


def chat(opts: RunOptions) -> None:
    """Interactive chat (-cnv, -st): -sys is the system message, -p the first user message; each user line is
    rendered with the chat template. Ctrl-C stops a reply and returns to the prompt; at the prompt it quits."""
    if opts.json_out:
        raise UsageError("--json is not available with -cnv", hint="use pi2 run -p TEXT --json")
    model, seq, sampler, timings = _open_api(opts)
    session = seq.session
    conv = Chat(seq, opts.system, opts.chat_template)
    if conv.fallback:    # llama.cpp's behaviour: warn, then use ChatML
        print("pi2: warning: the model has no chat template (tokenizer.chat_template) and none is implied by its "
              "vocabulary; using ChatML (choose one with --chat-template)", file=sys.stderr)
    interactive = _interactive()
    if interactive or opts.verbose:
        print(f"pi2: chat template: {conv.template_name}", file=sys.stderr)
    if interactive and not opts.single_turn:
        print(CHAT_HELP, file=sys.stderr)
    first = opts.prompt
    while True:
        if first is not None:
            user, first = first, None
        else:
            if opts.single_turn and conv.messages and conv.messages[-1]["role"] == "assistant":
                break
            if interactive:
                print("\n> ", end="", file=sys.stderr, flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:       # Ctrl-C at the prompt quits
                print("", file=sys.stderr)
                break
            if not line:
                break
            user = line.rstrip("\n")
        if user in ("/exit", "/quit"):
            break
        if user == "/clear":
            conv.clear()
            print("pi2: conversation cleared", file=sys.stderr)
            continue
        if user == "/regen":
            user = conv.last_user()
            if user is None:
                print("pi2: nothing to answer again", file=sys.stderr)
                continue
        if not user.strip():
            continue
        try:
            gen = conv.reply(user, opts.n_predict, sampler, timings, on_text=_write, stop=opts.reverse)
        except KeyboardInterrupt:           # Ctrl-C during a reply stops it and returns to the prompt
            _write("\n")
            print("pi2: reply stopped", file=sys.stderr)
            if opts.single_turn:
                break
            continue
        if gen is not None:
            _write("\n")
        if gen is None or gen.stop_reason == "context" or conv.full:
            print("pi2: the context is full; ending the chat", file=sys.stderr)
            break
    keep_routing(session)
    print(timings.report(), file=sys.stderr)
    if opts.verbose:
        verbose_report(session)
    model.close()
