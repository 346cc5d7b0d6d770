"""cli.py — the `pi2` command line (Typer). Each command parses llama.cpp-style flags and calls a library
function; errors become one `pi2: error: ...` line on stderr (exit 1, or 2 for usage errors).
Heavy imports (numpy, the engine) happen inside the commands so `--help` stays fast.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from pi2.errors import Pi2Error, UsageError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="pi2: LLM inference that computes only the neurons a token activates.")

_VERBOSE = False
ModelArg = typer.Argument(None, metavar="[MODEL]", help="GGUF model file", show_default=False)
ModelOpt = typer.Option(None, "-m", "--model", help="GGUF model file (same as the positional MODEL)")
KeepOpt = typer.Option(None, "--keep", help="model-wide mean fraction of FFN neurons computed per token "
                       "(default: the pi2 file's, else 1.0 = dense)", show_default=False)
DenseOpt = typer.Option(False, "--dense", help="compute every FFN neuron (no sparsity)")
NpuOpt = typer.Option("auto", "--npu", envvar="PI2_NPU", help="NNAPI for dense prompt batches (plain files) or "
                      "decode's hot prefix (pi2 files): auto (only with a GPU/accelerator device and, for pi2 files, "
                      "a predicted gain) | nnapi (any NNAPI device) | off")
BudgetOpt = typer.Option(None, "--memory-budget", envvar="PI2_MEMORY_BUDGET",
                         help="memory the process may hold, e.g. 500M or 1.5G (pi2 files): FFN bundles are streamed "
                              "from flash into a neuron cache sized to fit (default: everything mapped)")
IoOpt = typer.Option("auto", "--io", envvar="PI2_IO",
                     help="reads of streamed bundles: auto | uring | aio | pread | mmap")
NnapiLibOpt = typer.Option(None, "--nnapi-lib", envvar="PI2_NNAPI_LIB",
                           help="libneuralnetworks.so to open (default: the system's)", show_default=False)
NpuGbpsOpt = typer.Option(None, "--npu-gbps", envvar="PI2_NPU_GBPS",
                          help="the NPU's throughput in GB/s of F16 weights for the hot-prefix decision "
                               "(default: measured on the NNAPI device)", show_default=False)
PredOpt = typer.Option(False, "--predictor/--no-predictor",
                         help="use a pi2 file's own predictor (gate rows of predicted neurons only); off by default: "
                              "with the gate rows in memory it reads and costs more than the gate it skips; with "
                              "--memory-budget the gate rows leave memory and the predicted ones are read")


def _model_path(pos: Optional[Path], opt: Optional[Path]) -> Path:
    if pos and opt and pos != opt:
        raise UsageError("give the model once (positional MODEL or -m)")
    path = pos or opt
    if path is None:
        raise UsageError("no model given", hint="pi2 run MODEL.gguf -p 'text'")
    return path


def _budget(text: Optional[str]) -> Optional[int]:
    from pi2.plan.budget import parse_size
    return None if text is None else parse_size(text)


def _gbps(v: Optional[float]) -> Optional[float]:
    from pi2.npu import check_gbps
    return check_gbps(v)


def parse_io(text: str) -> str:
    from pi2.flash_io import parse_io as parse
    return parse(text)


def _read_prompt(prompt: Optional[str], file: Optional[Path], escape: bool) -> Optional[str]:
    from pi2.runtime import process_escapes
    if prompt is not None and file is not None:
        raise UsageError("give the prompt once (-p or -f)")
    if file is not None:
        try:
            return file.read_bytes().decode("utf-8", "surrogateescape")
        except OSError as e:
            raise UsageError(f"cannot read prompt file {file}: {e.strerror}") from None
    if prompt is not None:
        return process_escapes(prompt) if escape else prompt
    return None


@app.command()
def run(
    model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="prompt text (escapes like \\n processed)"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the prompt from a file, byte for byte"),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", "--predict",
                                  help="tokens to generate (-1 = until end of generation or a full context)"),
    threads: int = typer.Option(0, "-t", "--threads", help="threads (<= 0: all cores)"),
    ctx_size: int = typer.Option(4096, "-c", "--ctx-size",
                                 help="context size (default 4096, capped at the model's; 0 = the model's)"),
    temp: float = typer.Option(0.8, "--temp", help="temperature (<= 0: greedy)"),
    top_k: int = typer.Option(40, "--top-k", help="top-k (0 = off)"),
    top_p: float = typer.Option(0.95, "--top-p", help="top-p (1.0 = off)"),
    min_p: float = typer.Option(0.05, "--min-p", help="min-p (0 = off)"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help="repeat penalty (1.0 = off)"),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n", help="penalty window (0 = off, -1 = context)"),
    seed: int = typer.Option(-1, "-s", "--seed", help="RNG seed (-1 = random)"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="keep generating past end-of-generation tokens"),
    no_escape: bool = typer.Option(False, "--no-escape", help="do not process escape sequences in -p"),
    no_display_prompt: bool = typer.Option(False, "--no-display-prompt", help="do not echo the prompt"),
    conversation: bool = typer.Option(False, "-cnv", "--conversation", help="interactive chat with the chat template"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming text"),
    engine: str = typer.Option("auto", "--engine", envvar="PI2_ENGINE", help="auto | reference"),
    keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt, npu_gbps: Optional[float] = NpuGbpsOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt,
    verbose: bool = typer.Option(False, "--verbose", help="show tracebacks, why NNAPI was not used, and the "
                                                           "neuron cache's figures"),
):
    """Generate text from a prompt (like llama-completion), or chat with -cnv."""
    from pi2 import commands
    from pi2.sampling import SamplerParams
    global _VERBOSE
    _VERBOSE = verbose
    text = _read_prompt(prompt, file, not no_escape)
    opts = commands.RunOptions(
        model=_model_path(model, model_opt), prompt=text, n_predict=n_predict, threads=max(threads, 0),
        ctx_size=ctx_size, ignore_eos=ignore_eos, display_prompt=not no_display_prompt,
        sampling=SamplerParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                               repeat_last_n=repeat_last_n, seed=seed),
        json_out=json_out, engine=engine, keep=keep, dense=dense, npu=npu, nnapi_lib=nnapi_lib, verbose=verbose,
        predictor=use_predictor, memory_budget=_budget(memory_budget), io=parse_io(io),
        npu_gbps=_gbps(npu_gbps))
    if conversation:
        commands.chat(opts)
    else:
        commands.run(opts)


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
):
    """Tokenize text with the model's tokenizer (like llama-tokenize)."""
    from pi2 import commands
    text = _read_prompt(prompt, file, not no_escape)
    if text is None:
        raise UsageError("nothing to tokenize: pass -p TEXT or -f FILE")
    commands.tokenize(_model_path(model, model_opt), text, ids_only=ids, add_special=not no_bos,
                      parse_special=not no_parse_special, show_count=show_count)


