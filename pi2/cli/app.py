"""app.py — the `pi2` commands and their llama.cpp-style flags (Typer). Each command turns its flags into the
runtime's objects (RunConfig, SamplerParams) and calls one function of pi2/cli/commands.py, which does the work and
the printing. This module imports only Typer and pi2's light modules: commands.py (numpy, the engine) is imported
when a command runs, so `pi2 --help` stays fast. main() is in pi2/cli/main.py.
The flags several commands share are defined once in pi2/cli/options.py; the server and hub commands are in
pi2/cli/net.py, which takes them from there too.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pi2.cli.load_flags import LoadModeOpt, NoMmapOpt, load_notes
from pi2.cli.options import (RUN, SAMPLE, BudgetOpt, CacheKOpt, CacheVOpt, DenseOpt, EngineOpt, FlashOpt, HfOpt,
                             IoOpt, KeepOpt, ModelArg, ModelOpt, NnapiLibOpt, NpuGbpsOpt, NpuOpt, PredOpt, ThreadsOpt,
                             VerboseOpt, _model_path, _verbose)
from pi2.cli.prompt import read_prompt
from pi2.errors import FileError, UsageError
from pi2.runtime.config import RunConfig, SamplerParams

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="pi2: LLM inference that computes only the neurons a token activates.")


def _commands():
    """pi2/cli/commands.py, imported when a command runs (it loads numpy and the compiled engine)."""
    from pi2.cli import commands     # the import graph test allows this one: --help must not load numpy
    return commands


@app.command()
def run(
    ctx: typer.Context, model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="prompt text (escapes like \\n processed)"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the prompt from a file, byte for byte"),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", "--predict",
                                  help="tokens to generate (-1 = until end of generation or a full context)"),
    threads: int = ThreadsOpt,
    ctx_size: int = typer.Option(RUN.n_ctx, "-c", "--ctx-size",
                                 help=f"context size (default {RUN.n_ctx}, capped at the model's; 0 = the model's)"),
    batch: int = typer.Option(2048, "-b", "--batch-size", help="logical batch: prompt tokens per pass (with -ub)"),
    ubatch: int = typer.Option(RUN.n_batch, "-ub", "--ubatch-size", help="physical batch: prompt tokens per pass"),
    cache_k: str = CacheKOpt, cache_v: str = CacheVOpt, flash_attn: str = FlashOpt,
    temp: float = typer.Option(SAMPLE.temp, "--temp", "--temperature", help="temperature (<= 0: greedy)"),
    top_k: int = typer.Option(SAMPLE.top_k, "--top-k", help="top-k (0 = off)"),
    top_p: float = typer.Option(SAMPLE.top_p, "--top-p", help="top-p (1.0 = off)"),
    min_p: float = typer.Option(SAMPLE.min_p, "--min-p", help="min-p (0 = off)"),
    typ_p: float = typer.Option(SAMPLE.typ_p, "--typical", "--typical-p", help="locally typical sampling (1.0 = off)"),
    top_n_sigma: float = typer.Option(SAMPLE.top_n_sigma, "--top-nsigma", "--top-n-sigma",
                                      help="keep logits within n standard deviations of the top one (<= 0 off)"),
    xtc_p: float = typer.Option(SAMPLE.xtc_probability, "--xtc-probability", help="XTC: chance to cut (0 = off)"),
    xtc_t: float = typer.Option(SAMPLE.xtc_threshold, "--xtc-threshold", help="XTC: probability threshold (> 0.5 off)"),
    repeat_penalty: float = typer.Option(SAMPLE.repeat_penalty, "--repeat-penalty", help="repeat penalty (1.0 = off)"),
    repeat_last_n: int = typer.Option(SAMPLE.repeat_last_n, "--repeat-last-n",
                                      help="penalty window (0 = off, -1 = context)"),
    presence: float = typer.Option(SAMPLE.presence_penalty, "--presence-penalty", help="presence penalty (0 = off)"),
    frequency: float = typer.Option(SAMPLE.frequency_penalty, "--frequency-penalty",
                                    help="frequency penalty (0 = off)"),
    dry_mult: float = typer.Option(SAMPLE.dry_multiplier, "--dry-multiplier", help="DRY multiplier (0 = off)"),
    dry_base: float = typer.Option(SAMPLE.dry_base, "--dry-base", help="DRY base"),
    dry_allowed: int = typer.Option(SAMPLE.dry_allowed_length, "--dry-allowed-length",
                                    help="DRY: repeats longer than this are penalised"),
    dry_last_n: int = typer.Option(SAMPLE.dry_penalty_last_n, "--dry-penalty-last-n",
                                   help="DRY window (0 = off, -1 = context)"),
    dry_breakers: Optional[List[str]] = typer.Option(None, "--dry-sequence-breaker",
                                                     help="DRY sequence breaker (repeatable; 'none' for none)"),
    dynatemp_range: float = typer.Option(SAMPLE.dynatemp_range, "--dynatemp-range",
                                         help="dynamic temperature range (0 = off)"),
    dynatemp_exp: float = typer.Option(SAMPLE.dynatemp_exponent, "--dynatemp-exp", help="dynamic temperature exponent"),
    mirostat: int = typer.Option(SAMPLE.mirostat, "--mirostat", help="0 off, 1 Mirostat, 2 Mirostat 2.0"),
    mirostat_lr: float = typer.Option(SAMPLE.mirostat_eta, "--mirostat-lr", help="Mirostat learning rate (eta)"),
    mirostat_ent: float = typer.Option(SAMPLE.mirostat_tau, "--mirostat-ent", help="Mirostat target entropy (tau)"),
    samplers: Optional[str] = typer.Option(None, "--samplers", help="sampler order, ';'-separated (default "
                                           + ";".join(SAMPLE.samplers) + ")", show_default=False),
    sampler_seq: Optional[str] = typer.Option(None, "--sampler-seq", "--sampling-seq",
                                              help="sampler order as letters (edskypmxt)", show_default=False),
    min_keep: int = typer.Option(SAMPLE.min_keep, "--min-keep", help="samplers keep at least this many tokens"),
    seed: int = typer.Option(SAMPLE.seed, "-s", "--seed", help="RNG seed (-1 = random)"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="keep generating past end-of-generation tokens"),
    no_escape: bool = typer.Option(False, "--no-escape", help="do not process escape sequences in -p"),
    escape: bool = typer.Option(True, "-e", "--escape", help="process escape sequences in -p (the default)"),
    display_prompt: bool = typer.Option(True, "--display-prompt/--no-display-prompt", help="echo the prompt"),
    special: bool = typer.Option(False, "-sp", "--special", help="print special tokens' text"),
    reverse: Optional[List[str]] = typer.Option(None, "-r", "--reverse-prompt",
                                                help="stop the reply when this text appears (repeatable)"),
    conversation: bool = typer.Option(False, "-cnv", "--conversation", help="interactive chat with the chat template"),
    no_conversation: bool = typer.Option(False, "-no-cnv", "--no-conversation", help="no chat (the default)"),
    interactive: bool = typer.Option(False, "-i", "--interactive",
                                     help="llama-completion's interactive mode: your lines continue the text (no "
                                          "template); -r returns control to you"),
    interactive_first: bool = typer.Option(False, "-if", "--interactive-first",
                                           help="interactive, waiting for your input before generating"),
    single_turn: bool = typer.Option(False, "-st", "--single-turn", help="chat: answer -p once, then exit"),
    system: Optional[str] = typer.Option(None, "-sys", "--system-prompt", help="chat: the system message"),
    system_file: Optional[Path] = typer.Option(None, "-sysf", "--system-prompt-file",
                                               help="chat: the system message from a file"),
    chat_template: Optional[str] = typer.Option(None, "--chat-template",
                                                help="chat template: a built-in name (chatml, llama2, llama3, gemma, "
                                                     "phi3, mistral-v7, ...; see docs) or Jinja source"),
    chat_template_file: Optional[Path] = typer.Option(None, "--chat-template-file", help="chat template from a file"),
    ctx_shift: bool = typer.Option(False, "--context-shift/--no-context-shift",
                                   help="when the context is full, drop half of it after the kept tokens and go on "
                                        "(llama.cpp's context shift; off by default, as there)"),
    keep_tokens: int = typer.Option(0, "--keep-tokens", help="tokens a context shift keeps after BOS (llama.cpp's "
                                    "--keep; pi2's --keep is the FFN fraction)"),
    no_mmap: bool = NoMmapOpt,
    mlock: bool = typer.Option(False, "--mlock", help="lock the model's pages in memory (as llama.cpp: a warning "
                               "when the limit refuses)"),
    load_mode: Optional[str] = LoadModeOpt,
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming text"),
    expert_profile: bool = typer.Option(True, "--expert-profile/--no-expert-profile",
                                        help="a MoE file whose experts stream: learn its hot experts while running "
                                             "and add this run's routing to its routing profile (the next run "
                                             "starts with them resident)"),
    engine: str = EngineOpt, keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt, npu_gbps: Optional[float] = NpuGbpsOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt, hf: Optional[str] = HfOpt, verbose: bool = VerboseOpt,
):
    """Generate text from a prompt (like llama-completion), or chat with -cnv."""
    text = read_prompt(prompt, file, escape and not no_escape)
    sys_text = read_prompt(system, system_file, escape and not no_escape)
    template = _template(chat_template, chat_template_file)
    mlock, no_mmap = load_notes(no_mmap, mlock, load_mode)
    cfg = RunConfig(n_ctx=ctx_size, n_threads=threads, engine=engine, keep=keep, dense=dense, predictor=use_predictor,
                    memory_budget=memory_budget, io=io, npu=npu, nnapi_lib=nnapi_lib, npu_gbps=npu_gbps,
                    n_batch=_batch(batch, ubatch), ctx_shift=ctx_shift, n_keep=keep_tokens, cache_type_k=cache_k,
                    cache_type_v=cache_v, flash_attn=flash_attn, no_mmap=no_mmap, expert_profile=expert_profile)
    breakers = SAMPLE.dry_sequence_breakers if not dry_breakers else \
        tuple(b for b in dry_breakers if b != "none") if "none" not in dry_breakers else ()
    sampling = SamplerParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                             repeat_last_n=repeat_last_n, seed=seed, presence_penalty=presence,
                             frequency_penalty=frequency, typ_p=typ_p, top_n_sigma=top_n_sigma, xtc_probability=xtc_p,
                             xtc_threshold=xtc_t, dynatemp_range=dynatemp_range, dynatemp_exponent=dynatemp_exp,
                             mirostat=mirostat, mirostat_tau=mirostat_ent, mirostat_eta=mirostat_lr,
                             dry_multiplier=dry_mult, dry_base=dry_base, dry_allowed_length=dry_allowed,
                             dry_penalty_last_n=dry_last_n, dry_sequence_breakers=breakers, min_keep=min_keep,
                             samplers=samplers or sampler_seq or SAMPLE.samplers)
    chat = (conversation or single_turn) and not no_conversation
    interactive = (interactive or interactive_first) and not chat
    cmd = _commands()
    opts = cmd.RunOptions(model=_model_path(model, model_opt, hf), prompt=text, run=cfg, sampling=sampling,
                          n_predict=n_predict, ignore_eos=ignore_eos, display_prompt=display_prompt,
                          json_out=json_out, verbose=_verbose(ctx), system=sys_text, reverse=tuple(reverse or ()),
                          single_turn=single_turn, chat_template=template, special=special, mlock=mlock,
                          interactive_first=interactive_first)
    (cmd.chat if chat else cmd.interactive if interactive else cmd.run)(opts)


def _batch(batch: int, ubatch: int) -> int:
    for flag, v in (("-b", batch), ("-ub", ubatch)):
        if not 1 <= v <= 65536:
            raise UsageError(f"invalid {flag} {v}: it must be in [1, 65536]")
    return min(batch, ubatch)


def _template(name: Optional[str], file: Optional[Path]) -> Optional[str]:
    """--chat-template NAME_OR_JINJA or --chat-template-file FILE (its text)."""
    if name is not None and file is not None:
        raise UsageError("give the chat template once (--chat-template or --chat-template-file)")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise FileError(f"cannot read chat template file {file}: {getattr(e, 'strerror', None) or e}") from None
    return name


@app.command()
def tokenize(
    model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="text to tokenize"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="tokenize a file's content"),
    ids: bool = typer.Option(False, "--ids", help="print only a JSON list of ids"),
    no_bos: bool = typer.Option(False, "--no-bos", help="do not add BOS/EOS even if the model does"),
    no_parse_special: bool = typer.Option(False, "--no-parse-special", help="treat special-token text as text"),
    no_escape: bool = typer.Option(False, "--no-escape", help="do not process escape sequences in -p"),
    show_count: bool = typer.Option(False, "--show-count", help="print the number of tokens"),
    verbose: bool = VerboseOpt,
):
    """Tokenize text with the model's tokenizer (like llama-tokenize)."""
    text = read_prompt(prompt, file, not no_escape)
    if text is None:
        raise UsageError("nothing to tokenize: pass -p TEXT or -f FILE")
    _commands().tokenize(_model_path(model, model_opt), text, ids_only=ids, add_special=not no_bos,
                         parse_special=not no_parse_special, show_count=show_count)


