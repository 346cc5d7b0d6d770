"""commands.py — the library functions behind each CLI command (run, chat, tokenize, info, perplexity).

Owns: what each command prints and where (generated text on stdout, diagnostics and timings on stderr).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pi2.errors import UsageError
from pi2.runtime.sampling import SamplerParams


@dataclass(frozen=True)
class RunOptions:
    model: Path
    prompt: Optional[str]
    n_predict: int = -1
    threads: int = 0
    ctx_size: int = 4096
    sampling: SamplerParams = field(default_factory=SamplerParams)
    ignore_eos: bool = False
    display_prompt: bool = True
    json_out: bool = False
    engine: str = "auto"
    keep: Optional[float] = None    # model-wide mean FFN keep-fraction (None = the file's default)
    dense: bool = False
    npu: str = "auto"               # --npu auto | nnapi | off
    nnapi_lib: Optional[str] = None
    npu_gbps: Optional[float] = None     # --npu-gbps: the NPU's throughput to plan with (None = measured)
    verbose: bool = False           # --verbose: also print why NNAPI was not used, and the neuron cache's figures
    predictor: bool = True          # False: --no-predictor
    memory_budget: Optional[int] = None   # --memory-budget, bytes
    io: str = "auto"                # --io


def _check(opts: RunOptions) -> None:
    """Flag values llama.cpp would misuse (-n -5 runs forever there); -2 is its 'until the context is full'."""
    if opts.n_predict < -2:
        raise UsageError(f"invalid -n {opts.n_predict}",
                         hint="-n -1 generates until end of generation or a full context")
    if opts.ctx_size < 0:
        raise UsageError(f"invalid context size -c {opts.ctx_size}", hint="-c 0 uses the model's training context")


def _open(opts: RunOptions):
    from pi2.runtime.generate import Timings
    from pi2.runtime.session import RunConfig, open_context, open_model
    from pi2.runtime.sampling import Sampler
    timings = Timings()
    model = open_model(opts.model)
    ctx = open_context(model, RunConfig(opts.ctx_size, opts.threads, opts.engine, opts.keep, opts.dense,
                                      opts.npu, opts.nnapi_lib, opts.memory_budget, opts.io,
                                      predictor=opts.predictor, npu_gbps=opts.npu_gbps))
    sampler = Sampler(opts.sampling, model.config.n_vocab, ctx.n_ctx)
    return model, ctx, sampler, timings


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
    """One prompt in, tokens out; text streams to stdout, timings to stderr (or one JSON object)."""
    from pi2.runtime.generate import check_prompt, generate
    if opts.prompt is None:
        raise UsageError("no prompt given", hint="pass -p TEXT or -f FILE (or -cnv to chat)")
    _check(opts)
    model, ctx, sampler, timings = _open(opts)
    tok = model.tokenizer
    prompt_tokens = tok.encode(opts.prompt, add_special=None, parse_special=True)
    check_prompt(prompt_tokens, ctx.n_ctx)
    if not opts.json_out and opts.display_prompt:
        _write(opts.prompt)
    try:
        gen = generate(ctx, tok, prompt_tokens, opts.n_predict, sampler, timings, ignore_eos=opts.ignore_eos,
                       on_text=None if opts.json_out else _write)
    except KeyboardInterrupt:       # as llama-completion: the timings so far, then exit 130 (cli.main)
        if not opts.json_out:
            print("\n" + timings.report(), file=sys.stderr)
        raise
    if opts.json_out:
        print(json.dumps({"prompt_tokens": gen.prompt_tokens, "tokens": gen.tokens, "text": gen.text,
                          "stop_reason": gen.stop_reason, "seed": sampler.seed, "timings": timings.as_dict()},
                         ensure_ascii=False))
    else:
        _write("\n")
        print(timings.report(), file=sys.stderr)
    if opts.verbose:
        from pi2.runtime.npu import notes
        for line in notes(ctx):
            print(f"pi2: npu: {line}", file=sys.stderr)
        cache_report(ctx)


def cache_report(ctx) -> None:
    """--verbose: the neuron cache's plan and figures of a streamed run, and the peak RSS, on stderr."""
    plan = getattr(ctx, "plan", None)
    if plan is None:
        return
    from pi2.runtime.bench import peak_rss
    st = ctx.stream_stats()
    print(f"pi2: cache: budget {plan.budget / 2**20:.0f} MiB, hot {st['hot_bytes'] / 2**20:.1f} MiB, "
          f"cold {plan.n_slots} x {plan.slot_bytes // 1024} KiB slots, cluster {plan.cluster}, io {plan.io}",
          file=sys.stderr)
    print(f"pi2: cache: hit rate {st['cache_hit_rate']:.1%} (cold {st['cold_hit_rate']:.1%}), "
          f"flash {st['flash_bytes_per_token'] / 2**20:.2f} MiB/token, read {st['read_mbps']:.0f} MB/s, "
          f"I/O wait {st['io_wait_share']:.1%} of decode, peak RSS {peak_rss() / 2**20:.0f} MiB", file=sys.stderr)
    cs = ctx.cache_stats()   # since the run began
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