@app.command()
def info(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
         tensors: bool = typer.Option(False, "--tensors", help="list every tensor")):
    """Describe a model: architecture, parameters, tensor types and sizes, tokenizer, context."""
    from pi2 import commands
    commands.info(_model_path(model, model_opt), list_tensors=tensors)


@app.command()
def perplexity(
    model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    file: Path = typer.Option(..., "-f", "--file", help="text file to score"),
    ctx_size: int = typer.Option(512, "-c", "--ctx-size", help="chunk size in tokens"),
    chunks: int = typer.Option(-1, "--chunks", help="score at most this many chunks (-1 = all)"),
    threads: int = typer.Option(0, "-t", "--threads", help="threads (0 = all cores)"),
    engine: str = typer.Option("auto", "--engine", envvar="PI2_ENGINE", help="auto | reference"),
    keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt,
):
    """Perplexity of a text, by llama-perplexity's method (second half of each chunk scored)."""
    from pi2 import commands
    commands.perplexity(_model_path(model, model_opt), file, ctx_size, chunks, max(threads, 0), engine,
                        keep, dense, use_predictor, memory_budget=_budget(memory_budget), io=parse_io(io))


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
    engine: str = typer.Option("auto", "--engine", envvar="PI2_ENGINE", help="engine, or a comma list of engines"),
    no_warmup: bool = typer.Option(False, "--no-warmup", help="skip the warm-up run"),
    progress: bool = typer.Option(False, "--progress", help="report each run on stderr"),
    keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt, npu_gbps: Optional[float] = NpuGbpsOpt,
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt,
    repack: bool = typer.Option(True, "--repack/--no-repack", help="repack weights at load for the packed kernels "
                                "(as llama-bench --repack 1; results are the same bits either way)"),
):
    """Measure prompt and generation speed like llama-bench (same method, tables and JSON fields)."""
    from pi2 import bench as b
    params = b.make_params([*(models or []), *(model_opt or [])], n_prompt, n_gen, pg, batch, threads, reps,
                           output, engine, warmup=not no_warmup, progress=progress, keep=keep, dense=dense,
                           npu=npu, nnapi_lib=nnapi_lib, memory_budget=_budget(memory_budget), io=parse_io(io),
                           npu_gbps=npu_gbps, predictor=use_predictor, repack=repack)
    b.run(params)