@app.command()
def info(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
         tensors: bool = typer.Option(False, "--tensors", help="list every tensor"), verbose: bool = VerboseOpt):
    """Describe a model: architecture, parameters, tensor types and sizes, tokenizer, context."""
    _commands().info(_model_path(model, model_opt), list_tensors=tensors)


@app.command()
def perplexity(
    ctx: typer.Context, model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    file: Path = typer.Option(..., "-f", "--file", help="text file to score"),
    ctx_size: int = typer.Option(512, "-c", "--ctx-size", help="chunk size in tokens"),
    chunks: int = typer.Option(-1, "--chunks", help="score at most this many chunks (-1 = all)"),
    threads: int = ThreadsOpt, engine: str = EngineOpt,
    keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt, cache_k: str = CacheKOpt, cache_v: str = CacheVOpt,
    flash_attn: str = FlashOpt, no_mmap: bool = NoMmapOpt, load_mode: Optional[str] = LoadModeOpt,
    verbose: bool = VerboseOpt,
):
    """Perplexity of a text, by llama-perplexity's method (second half of each chunk scored)."""
    _, no_mmap = load_notes(no_mmap, False, load_mode, locks=False)
    cfg = RunConfig(n_ctx=ctx_size, n_threads=threads, engine=engine, keep=keep, dense=dense, predictor=use_predictor,
                    memory_budget=memory_budget, io=io, cache_type_k=cache_k, cache_type_v=cache_v,
                    flash_attn=flash_attn, no_mmap=no_mmap)
    _commands().perplexity(_model_path(model, model_opt), file, cfg, chunks, verbose=_verbose(ctx))


