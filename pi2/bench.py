"""bench.py — `pi2 bench`: llama-bench's method and output for pi2's engines.

Owns: the flag values (lists and ranges as llama-bench parses them), the test list (models × engines ×
batch sizes × threads × pp / tg / pp+tg), the timed loop (one warm-up, then -r repetitions; random ids
made before the clock starts, no sampling), and the records, with llama-bench's field names plus pi2_*
fields. An engine context may add fields through a `bench_stats()` method returning a dict (for example
cache_hit_rate, flash_bytes_per_token); each key is reported as pi2_<key>.
Does not: compute (pi2.runtime opens the engines), print (bench_report.py) or parse argv (cli.py).
"""
from __future__ import annotations

import os
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field

from pi2.errors import UsageError

OUTPUTS = ("md", "json", "jsonl", "csv")
DEFAULT_BATCH = 2048


@dataclass(frozen=True)
class BenchParams:
    models: tuple
    n_prompt: tuple = (512,)
    n_gen: tuple = (128,)
    n_pg: tuple = ()                 # (pp, tg) pairs
    n_batch: tuple = (DEFAULT_BATCH,)
    n_threads: tuple = ()            # () = the cores this process may use
    engines: tuple = ("auto",)
    reps: int = 5
    output: str = "md"
    warmup: bool = True
    progress: bool = False
    keep: float | None = None        # --keep (None = the file's default)
    dense: bool = False              # --dense
    predictor: bool = True           # False: --no-predictor
    npu: str = "auto"                # --npu auto | nnapi | off
    nnapi_lib: str | None = None     # --nnapi-lib
    npu_gbps: float | None = None    # --npu-gbps (None = measured)
    memory_budget: int | None = None # --memory-budget, bytes: stream the FFN bundles
    io: str = "auto"                 # --io
    repack: bool = True              # False: --no-repack


@dataclass
class Test:
    """One row: a model run on one engine with one thread count, for n_prompt then n_gen tokens."""
    model: str
    engine: str
    n_batch: int
    n_threads: int
    n_prompt: int
    n_gen: int
    samples_ns: list = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.n_gen == 0:
            return f"pp{self.n_prompt}"
        return f"tg{self.n_gen}" if self.n_prompt == 0 else f"pp{self.n_prompt}+tg{self.n_gen}"


_RANGE = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?(?:,|$)")


def parse_int_range(s: str, flag: str) -> list:
    """llama-bench's list syntax: `1,2,4`, `first-last`, `first-last+step`, `first-last*mult`."""
    out, pos = [], 0
    while pos < len(s):
        m = _RANGE.match(s, pos)
        if not m or m.end() == pos:
            raise UsageError(f"invalid value '{s}' for {flag}",
                             hint="use a list like 1,2,4 or a range like 1-8 or 1-16*2")
        first = int(m[1])
        last = int(m[2]) if m[2] else first
        op, step = m[3] or "+", int(m[4]) if m[4] else 1
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise UsageError(f"invalid range '{m[0].rstrip(',')}' for {flag}: it does not advance")
            i = nxt
        pos = m.end()
    if not out:
        raise UsageError(f"no value given for {flag}")
    return out


def _ints(values, flag: str, default: tuple, minimum: int) -> tuple:
    if not values:
        return default
    out = [v for s in values for v in parse_int_range(str(s).strip(), flag)]
    bad = [v for v in out if v < minimum]
    if bad:
        raise UsageError(f"{flag} must be >= {minimum}, got {bad[0]}")
    return tuple(out)


def _pair(s: str) -> tuple:
    parts = str(s).split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"invalid value '{s}' for -pg", hint="-pg takes two numbers: prompt,gen (e.g. -pg 512,128)")
    pp, tg = (int(p) for p in parts)
    if pp == 0 and tg == 0:
        raise UsageError("-pg 0,0 runs nothing")
    return pp, tg


