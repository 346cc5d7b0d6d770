"""commands.py — the library functions behind each CLI command: they open what the command needs through the
runtime and decide what is printed where: generated text on stdout (or one JSON object), diagnostics, notes and
timings on stderr; `plan`, `tokenize`, `info`, `devices`, `profile-io` and `bench` print their results on stdout.
Over 400 lines: run, interactive and chat share RunOptions and _open_api; those three moving to a module of their
own is the next split.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from pi2 import convert as cv
from pi2.api import Model
from pi2.convert.predictor import Spec
from pi2.engine import expert_clusters
from pi2.errors import FileError, UsageError
from pi2.model.info import describe
from pi2.model.loader import load_model
from pi2.plan.experts import profile_experts as run_profile
from pi2.plan import devices as dv
from pi2.plan import profile
from pi2.runtime import bench as rb
from pi2.runtime.bench import peak_rss
from pi2.runtime.chat import Chat
from pi2.runtime.config import RunConfig, SamplerParams
from pi2.runtime.generate import Timings, check_prompt
from pi2.runtime.perplexity import format_final, perplexity as ppl
from pi2.runtime.plan import plan_run
from pi2.runtime.sampling import Sampler
from pi2.runtime.session import keep_routing, open_model, open_session


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


def _open_api(opts: RunOptions):
    """-i and -cnv: the model through the Python API, its default sequence, and one sampler for the whole session
    (as llama.cpp keeps one: its random state and penalty window run on across turns)."""
    _check(opts)
    timings = Timings()     # begun before loading: the load time runs to the end of the first decode
    model = Model(opts.model, opts.run, opts.sampling)
    seq = model.default_sequence
    _mlock(opts, seq.session)
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
    _check(opts)
    timings = Timings()     # begun before loading: the load time runs to the end of the first decode
    model = Model(opts.model, opts.run, opts.sampling)
    seq = model.default_sequence
    _mlock(opts, seq.session)
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


def verbose_report(session) -> None:
    """--verbose: why NNAPI was not used, and a streamed run's neuron cache (its plan and figures, the peak RSS)."""
    for line in session.notes():
        print(f"pi2: npu: {line}", file=sys.stderr)
    share = session.ctx.expert_neurons_active() if hasattr(session.ctx, "expert_neurons_active") else None
    if share is not None:   # ReLU experts: the up rows of closed gates were skipped
        print(f"pi2: experts: {share:.1%} of the routed experts' neurons active per token (up rows of the others "
              f"skipped)", file=sys.stderr)
    cl = expert_clusters.stats(session.ctx) if hasattr(session.ctx, "cmodel") else {}
    if cl:   # a converted MoE file: what streaming only the open clusters would read
        print(f"pi2: experts: {cl['expert_open_clusters']:.1%} of the bundle clusters open per routed row: gate rows "
              f"+ open clusters {cl['expert_bytes_per_token_open_clusters'] / 2**20:.2f} MiB per token, whole experts "
              f"{cl['expert_bytes_per_token_whole'] / 2**20:.2f} MiB", file=sys.stderr)
    plan = session.cache
    if plan is None:
        return
    st = session.ctx.stream_stats()
    if getattr(plan, "kind", "") == "experts":   # a MoE file's expert cache
        slots = (f"{plan.cap / 2**20:.0f} MiB of LRU slots sized to what is read ({plan.n_slots} slots, holding "
                 f"{st['expert_held_bytes'] / 2**20:.0f} MiB now" if plan.cap else
                 f"{plan.n_slots} x {plan.slot_bytes // 1024} KiB LRU slots (")
        print(f"pi2: experts: budget {plan.budget / 2**20:.0f} MiB, {plan.n_hot} hot ({st['hot_bytes'] / 2**20:.1f} "
              f"MiB), {slots}; {st['experts_learned']} of them pinned for hot experts learned while running), "
              f"io {plan.io}", file=sys.stderr)
        print(f"pi2: experts: {st['experts_loaded_per_token']:.2f} per token and layer, hit rate "
              f"{st['expert_hit_rate']:.1%} (cold {st['cold_hit_rate']:.1%}; partial "
              f"{st['expert_partial_hit_rate']:.1%}: "
              f"found, clusters read; clusters found {st['cluster_hit_rate']:.1%}), flash "
              f"{st['flash_bytes_per_token'] / 2**20:.2f} MiB/token, read {st['read_mbps']:.0f} MB/s, I/O wait "
              f"{st['io_wait_share']:.1%} of decode, peak RSS {peak_rss() / 2**20:.0f} MiB"
              + (f", routing ahead {st['expert_ahead_hit_rate']:.1%} right" if plan.ahead else ""), file=sys.stderr)
        return
    print(f"pi2: cache: budget {plan.budget / 2**20:.0f} MiB, hot {st['hot_bytes'] / 2**20:.1f} MiB, "
          f"cold {plan.n_slots} x {plan.slot_bytes // 1024} KiB slots, cluster {plan.cluster}, io {plan.io}",
          file=sys.stderr)
    print(f"pi2: cache: hit rate {st['cache_hit_rate']:.1%} (cold {st['cold_hit_rate']:.1%}), "
          f"flash {st['flash_bytes_per_token'] / 2**20:.2f} MiB/token, read {st['read_mbps']:.0f} MB/s, "
          f"I/O wait {st['io_wait_share']:.1%} of decode, peak RSS {peak_rss() / 2**20:.0f} MiB", file=sys.stderr)
    cs = session.ctx.cache_stats()   # since the run began
    whole = cs["layer_loads"] + cs["gate_layer_loads"]
    if whole:
        print(f"pi2: cache: {whole} layer regions read whole (prompt batches{', gate rows' if plan.gate_whole else ''})"
              f", {cs['layer_loads_ahead'] / whole:.0%} of them submitted before their FFN", file=sys.stderr)
    if plan.gate_whole:   # below the floor with mapped gate rows: every layer's gate rows read whole per token
        print(f"pi2: cache: gate rows read whole each token, {plan.n_gate_slots} x {plan.gate_slot_bytes // 1024} "
              f"KiB slots, flash {st['gate_flash_bytes_per_token'] / 2**20:.2f} MiB/token (of the above)",
              file=sys.stderr)
    elif "gate_hit_rate" in st:   # two-phase loading: the gate rows' share of the figures above
        print(f"pi2: cache: gate rows hot {st['gate_hot_bytes'] / 2**20:.1f} MiB, {plan.n_gate_slots} x "
              f"{plan.gate_slot_bytes // 1024} KiB slots, hit rate {st['gate_hit_rate']:.1%}, flash "
              f"{st['gate_flash_bytes_per_token'] / 2**20:.2f} MiB/token (of the above)", file=sys.stderr)


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