@app.command()
def bench(
    models: Optional[List[Path]] = typer.Argument(None, metavar="MODEL", help="GGUF model files",
                                                  show_default=False),
    model_opt: Optional[List[Path]] = typer.Option(None, "-m", "--model", help="GGUF model file (repeatable)"),
    n_prompt: Optional[List[str]] = typer.Option(None, "-p", "--n-prompt", help="prompt tokens (default 512, 0 skips)"),
    n_gen: Optional[List[str]] = typer.Option(None, "-n", "--n-gen", help="generated tokens (default 128, 0 skips)"),
    pg: Optional[List[str]] = typer.Option(None, "-pg", help="prompt then generation in one test: PP,TG"),
    batch: Optional[List[str]] = typer.Option(None, "-b", "--batch-size", help="prompt chunk size (default 2048)"),
    threads: Optional[List[str]] = typer.Option(None, "-t", "--threads", help="threads: 1,2 or 1-4 (default: all)"),
    type_k: Optional[List[str]] = typer.Option(None, "-ctk", "--cache-type-k", help="K cache types: f16,q8_0,"
                                               "q4_0,q4_1,q5_0,q5_1 (default f16)"),
    type_v: Optional[List[str]] = typer.Option(None, "-ctv", "--cache-type-v", help="V cache types: f16, or with "
                                               "flash attention q8_0,q4_0,q4_1,q5_0,q5_1"),
    flash_attn: Optional[List[str]] = typer.Option(None, "-fa", "--flash-attn", help="flash attention: 0,1 "
                                                   "(on, off, auto also; default auto: off unless -ctv is quantized)"),
    load_mode: Optional[List[str]] = typer.Option(None, "-lm", "--load-mode", help="load modes: mmap,none (auto = "
                                                  "mmap, dio = none: read into memory)"),
    mmap: Optional[List[str]] = typer.Option(None, "-mmp", "--mmap", help="0: read the model into memory, 1: map "
                                             "it (a list: 0,1)"),
    no_mmap: bool = typer.Option(False, "--no-mmap", help="as -mmp 0"),
    reps: int = typer.Option(5, "-r", "--repetitions", help="timed repetitions per test"),
    output: str = typer.Option("md", "-o", "--output", help="md | json | jsonl | csv"),
    engine: str = typer.Option(RUN.engine, "--engine", envvar="PI2_ENGINE", help="engine, or a comma list of engines"),
    no_warmup: bool = typer.Option(False, "--no-warmup", help="skip the warm-up run"),
    progress: bool = typer.Option(False, "--progress", help="report each run on stderr"),
    keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt, npu_gbps: Optional[float] = NpuGbpsOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt, hf: Optional[str] = HfOpt, verbose: bool = VerboseOpt,
    repack: bool = typer.Option(True, "--repack/--no-repack", help="repack weights at load for the packed kernels "
                                "(as llama-bench --repack 1; results are the same bits either way)"),
    expert_profile: bool = typer.Option(True, "--expert-profile/--no-expert-profile",
                                        help="a MoE file whose experts stream: learn its hot experts while running "
                                             "(--no-expert-profile: a plain LRU); bench never adds its routing to "
                                             "the routing profile, so each run starts as the last did"),
):
    """Measure prompt and generation speed like llama-bench (same method, tables and JSON fields)."""
    cfg = RunConfig(keep=keep, dense=dense, predictor=use_predictor, memory_budget=memory_budget, io=io, npu=npu,
                    nnapi_lib=nnapi_lib, npu_gbps=npu_gbps, repack=repack, expert_profile=expert_profile)
    hf_model = [_model_path(None, None, hf)] if hf else []
    _commands().bench([*(models or []), *(model_opt or []), *hf_model], n_prompt, n_gen, pg, batch, threads, reps, output,
                      engine, warmup=not no_warmup, progress=progress, run=cfg, type_k=type_k, type_v=type_v,
                      flash_attn=flash_attn, load_mode=load_mode, mmap=[*(mmap or []), *(["0"] if no_mmap else [])])