def make_params(models, n_prompt=None, n_gen=None, pg=None, batch=None, threads=None, reps=5, output="md",
                engine="auto", warmup=True, progress=False, keep=None, dense=False, npu="auto",
                nnapi_lib=None, memory_budget=None, io="auto", npu_gbps=None, predictor=True,
                repack=True) -> BenchParams:
    """Validate raw flag values (strings as typed; each flag may repeat) into BenchParams."""
    from pi2.npu import check_gbps, check_mode
    from pi2.runtime import ENGINES
    models = tuple(str(m) for m in models or ())
    if not models:
        raise UsageError("no model given", hint="pi2 bench -m MODEL.gguf [-p 512] [-n 128] [-t 1,2]")
    if output not in OUTPUTS:
        raise UsageError(f"unknown output format '{output}' (choose from {', '.join(OUTPUTS)})")
    if reps < 1:
        raise UsageError(f"-r must be >= 1, got {reps}")
    engines = tuple(e.strip() for e in str(engine).split(",") if e.strip()) or ("auto",)
    for e in engines:
        if e not in ENGINES:
            raise UsageError(f"unknown engine '{e}' (choose from {', '.join(ENGINES)})")
    p = BenchParams(models=models, n_prompt=_ints(n_prompt, "-p", (512,), 0), n_gen=_ints(n_gen, "-n", (128,), 0),
                    n_pg=tuple(_pair(s) for s in pg or ()), n_batch=_ints(batch, "-b", (DEFAULT_BATCH,), 1),
                    n_threads=_ints(threads, "-t", (), 1), engines=engines, reps=reps, output=output,
                    warmup=warmup, progress=progress, keep=keep, dense=dense, predictor=predictor,
                    npu=check_mode(npu), nnapi_lib=nnapi_lib, memory_budget=memory_budget, io=io,
                    npu_gbps=check_gbps(npu_gbps), repack=repack)
    if not any(p.n_prompt) and not any(p.n_gen) and not p.n_pg:
        raise UsageError("nothing to run: every test is skipped (-p 0 and -n 0, no -pg)")
    return p


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def tests_for(p: BenchParams, model: str) -> list:
    """llama-bench's order: per model, parameters outer to inner, then pp tests, tg tests, pp+tg tests."""
    out = []
    for engine in p.engines:
        for nb in p.n_batch:
            for nt in p.n_threads or (default_threads(),):
                out += [Test(model, engine, nb, nt, n, 0) for n in p.n_prompt if n > 0]
                out += [Test(model, engine, nb, nt, 0, n) for n in p.n_gen if n > 0]
                out += [Test(model, engine, nb, nt, pp, tg) for pp, tg in p.n_pg]
    return out


def engine_name(ctx) -> str:
    """The engine a context belongs to (what `auto` resolved to)."""
    name = getattr(ctx, "engine", None)
    if isinstance(name, str):
        return name
    cls = type(ctx).__name__
    return {"ReferenceContext": "reference", "CContext": "c"}.get(cls, cls)


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (0 where getrusage is missing)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class _Runner:
    """Times the tests of one model on one context; ids are random as in llama-bench (BOS first)."""

    def __init__(self, ctx, n_vocab: int, bos, seed: int = 1):
        self.ctx, self.n_vocab, self.bos = ctx, n_vocab, bos
        self.rng = random.Random(seed)

    def _ids(self, n: int) -> list:
        ids = [self.rng.randrange(self.n_vocab) for _ in range(n)]
        if ids and self.bos is not None:
            ids[0] = self.bos
        return ids

    def _prompt(self, ids: list, n_batch: int) -> None:
        for i in range(0, len(ids), n_batch):
            self.ctx.decode(ids[i:i + n_batch])

    def _gen(self, ids: list) -> None:
        for t in ids:
            self.ctx.decode([t])

    def once(self, n_prompt: int, n_gen: int, n_batch: int) -> int:
        """One repetition from an empty cache; returns nanoseconds spent decoding."""
        pp, tg = self._ids(n_prompt), self._ids(n_gen)
        self.ctx.reset()
        t0 = time.perf_counter_ns()
        if pp:
            self._prompt(pp, n_batch)
        if tg:
            self._gen(tg)
        return time.perf_counter_ns() - t0

    def warmup(self, t: Test) -> None:
        """llama-bench's warm-up: the whole prompt, and one generated token."""
        self.ctx.reset()
        if t.n_prompt:
            self._prompt(self._ids(t.n_prompt), t.n_batch)
        if t.n_gen:
            self._gen(self._ids(1))