def plan(model_path: Path, cfg: RunConfig, json_out: bool) -> None:
    """pi2 plan: the plan `pi2 run` makes with the same flags (pi2/runtime/plan.py) for a pi2 file in a memory
    budget: the budget's split (pi2/plan/budget.py) and whether the NPU computes the hot prefix
    (pi2/plan/npu_plan.py), on stdout."""
    p = plan_run(open_model(model_path), cfg)
    if p.cache is None:
        raise UsageError(p.stream_gap or "--memory-budget needs the C engine")
    dec = p.npu.decision
    if json_out:
        print(json.dumps({**p.cache.as_dict(), **({"npu": dec.as_dict()} if dec is not None else {})}))
    else:
        print("\n".join(p.cache.lines() + (dec.lines() if dec is not None else [])))


def tokenize(model_path: Path, text: str, ids_only: bool, add_special: bool, parse_special: bool,
             show_count: bool) -> None:
    model = load_model(model_path)
    tok = model.tokenizer
    ids = tok.encode(text, add_special=None if add_special else False, parse_special=parse_special)
    if ids_only:
        print("[" + ", ".join(str(i) for i in ids) + "]")
    else:
        for i in ids:
            piece = tok.token_to_piece(i, special=True).decode("utf-8", "replace")
            print(f"{i:6d} -> '{piece}'")
    if show_count:
        print(f"Total number of tokens: {len(ids)}")


def info(model_path: Path, list_tensors: bool = False) -> None:
    describe(model_path, list_tensors)


def perplexity(model_path: Path, file: Path, cfg: RunConfig, n_chunks: int, verbose: bool = False) -> None:
    """llama-perplexity: progress on stderr, the `Final estimate` line once, on stdout."""
    try:
        text = file.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as e:
        raise FileError(f"cannot read {file}: {e.strerror}") from None
    session = open_session(open_model(model_path), cfg)
    tok = session.model.tokenizer
    t0 = time.perf_counter()
    tokens = tok.encode(text, add_special=None, parse_special=False)
    # held back until the checks in ppl() pass, so a bad input still gets a one-line error
    pending = ["perplexity: tokenizing the input ..\n",
               f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms\n"]

    def progress(s: str) -> None:
        out = "".join(pending) + ("" if s.startswith("Final estimate") else s)
        pending.clear()
        print(out, end="", file=sys.stderr, flush=True)

    scored = getattr(session.ctx, "decode_from", None)     # an engine that computes only the rows scored

    def eval_chunk(chunk):
        if scored is not None:
            session.reset()
            return scored(chunk, len(chunk) // 2)
        session.reset()
        return session.ctx.decode(chunk, all_logits=True)

    # -c 0 means the model's training context, as in llama-perplexity
    result = ppl(eval_chunk, tokens, session.n_ctx, n_chunks=n_chunks, bos_id=tok.bos_id, add_bos=tok.add_bos,
                 progress=progress)
    print(format_final(result))
    if verbose:
        verbose_report(session)


def bench(models: list, n_prompt, n_gen, pg, batch, threads, reps: int, output: str, engine: str, *, warmup: bool,
          progress: bool, run: RunConfig, **lists) -> None:
    """pi2 bench: llama-bench's table (or JSON, CSV) on stdout as each test finishes, progress on stderr."""
    rb.run(rb.make_params(models, n_prompt, n_gen, pg, batch, threads, reps, output, engine, warmup=warmup,
                          progress=progress, run=run, **lists))


def convert(src: Path, out: Optional[Path], *, pred: Optional[tuple], **kw) -> None:
    """pi2 convert: the pi2 file written, and a summary of what was measured on stdout (progress bars on stderr).
    pred: (kind, input, bits, rank, recall) of --predictor."""
    print(cv.summary(cv.convert(src, out, pred=None if pred is None else Spec(*pred), **kw)))


def devices(model: Optional[Path], nnapi_lib: Optional[str], json_out: bool) -> None:
    dv.show(model, nnapi_lib, json_out)


def profile_experts(model_path: Path, calib, n_tokens: int, threads: int) -> None:
    """pi2 profile-experts: the rows routed to each expert on the calibration text, saved for the planner."""
    model = open_model(model_path)
    path, n_tok, counts = run_profile(model, calib, n_tokens, threads)
    rows = counts.sum(axis=1, keepdims=True)
    share = np.sort(counts / np.maximum(rows, 1), axis=1)[:, ::-1]
    k4 = max(1, counts.shape[1] // 4)
    print(f"{n_tok} tokens routed; the most used quarter of each layer's experts took "
          f"{share[rows[:, 0] > 0, :k4].sum(axis=1).mean():.1%} of its rows (uniform: 25.0%)")
    print(f"saved {path}")


def profile_io(model: Path, **kw) -> None:
    profile.show(model, **kw)