@app.command()
def convert(
    model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="output file (default MODEL.pi2.gguf)"),
    calib: Optional[Path] = typer.Option(None, "--calib", help="calibration text (default: the one pi2 ships)"),
    calib_tokens: int = typer.Option(2048, "--calib-tokens", help="calibration tokens to profile"),
    layout: str = typer.Option("bundle-ud", "--layout", help="bundle-ud | bundle-gud"),
    ffn_type: str = typer.Option("auto", "--ffn-type", help="row type of down: auto (i8 for quantized sources) | i8 | q8_0 | q5_1 | q4_1 | f32 | f16"),
    threads: int = typer.Option(0, "-t", "--threads", help="threads (0 = all cores)"),
    predictor: Optional[str] = typer.Option(None, "--predictor", help="make a predictor: lowbit | lowrank"),
    predictor_input: str = typer.Option("ffn_norm", "--predictor-input", help="ffn_norm | attn_input"),
    predictor_bits: int = typer.Option(2, "--predictor-bits", help="bits per weight of a lowbit predictor (1 or 2)"),
    predictor_rank: int = typer.Option(64, "--predictor-rank", help="rank of a lowrank predictor (multiple of 32)"),
    predictor_recall: float = typer.Option(0.95, "--predictor-recall",
                                           help="share of truly active neurons the margins must catch"),
):
    """Convert a GGUF model to a pi2 file: profile neurons, order them hot-first, bundle up and down rows."""
    from pi2 import convert as cv
    from pi2.convert.predictor import Spec
    pred = None if predictor is None else Spec(predictor, predictor_input, predictor_bits, predictor_rank,
                                               predictor_recall)
    rep = cv.convert(_model_path(model, model_opt), output, calib=calib, calib_tokens=calib_tokens,
                     ffn_layout=layout, ffn_type=ffn_type, n_threads=max(threads, 0), pred=pred)
    print(cv.summary(rep))


@app.command()
def devices(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
            json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
            nnapi_lib: Optional[str] = NnapiLibOpt):
    """What this machine offers pi2: CPU, memory, I/O backends, O_DIRECT on the model's file system, NNAPI."""
    from pi2 import devices as dv
    dv.show(_model_path(model, model_opt) if model or model_opt else None, nnapi_lib, json_out)


