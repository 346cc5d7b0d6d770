"""options.py — the flags several `pi2` commands share (Typer options with llama.cpp's spellings, their envvars and
help), the model argument (MODEL, -m or -hf) and --verbose's state for the whole command line. Light to import: Typer
and pi2's light modules only, as pi2/cli/app.py and pi2/cli/net.py are.
Does not: define commands (app.py, net.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pi2.errors import UsageError
from pi2.hub import pull as hub_pull
from pi2.runtime.config import RunConfig, SamplerParams

RUN, SAMPLE = RunConfig(), SamplerParams()     # the defaults, held by the runtime's objects


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


VerboseOpt = typer.Option(False, "-v", "--verbose", "--log-verbose", callback=_set_verbose,
                          help="show tracebacks, why NNAPI was not used, and the neuron cache's figures")
ModelArg = typer.Argument(None, metavar="[MODEL]", help="GGUF model file", show_default=False)
ModelOpt = typer.Option(None, "-m", "--model", help="GGUF model file (same as the positional MODEL)")
KeepOpt = typer.Option(None, "--keep", help="pi2's own: model-wide mean fraction of FFN neurons computed per token "
                       "(default: the pi2 file's, else 1.0 = dense); not llama.cpp's --keep N, which is pi2's "
                       "--keep-tokens N", show_default=False)
DenseOpt = typer.Option(RUN.dense, "--dense", help="compute every FFN neuron (no sparsity; ReLU experts: up rows of "
                        "closed gates too)")
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


CacheKOpt = typer.Option("f16", "-ctk", "--cache-type-k",
                         help="K cache type: f16, q8_0, q4_0, q4_1, q5_0 or q5_1 (llama.cpp's numerics with -fa off: "
                              "Hadamard-rotated quantized keys)")
CacheVOpt = typer.Option("f16", "-ctv", "--cache-type-v",
                         help="V cache type: f16, or with flash attention q8_0, q4_0, q4_1, q5_0, q5_1")
FlashOpt = typer.Option("auto", "-fa", "--flash-attn",
                        help="flash attention: on (llama.cpp's CPU default numbers), off, auto (off unless -ctv is "
                             "quantized)")