@app.command()
def convert(
    model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="output file (default MODEL.pi2.gguf)"),
    calib: Optional[Path] = typer.Option(None, "--calib", help="calibration text (default: the one pi2 ships)"),
    calib_tokens: int = typer.Option(2048, "--calib-tokens", help="calibration tokens to profile"),
    layout: str = typer.Option("bundle-ud", "--layout", help="bundle-ud | bundle-gud"),
    ffn_type: str = typer.Option("auto", "--ffn-type", help="row type of down: auto (i8 for quantized sources) | i8 | "
                                                            "q8_0 | q5_1 | q4_1 | f32 | f16"),
    threads: int = typer.Option(0, "-t", "--threads", help="threads (0 = all cores)"),
    predictor: Optional[str] = typer.Option(None, "--predictor", help="make a predictor: lowbit | lowrank"),
    predictor_input: str = typer.Option("ffn_norm", "--predictor-input", help="ffn_norm | attn_input"),
    predictor_bits: int = typer.Option(2, "--predictor-bits", help="bits per weight of a lowbit predictor (1 or 2)"),
    predictor_rank: int = typer.Option(64, "--predictor-rank", help="rank of a lowrank predictor (multiple of 32)"),
    predictor_recall: float = typer.Option(0.95, "--predictor-recall",
                                           help="share of truly active neurons the margins must catch"),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget",
                                                help="MoE files: memory the profile may hold, e.g. 4G; its experts "
                                                     "stream from flash (default: mapped if the file fits in memory)"),
    verbose: bool = VerboseOpt,
):
    """Convert a GGUF model to a pi2 file: profile neurons, order them hot-first, bundle up and down rows."""
    pred = None if predictor is None else (predictor, predictor_input, predictor_bits, predictor_rank,
                                           predictor_recall)
    _commands().convert(_model_path(model, model_opt), output, calib=calib, calib_tokens=calib_tokens,
                        ffn_layout=layout, ffn_type=ffn_type, n_threads=max(threads, 0), pred=pred,
                        memory_budget=memory_budget)