def _ctx_size(tests: list) -> int:
    from pi2.runtime import DEFAULT_CTX
    need = max(t.n_prompt + t.n_gen for t in tests)
    return need + 1 if need == DEFAULT_CTX else need   # RunConfig caps exactly DEFAULT_CTX at the training context


def run_model(p: BenchParams, path: str, emit, log) -> None:
    """Run every test on one model; `emit(record)` is called as each test finishes."""
    from pi2 import bench_report as report
    from pi2.npu import bench_fields as npu_fields
    from pi2.runtime import RunConfig, open_context, open_model
    tests = tests_for(p, path)
    model = open_model(path)
    try:
        info = report.model_info(model)
        tok = model.tokenizer
        bos = tok.bos_id if tok.add_bos else None
        n_ctx = _ctx_size(tests)
        groups: dict = {}
        for t in tests:
            groups.setdefault((t.engine, t.n_threads), []).append(t)
        for (engine, nt), group in groups.items():
            ctx = open_context(model, RunConfig(n_ctx=n_ctx, n_threads=nt, engine=engine, keep=p.keep, dense=p.dense,
                                                predictor=p.predictor, npu=p.npu, nnapi_lib=p.nnapi_lib,
                                                memory_budget=p.memory_budget, io=p.io, npu_gbps=p.npu_gbps,
                                                repack=p.repack))
            resolved = engine_name(ctx)
            log(f"pi2 bench: {os.path.basename(path)}: {info['model_type']}, engine {resolved}, {nt} thread(s)"
                + (" (threads have no effect on the reference engine)" if resolved == "reference" and nt > 1 else ""))
            runner = _Runner(ctx, model.config.n_vocab, bos)
            for t in group:
                test_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                if p.warmup:
                    if p.progress:
                        log(f"pi2 bench: {t.name}, {nt} thread(s): warm-up")
                    runner.warmup(t)
                for i in range(p.reps):
                    if p.progress:
                        log(f"pi2 bench: {t.name}, {nt} thread(s): repetition {i + 1}/{p.reps}")
                    t.samples_ns.append(runner.once(t.n_prompt, t.n_gen, t.n_batch))
                stats = getattr(ctx, "bench_stats", None)
                extra = dict(stats()) if callable(stats) else {}
                extra.setdefault("ffn_keep", 1.0)       # engines without a sparse FFN compute every neuron
                extra.setdefault("ffn_bytes_per_token", dense_ffn_bytes(model))
                extra.update(npu_fields(ctx))
                emit(report.record(t, info, resolved, test_time, peak_rss(), extra))
            del ctx, runner
    finally:
        model.close()


def dense_ffn_bytes(model) -> int:
    """FFN weight bytes a dense token reads: every gate, up and down matrix."""
    return sum(t.nbytes for n, t in model.file.tensors.items()
               if n.endswith((".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight", ".ffn_down_t.weight")))


def summarize(samples_ns: list, n_tokens: int) -> dict:
    """llama-bench's statistics: mean and sample standard deviation of ns and of per-repetition t/s."""
    ts = [1e9 * n_tokens / ns for ns in samples_ns]
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    return {"avg_ns": int(statistics.mean(samples_ns)), "stddev_ns": int(sd(samples_ns)),
            "avg_ts": round(statistics.mean(ts), 6), "stddev_ts": round(sd(ts), 6),
            "samples_ns": list(samples_ns), "samples_ts": [round(x, 3) for x in ts]}


def run(p: BenchParams, out=None, err=None) -> None:
    """Run the benchmark; results on `out` (stdout) in p.output format, diagnostics on `err` (stderr)."""
    from pi2 import bench_report as report
    out, err = out or sys.stdout, err or sys.stderr

    def log(msg: str) -> None:
        print(msg, file=err, flush=True)

    printer = report.printer(p, out)
    started = False

    def emit(rec: dict) -> None:       # the header waits for a first result, so a bad file prints nothing
        nonlocal started
        if not started:
            printer.header()
            started = True
        printer.test(rec)
    try:
        for path in p.models:
            run_model(p, path, emit, log)
    finally:
        if started:
            printer.footer()
