"""net.py — the `pi2 serve` and `pi2 pull` commands (registered on pi2/cli/app.py's Typer app) and the `-hf REPO`
option that run, serve and bench share: their flags become pi2.load's options, pi2.serve.serve's and pi2.hub's
calls; nothing here is imported beyond Typer and pi2's light modules until a command runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pi2.cli.app import app
from pi2.cli.load_flags import LoadModeOpt, NoMmapOpt, load_notes
from pi2.cli.options import (RUN, SAMPLE, BudgetOpt, CacheKOpt, CacheVOpt, DenseOpt, EngineOpt, FlashOpt, HfOpt,
                             IoOpt, KeepOpt, ModelArg, ModelOpt, NnapiLibOpt, NpuGbpsOpt, NpuOpt, PredOpt, ThreadsOpt,
                             VerboseOpt, _model_path)
from pi2.errors import Pi2Error, UsageError
from pi2.hub import pull as hub_pull
from pi2.runtime.config import parse_size


@app.command()
def serve(
    model: Optional[Path] = ModelArg, model_opt: Optional[Path] = ModelOpt, hf: Optional[str] = HfOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8080, "--port", help="port to listen on"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="PI2_API_KEY", show_default=False,
                                          help="require 'Authorization: Bearer KEY' on every endpoint but /health"),
    parallel: int = typer.Option(1, "-np", "--parallel", help="slots: requests generated at once, each with its "
                                                              "own context and prompt cache"),
    queue: int = typer.Option(64, "--queue", help="requests waiting for a slot before the server answers 503"),
    max_body: str = typer.Option("8M", "--max-body", help="largest request body (413 beyond it)"),
    stream_interval: float = typer.Option(20.0, "--stream-interval", metavar="MS",
                                          help="a stream writes what was decoded since its last write at most this "
                                               "often (the first piece at once; 0: every piece as it comes)"),
    batch: bool = typer.Option(True, "--batch/--no-batch", help="decode the busy slots' tokens in one step (one pass "
                                                                "over the weights; dense C contexts)"),
    chat_template_file: Optional[Path] = typer.Option(None, "--chat-template-file", show_default=False,
                                                      help="a Jinja chat template instead of the model's"),
    threads: int = ThreadsOpt,
    ctx_size: int = typer.Option(RUN.n_ctx, "-c", "--ctx-size", help="context size of each slot (0 = the model's)"),
    temp: float = typer.Option(SAMPLE.temp, "--temp", help="default temperature (a request's own wins)"),
    top_k: int = typer.Option(SAMPLE.top_k, "--top-k", help="default top-k (0 = off)"),
    top_p: float = typer.Option(SAMPLE.top_p, "--top-p", help="default top-p (1.0 = off)"),
    min_p: float = typer.Option(SAMPLE.min_p, "--min-p", help="default min-p (0 = off)"),
    repeat_penalty: float = typer.Option(SAMPLE.repeat_penalty, "--repeat-penalty", help="default repeat penalty"),
    repeat_last_n: int = typer.Option(SAMPLE.repeat_last_n, "--repeat-last-n", help="default penalty window"),
    engine: str = EngineOpt, keep: Optional[float] = KeepOpt, dense: bool = DenseOpt, use_predictor: bool = PredOpt,
    npu: str = NpuOpt, nnapi_lib: Optional[str] = NnapiLibOpt, npu_gbps: Optional[float] = NpuGbpsOpt,
    ctx_shift: bool = typer.Option(False, "--context-shift/--no-context-shift",
                                   help="a full slot drops half of its context after the kept tokens and goes on, "
                                        "and a conversation extended after it goes on from there (llama-server's)"),
    keep_tokens: int = typer.Option(0, "--keep-tokens", help="tokens a context shift keeps after BOS (llama.cpp's "
                                    "--keep)"),
    memory_budget: Optional[str] = BudgetOpt, io: str = IoOpt, no_mmap: bool = NoMmapOpt,
    load_mode: Optional[str] = LoadModeOpt, cache_k: str = CacheKOpt, cache_v: str = CacheVOpt,
    flash_attn: str = FlashOpt, verbose: bool = VerboseOpt,
    expert_profile: bool = typer.Option(True, "--expert-profile/--no-expert-profile",
                                        help="a MoE file whose experts stream: learn its hot experts while serving "
                                             "and add the slots' routing to its routing profile at shutdown (the "
                                             "next run starts with them resident)"),
):
    """Serve a model over HTTP, OpenAI-compatible (like llama-server): /v1/chat/completions, /v1/completions,
    /v1/models, /health, /tokenize, /detokenize."""
    path = _model_path(model, model_opt, hf)
    _, no_mmap = load_notes(no_mmap, False, load_mode, locks=False)
    template = None
    if chat_template_file is not None:
        try:
            template = chat_template_file.read_text()
        except OSError as e:
            raise UsageError(f"cannot read {chat_template_file}: {e.strerror}") from None
    try:
        from pi2.serve.main import serve as run_server
    except ImportError as e:
        raise Pi2Error(f"pi2 serve needs {e.name}, which is not installed",
                       hint="pip install 'pi2[serve]' (starlette and uvicorn)") from None
    run_server(path, host=host, port=port, api_key=api_key, n_parallel=parallel, max_queue=queue,
               max_body=parse_size(max_body), chat_template=template, batched=batch,
               stream_interval_ms=stream_interval,
               n_ctx=ctx_size, n_threads=threads, engine=engine, keep=keep, dense=dense, predictor=use_predictor,
               memory_budget=memory_budget, io=io, npu=npu, nnapi_lib=nnapi_lib, npu_gbps=npu_gbps, no_mmap=no_mmap,
               ctx_shift=ctx_shift, n_keep=keep_tokens, expert_profile=expert_profile, cache_type_k=cache_k,
               cache_type_v=cache_v, flash_attn=flash_attn,
               temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
               repeat_last_n=repeat_last_n)


@app.command()
def pull(
    repo: str = typer.Argument(..., metavar="REPO[:QUANT|/FILE]",
                               help="a Hugging Face repository, with a quant tag (user/repo:Q4_K_M) or a file "
                                    "(user/repo/model-q8_0.gguf); without either, Q4_K_M or the first GGUF"),
    revision: Optional[str] = typer.Option(None, "--revision", help="branch, tag or commit (default main)"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress bar"),
    verbose: bool = VerboseOpt,
):
    """Download a GGUF model from Hugging Face into the hub's shared cache (resumed, checksum verified; a split
    GGUF whole) and print its path."""
    print(hub_pull(repo, revision=revision, progress=not quiet))