@app.command()
def devices(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
            json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
            nnapi_lib: Optional[str] = NnapiLibOpt, verbose: bool = VerboseOpt):
    """What this machine offers pi2: CPU, memory, I/O backends, O_DIRECT on the model's file system, NNAPI."""
    _commands().devices(_model_path(model, model_opt) if model or model_opt else None, nnapi_lib, json_out)


@app.command("profile-io")
def profile_io(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
               refresh: bool = typer.Option(False, "--refresh", help="measure again even if a profile is cached"),
               json_out: bool = typer.Option(False, "--json", help="print the profile as JSON"),
               io: str = typer.Option(RUN.io, "--io", envvar="PI2_IO", help="auto | uring | aio | pread | mmap"),
               seconds: float = typer.Option(0.3, "--seconds", help="seconds per point (block size x queue depth)"),
               cache_dir: Optional[str] = typer.Option(None, "--cache-dir", envvar="PI2_CACHE_DIR",
                                                       help="cache root (default ~/.cache/pi2)", show_default=False),
               verbose: bool = VerboseOpt):
    """Random-read throughput of the model file's device by block size and queue depth (cached per device)."""
    if not 0 < seconds <= 60:
        raise UsageError(f"--seconds must be in (0, 60], not {seconds}")
    _commands().profile_io(_model_path(model, model_opt), refresh=refresh, io=io, as_json=json_out,
                           cache_dir=cache_dir, seconds=seconds)