def plan(model_path: Path, budget: int, n_ctx: int, threads: int, io: str, json_out: bool, npu: str = "auto",
         nnapi_lib: Optional[str] = None, npu_gbps: Optional[float] = None, predictor: bool = False) -> None:
    """pi2 plan: the split of a memory budget for a pi2 file (pi2/plan/budget.py) and whether the NPU computes
    the hot prefix (pi2/plan/npu_plan.py, the decision `pi2 run` takes), on stdout. predictor: as `pi2 run
    --predictor` (the file's predictor at its default keep: its gate rows stream too)."""
    from pi2 import flash_io
    from pi2.engine import CModel, _default_threads
    from pi2.runtime.npu import check_gbps, check_mode, open_delegate
    from pi2.plan.budget import make_plan, streamable
    from pi2.plan.npu_plan import decide
    from pi2.runtime.session import open_model, resolve_ctx
    from pi2.reference.sparse_ffn import choose_rule
    check_mode(npu)
    check_gbps(npu_gbps)
    model = open_model(model_path)
    why = streamable(model)
    if why:
        raise UsageError(why)
    backend, _ = flash_io.resolve(io, model.path)
    model.tokenizer      # as a run holds it
    cm, n_ctx, threads = CModel.from_model(model), resolve_ctx(model, n_ctx), threads or _default_threads()
    rule = choose_rule(model, use_predictor=True) if predictor else None
    p = make_plan(model, cm, budget, n_ctx, threads, io=backend, rule=rule)
    d, reason = open_delegate(npu, nnapi_lib)
    dec = decide(model, npu, d, reason, threads, room=budget - p.floor, npu_gbps=npu_gbps)
    if dec.use:
        p = make_plan(model, cm, budget, n_ctx, threads, io=backend, runtime=p.runtime, npu=dec, rule=rule)
    if json_out:
        print(json.dumps({**p.as_dict(), "npu": dec.as_dict()}))
    else:
        print("\n".join(p.lines() + dec.lines()))