@app.command("profile-io")
def profile_io(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
               refresh: bool = typer.Option(False, "--refresh", help="measure again even if a profile is cached"),
               json_out: bool = typer.Option(False, "--json", help="print the profile as JSON"),
               io: str = typer.Option("auto", "--io", envvar="PI2_IO", help="auto | uring | aio | pread | mmap"),
               seconds: float = typer.Option(0.3, "--seconds", help="seconds per point (block size x queue depth)"),
               cache_dir: Optional[str] = typer.Option(None, "--cache-dir", envvar="PI2_CACHE_DIR",
                                                       help="cache root (default ~/.cache/pi2)", show_default=False)):
    """Random-read throughput of the model file's device by block size and queue depth (cached per device)."""
    from pi2.flash_io import parse_io
    from pi2.plan import profile
    if not 0 < seconds <= 60:
        raise UsageError(f"--seconds must be in (0, 60], not {seconds}")
    profile.show(_model_path(model, model_opt), refresh=refresh, io=parse_io(io), as_json=json_out,
                 cache_dir=cache_dir, seconds=seconds)


@app.command()
def plan(model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt,
         memory_budget: str = typer.Option(..., "--memory-budget", help="memory the process may hold, e.g. 500M"),
         ctx_size: int = typer.Option(4096, "-c", "--ctx-size", help="context size the plan holds a KV cache for"),
         threads: int = typer.Option(0, "-t", "--threads", help="threads (0 = all cores)"),
         io: str = IoOpt, npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt,
         npu_gbps: Optional[float] = NpuGbpsOpt, use_predictor: bool = PredOpt,
         json_out: bool = typer.Option(False, "--json", help="print the plan as JSON")):
    """How a pi2 file runs inside a memory budget: fixed region, hot prefix per layer, cold cache, gate rows (with
    --predictor), I/O, and whether the NPU computes the hot prefix (with the memory its copies take and the
    predicted gain)."""
    from pi2 import commands
    commands.plan(_model_path(model, model_opt), _budget(memory_budget), ctx_size, max(threads, 0),
                  parse_io(io), json_out, npu, nnapi_lib, _gbps(npu_gbps), use_predictor)


def _click_exceptions():
    """(ClickException, UsageError, NoArgsIsHelpError, aborts, exits) as raised by this Typer: recent
    Typer vendors click as typer._click and has its own Abort and Exit; older Typer uses click's."""
    try:
        from typer._click import exceptions as ce
    except ImportError:
        from click import exceptions as ce
    aborts = tuple(c for c in (typer.Abort, getattr(ce, "Abort", None)) if c is not None)
    exits = tuple(c for c in (typer.Exit, getattr(ce, "Exit", None)) if c is not None)
    return ce.ClickException, ce.UsageError, getattr(ce, "NoArgsIsHelpError", ()), aborts, exits


def _interrupted() -> None:
    print("\npi2: interrupted", file=sys.stderr)
    sys.exit(130)


def main(argv: Optional[List[str]] = None) -> None:
    try:
        rc = app(args=argv, prog_name="pi2", standalone_mode=False)
    except Pi2Error as e:
        print(f"pi2: error: {e}", file=sys.stderr)
        if e.hint:
            print(f"  hint: {e.hint}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as e:  # click usage errors and unexpected failures
        click_error, usage_error, no_args_help, aborts, exits = _click_exceptions()
        if isinstance(e, aborts) or isinstance(e.__cause__, KeyboardInterrupt):
            _interrupted()
        if isinstance(e, no_args_help):
            sys.exit(e.exit_code)       # the help text has been printed
        if isinstance(e, click_error):
            print(f"pi2: error: {e.format_message()}", file=sys.stderr)
            ctx = getattr(e, "ctx", None)
            if isinstance(e, usage_error) and ctx is not None:
                print(f"  hint: see '{ctx.command_path} --help'", file=sys.stderr)
            sys.exit(e.exit_code)
        if isinstance(e, exits):
            sys.exit(e.exit_code)
        if _VERBOSE:
            raise
        print(f"pi2: error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    if rc == 130:       # Typer turns a KeyboardInterrupt into Exit(130), returned in non-standalone mode
        _interrupted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)
