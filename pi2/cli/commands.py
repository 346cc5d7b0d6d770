"""commands.py — the library functions behind each CLI command but run's: they open what the command needs through
the runtime and decide what is printed where; `plan`, `tokenize`, `info`, `devices`, `profile-io` and `bench` print
their results on stdout, `perplexity` its progress on stderr and the final estimate on stdout. `pi2 run`'s three
modes (run, interactive, chat) and their RunOptions are in pi2/cli/run_chat.py, reached through here so that
pi2/cli/app.py imports one module when a command runs.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from pi2 import convert as cv
from pi2.cli.report import verbose_report
from pi2.cli.run_chat import RunOptions, chat, interactive, run  # noqa: F401 — pi2 run's, for app.py
from pi2.convert.predictor import Spec
from pi2.errors import FileError, UsageError
from pi2.model.info import describe
from pi2.model.loader import load_model
from pi2.plan.experts import profile_experts as run_profile
from pi2.plan import devices as dv
from pi2.plan import profile
from pi2.runtime import bench as rb
from pi2.runtime.config import RunConfig
from pi2.runtime.perplexity import format_final, perplexity as ppl
from pi2.runtime.plan import plan_run
from pi2.runtime.session import open_model, open_session


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
