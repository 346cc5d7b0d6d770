"""app.py — the `pi2` commands and their llama.cpp-style flags (Typer). Each command turns its flags into the
runtime's objects (RunConfig, SamplerParams) and calls one function of pi2/cli/commands.py, which does the work and
the printing. This module imports only Typer and pi2's light modules: commands.py (numpy, the engine) is imported
when a command runs, so `pi2 --help` stays fast. main() is in pi2/cli/main.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pi2.cli.prompt import read_prompt
from pi2.errors import UsageError
from pi2.hub import pull as hub_pull
from pi2.runtime.config import RunConfig, SamplerParams

RUN, SAMPLE = RunConfig(), SamplerParams()     # the defaults, held by the runtime's objects

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="pi2: LLM inference that computes only the neurons a token activates.")


class CliState:
    """What the whole command line asked for beyond one command: --verbose (tracebacks and extra figures)."""
    verbose: bool = False


def _set_verbose(ctx: typer.Context, value: bool) -> bool:
    if value and isinstance(ctx.find_root().obj, CliState):
        ctx.find_root().obj.verbose = True
    return value


def _verbose(ctx: typer.Context) -> bool:
    state = ctx.find_root().obj
    return isinstance(state, CliState) and state.verbose


def _commands():
    """pi2/cli/commands.py, imported when a command runs (it loads numpy and the compiled engine)."""
    from pi2.cli import commands     # the import graph test allows this one: --help must not load numpy
    return commands


VerboseOpt = typer.Option(False, "--verbose", callback=_set_verbose,
                          help="show tracebacks, why NNAPI was not used, and the neuron cache's figures")
ModelArg = typer.Argument(None, metavar="[MODEL]", help="GGUF model file", show_default=False)
ModelOpt = typer.Option(None, "-m", "--model", help="GGUF model file (same as the positional MODEL)")
KeepOpt = typer.Option(None, "--keep", help="model-wide mean fraction of FFN neurons computed per token "
                       "(default: the pi2 file's, else 1.0 = dense)", show_default=False)
DenseOpt = typer.Option(RUN.dense, "--dense", help="compute every FFN neuron (no sparsity)")
NpuOpt = typer.Option(RUN.npu, "--npu", envvar="PI2_NPU", help="NNAPI for dense prompt batches (plain files) or "
                      "decode's hot prefix (pi2 files): auto (only with a GPU/accelerator device and, for pi2 files, "
                      "a predicted gain) | nnapi (any NNAPI device) | off")
BudgetOpt = typer.Option(None, "--memory-budget", envvar="PI2_MEMORY_BUDGET",
                         help="memory the process may hold, e.g. 500M or 1.5G (pi2 files): FFN bundles are streamed "
                              "from flash into a neuron cache sized to fit (default: everything mapped)")
IoOpt = typer.Option(RUN.io, "--io", envvar="PI2_IO",
                     help="reads of streamed bundles: auto | uring | aio | pread | mmap")
NnapiLibOpt = typer.Option(None, "--nnapi-lib", envvar="PI2_NNAPI_LIB",
                           help="libneuralnetworks.so to open (default: the system's)", show_default=False)
NpuGbpsOpt = typer.Option(None, "--npu-gbps", envvar="PI2_NPU_GBPS",
                          help="the NPU's throughput in GB/s of F16 weights for the hot-prefix decision "
                               "(default: measured on the NNAPI device)", show_default=False)
PredOpt = typer.Option(RUN.predictor, "--predictor/--no-predictor",
                       help="use a pi2 file's own predictor (gate rows of predicted neurons only); off by default: "
                            "with the gate rows in memory it reads and costs more than the gate it skips; with "
                            "--memory-budget the gate rows leave memory and the predicted ones are read")
EngineOpt = typer.Option(RUN.engine, "--engine", envvar="PI2_ENGINE", help="auto | c | reference")
ThreadsOpt = typer.Option(RUN.n_threads, "-t", "--threads", help="threads (<= 0: all cores)")


HfOpt = typer.Option(None, "-hf", "-hfr", "--hf-repo", envvar="PI2_HF_REPO", show_default=False,
                     help="Hugging Face repository REPO[:QUANT] (or REPO/FILE.gguf): downloaded into the hub's cache "
                          "when missing, then used as the model (as llama.cpp's -hf)")


def _model_path(pos: Optional[Path], opt: Optional[Path], hf: Optional[str] = None) -> Path:
    if hf:      # -hf: the file pi2/hub.py resolves (and downloads when missing)
        if pos or opt:
            raise UsageError("give the model once (MODEL, -m or -hf)")
        return Path(hub_pull(hf))
    if pos and opt and pos != opt:
        raise UsageError("give the model once (positional MODEL or -m)")
    path = pos or opt
    if path is None:
        raise UsageError("no model given", hint="pi2 run MODEL.gguf -p 'text'")
    return path


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
    temp: float = typer.Option(SAMPLE.temp, "--temp", help="temperature (<= 0: greedy)"),
    top_k: int = typer.Option(SAMPLE.top_k, "--top-k", help="top-k (0 = off)"),
    top_p: float = typer.Option(SAMPLE.top_p, "--top-p", help="top-p (1.0 = off)"),
    min_p: float = typer.Option(SAMPLE.min_p, "--min-p", help="min-p (0 = off)"),
    repeat_penalty: float = typer.Option(SAMPLE.repeat_penalty, "--repeat-penalty", help="repeat penalty (1.0 = off)"),
    repeat_last_n: int = typer.Option(SAMPLE.repeat_last_n, "--repeat-last-n",
                                      help="penalty window (0 = off, -1 = context)"),
    seed: int = typer.Option(SAMPLE.seed, "-s", "--seed", help="RNG seed (-1 = random)"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="keep generating past end-of-generation tokens"),
    no_escape: bool = typer.Option(False, "--no-escape", help="do not process escape sequences in -p"),
    no_display_prompt: bool = typer.Option(False, "--no-display-prompt", help="do not echo the prompt"),
    conversation: bool = typer.Option(False, "-cnv", "--conversation", help="interactive chat with the chat template"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming text"),
    engine: str = EngineOpt, keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt, npu_gbps: Optional[float] = NpuGbpsOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt, hf: Optional[str] = HfOpt, verbose: bool = VerboseOpt,
):
    """Generate text from a prompt (like llama-completion), or chat with -cnv."""
    text = read_prompt(prompt, file, not no_escape)
    cfg = RunConfig(n_ctx=ctx_size, n_threads=threads, engine=engine, keep=keep, dense=dense, predictor=use_predictor,
                    memory_budget=memory_budget, io=io, npu=npu, nnapi_lib=nnapi_lib, npu_gbps=npu_gbps)
    sampling = SamplerParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                             repeat_last_n=repeat_last_n, seed=seed)
    cmd = _commands()
    opts = cmd.RunOptions(model=_model_path(model, model_opt, hf), prompt=text, run=cfg, sampling=sampling,
                          n_predict=n_predict, ignore_eos=ignore_eos, display_prompt=not no_display_prompt,
                          json_out=json_out, verbose=_verbose(ctx))
    (cmd.chat if conversation else cmd.run)(opts)


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
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt, verbose: bool = VerboseOpt,
):
    """Perplexity of a text, by llama-perplexity's method (second half of each chunk scored)."""
    cfg = RunConfig(n_ctx=ctx_size, n_threads=threads, engine=engine, keep=keep, dense=dense, predictor=use_predictor,
                    memory_budget=memory_budget, io=io)
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
):
    """Measure prompt and generation speed like llama-bench (same method, tables and JSON fields)."""
    cfg = RunConfig(keep=keep, dense=dense, predictor=use_predictor, memory_budget=memory_budget, io=io, npu=npu,
                    nnapi_lib=nnapi_lib, npu_gbps=npu_gbps, repack=repack)
    hf_model = [_model_path(None, None, hf)] if hf else []
    _commands().bench([*(models or []), *(model_opt or []), *hf_model], n_prompt, n_gen, pg, batch, threads, reps, output,
                      engine, warmup=not no_warmup, progress=progress, run=cfg)


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
    verbose: bool = VerboseOpt,
):
    """Convert a GGUF model to a pi2 file: profile neurons, order them hot-first, bundle up and down rows."""
    pred = None if predictor is None else (predictor, predictor_input, predictor_bits, predictor_rank,
                                           predictor_recall)
    _commands().convert(_model_path(model, model_opt), output, calib=calib, calib_tokens=calib_tokens,
                        ffn_layout=layout, ffn_type=ffn_type, n_threads=max(threads, 0), pred=pred)


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


@app.command()
def plan(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
         memory_budget: str = typer.Option(..., "--memory-budget", help="memory the process may hold, e.g. 500M"),
         ctx_size: int = typer.Option(RUN.n_ctx, "-c", "--ctx-size", help="context size the plan holds a KV cache for"),
         threads: int = ThreadsOpt, io: str = IoOpt, npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt,
         npu_gbps: Optional[float] = NpuGbpsOpt, use_predictor: bool = PredOpt,
         json_out: bool = typer.Option(False, "--json", help="print the plan as JSON"), verbose: bool = VerboseOpt):
    """How a pi2 file runs inside a memory budget: fixed region, hot prefix per layer, cold cache, gate rows (with
    --predictor), I/O, and whether the NPU computes the hot prefix (with the memory its copies take and the
    predicted gain): the plan `pi2 run` makes with the same flags."""
    cfg = RunConfig(n_ctx=ctx_size, n_threads=threads, predictor=use_predictor, memory_budget=memory_budget, io=io,
                    npu=npu, nnapi_lib=nnapi_lib, npu_gbps=npu_gbps)
    _commands().plan(_model_path(model, model_opt), cfg, json_out)