@app.command("profile-experts")
def profile_experts(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
                    calib: Optional[Path] = typer.Option(None, "--calib", help="text to route (default: the "
                                                         "calibration text pi2 ships)"),
                    calib_tokens: int = typer.Option(2048, "--calib-tokens", help="tokens to route"),
                    threads: int = ThreadsOpt, verbose: bool = VerboseOpt):
    """How often a MoE file routes to each expert on a text, saved where --memory-budget finds it: the planner keeps
    the most routed experts resident."""
    _commands().profile_experts(_model_path(model, model_opt), calib, calib_tokens, threads)


@app.command()
def plan(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
         memory_budget: str = typer.Option(..., "--memory-budget", help="memory the process may hold, e.g. 500M"),
         ctx_size: int = typer.Option(RUN.n_ctx, "-c", "--ctx-size", help="context size the plan holds a KV cache for"),
         threads: int = ThreadsOpt, io: str = IoOpt, npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt,
         npu_gbps: Optional[float] = NpuGbpsOpt, use_predictor: bool = PredOpt, cache_k: str = CacheKOpt,
         cache_v: str = CacheVOpt, flash_attn: str = FlashOpt,
         json_out: bool = typer.Option(False, "--json", help="print the plan as JSON"), verbose: bool = VerboseOpt):
    """How a pi2 file runs inside a memory budget: fixed region, hot prefix per layer, cold cache, gate rows (with
    --predictor), I/O, and whether the NPU computes the hot prefix (with the memory its copies take and the
    predicted gain); for a plain MoE GGUF the expert cache's split, expected hit rate and flash bytes per token:
    the plan `pi2 run` makes with the same flags."""
    cfg = RunConfig(n_ctx=ctx_size, n_threads=threads, predictor=use_predictor, memory_budget=memory_budget, io=io,
                    npu=npu, nnapi_lib=nnapi_lib, npu_gbps=npu_gbps, cache_type_k=cache_k, cache_type_v=cache_v,
                    flash_attn=flash_attn)
    _commands().plan(_model_path(model, model_opt), cfg, json_out)