def chat(opts: RunOptions) -> None:
    """Interactive chat: -p is the system message; each user line is rendered with the chat template."""
    from pi2.runtime.generate import check_prompt, generate, timed_decode
    from pi2.model.chat import render_chat, select_template
    if opts.json_out:
        raise UsageError("--json is not available with -cnv", hint="use pi2 run -p TEXT --json")
    _check(opts)
    model, ctx, sampler, timings = _open(opts)
    tok = model.tokenizer
    template, fallback = select_template(model.file.kv)
    if fallback:    # llama.cpp's behaviour: warn, then use ChatML
        print("pi2: warning: the model has no chat template (tokenizer.chat_template); using ChatML",
              file=sys.stderr)
    bos = tok.token_to_piece(tok.bos_id).decode("utf-8", "replace") if tok.bos_id is not None else ""
    eos = tok.token_to_piece(tok.eos_id).decode("utf-8", "replace") if tok.eos_id is not None else ""
    messages = [{"role": "system", "content": opts.prompt}] if opts.prompt else []
    cached = ""     # the text whose tokens are in the KV cache
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("\n> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        user = line.rstrip("\n")
        if user in ("/exit", "/quit"):
            break
        if not user.strip():
            continue
        messages.append({"role": "user", "content": user})
        full = render_chat(template, messages, True, bos, eos)
        if not full.startswith(cached):     # the template rewrote history: start the cache over
            ctx.reset()
            cached = ""
        new_tokens = tok.encode(full[len(cached):], add_special=(cached == ""), parse_special=True)
        if cached and len(new_tokens) > ctx.n_ctx - ctx.n_past - 4:
            print("pi2: the context is full; ending the chat", file=sys.stderr)
            break
        check_prompt(new_tokens, ctx.n_ctx - ctx.n_past)
        gen = generate(ctx, tok, new_tokens, opts.n_predict, sampler, timings, on_text=_write, special=False)
        _write("\n")
        messages.append({"role": "assistant", "content": gen.text})
        cached = full + gen.text
        if gen.stop_reason == "length" and gen.tokens and ctx.n_past < ctx.n_ctx:
            timed_decode(ctx, gen.tokens[-1:], timings)     # the last reply token was sampled, not evaluated
        if gen.eog_token is not None and ctx.n_past < ctx.n_ctx:
            timed_decode(ctx, [gen.eog_token], timings)
            cached += tok.token_to_piece(gen.eog_token, special=True).decode("utf-8", "replace")
        if gen.stop_reason == "context" or ctx.n_past + 1 >= ctx.n_ctx:
            print("pi2: the context is full; ending the chat", file=sys.stderr)
            break
    print(timings.report(), file=sys.stderr)


def tokenize(model_path: Path, text: str, ids_only: bool, add_special: bool, parse_special: bool,
             show_count: bool) -> None:
    from pi2.model.loader import load_model
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
    from pi2.model.info import describe
    describe(model_path, list_tensors)


def perplexity(model_path: Path, file: Path, n_ctx: int, n_chunks: int, threads: int, engine: str,
               keep: Optional[float] = None, dense: bool = False, predictor: bool = True,
               memory_budget: Optional[int] = None, io: str = "auto") -> None:
    """llama-perplexity: progress on stderr, the `Final estimate` line once, on stdout."""
    import time
    from pi2.runtime.perplexity import format_final, perplexity as ppl
    from pi2.runtime.session import RunConfig, open_context, open_model
    try:
        text = file.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as e:
        raise UsageError(f"cannot read {file}: {e.strerror}") from None
    model = open_model(model_path)
    tok = model.tokenizer
    ctx = open_context(model, RunConfig(n_ctx, threads, engine, keep, dense, predictor=predictor,
                                        memory_budget=memory_budget, io=io))
    n_ctx = ctx.n_ctx       # -c 0 means the model's training context, as in llama-perplexity
    t0 = time.perf_counter()
    tokens = tok.encode(text, add_special=None, parse_special=False)
    # held back until the checks in ppl() pass, so a bad input still gets a one-line error
    pending = ["perplexity: tokenizing the input ..\n",
               f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms\n"]

    def progress(s: str) -> None:
        out = "".join(pending) + ("" if s.startswith("Final estimate") else s)
        pending.clear()
        print(out, end="", file=sys.stderr, flush=True)

    def eval_chunk(chunk):
        ctx.reset()
        return ctx.decode(chunk, all_logits=True)

    result = ppl(eval_chunk, tokens, n_ctx, n_chunks=n_chunks, bos_id=tok.bos_id, add_bos=tok.add_bos,
                 progress=progress)
    print(format_final(result))
