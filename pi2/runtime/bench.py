"""bench.py — `pi2 bench`: llama-bench's method and output for pi2's engines.

Owns: the flag values (lists and ranges as llama-bench parses them), the test list (models × engines ×
batch sizes × threads × pp / tg / pp+tg), the timed loop (one warm-up, then -r repetitions; random ids
made before the clock starts, no sampling), and the records, with llama-bench's field names plus pi2_*
fields: every figure of the session's stats() (for example cache_hit_rate, flash_bytes_per_token) is reported
as pi2_<key>.
Does not: compute (pi2/runtime/session.py opens the engines), print (bench_report.py) or parse argv (pi2/cli/).
"""
from __future__ import annotations

import os
import random
import re
import resource
import sys
import time
from dataclasses import dataclass, field, replace

from pi2.engine import default_threads
from pi2.errors import UsageError
from pi2.runtime import bench_report as report
from pi2.runtime.config import DEFAULT_CTX, ENGINES, RunConfig, cache_type, flash_mode
from pi2.runtime.session import open_model, open_session

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
    type_k: tuple = ("f16",)         # -ctk: K cache types (llama-bench's lists)
    type_v: tuple = ("f16",)         # -ctv
    flash_attn: tuple = ("auto",)    # -fa: on / off / auto per test (llama-bench's 0,1 lists)
    load_mode: tuple = ("mmap",)     # -lm / -mmp: mmap (the file mapped) or none (read into memory, --no-mmap)
    engines: tuple = ("auto",)
    reps: int = 5
    output: str = "md"
    warmup: bool = True
    progress: bool = False
    run: RunConfig = field(default_factory=RunConfig)   # every test's run options; engine, threads and context per test


@dataclass
class Test:
    """One row: a model run on one engine with one thread count, for n_prompt then n_gen tokens."""
    model: str
    engine: str
    n_batch: int
    n_threads: int
    n_prompt: int
    n_gen: int
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"
    load_mode: str = "mmap"
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
        if last < first:
            raise UsageError(f"invalid range '{m[0].rstrip(',')}' for {flag}: it ends below where it starts",
                             hint=f"write it from low to high, like {last}-{first}")
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


def _types(values, flag: str) -> tuple:
    """-ctk / -ctv lists (comma-separated, repeatable), each checked as RunConfig checks it."""
    out = tuple(v.strip().lower() for s in values or () for v in str(s).split(",") if v.strip()) or ("f16",)
    for v in out:
        cache_type(flag, v)
    return out


def _flash(values) -> tuple:
    """-fa lists (llama-bench's 0,1; on, off, auto also), in the order given."""
    out = tuple(flash_mode(v) for s in values or () for v in str(s).split(",") if v.strip()) or ("auto",)
    return tuple(dict.fromkeys(out))


# -lm values pi2 bench times: llama.cpp's load modes that mean mapping the file or reading it into memory
_LOAD_MODES = {"auto": "mmap", "mmap": "mmap", "none": "none", "dio": "none"}


def _load_modes(load_mode, mmap) -> tuple:
    """-lm lists (0c1e570's llama-bench) and -mmp / --mmap 0,1 lists (earlier llama-bench's) as the modes timed, in
    the order given (duplicates dropped); mmap when neither is given."""
    out = []
    for s in load_mode or ():
        for v in (v.strip().lower() for v in str(s).split(",")):
            if v in ("mlock", "mmap+mlock"):
                raise UsageError(f"-lm {v} is not timed by pi2 bench: it locks pages only in pi2 run",
                                 hint="use -lm mmap or -lm none")
            if v not in _LOAD_MODES:
                raise UsageError(f"invalid value '{v}' for -lm", hint="-lm takes auto, mmap, none or dio (a list: "
                                 "mmap,none)")
            out.append(_LOAD_MODES[v])
    for s in mmap or ():
        for v in (v.strip() for v in str(s).split(",")):
            if v not in ("0", "1"):
                raise UsageError(f"invalid value '{v}' for -mmp", hint="-mmp takes 0 (read into memory) or 1 (map), "
                                 "or a list: 0,1")
            out.append("mmap" if v == "1" else "none")
    return tuple(dict.fromkeys(out)) or ("mmap",)


def make_params(models, n_prompt=None, n_gen=None, pg=None, batch=None, threads=None, reps=5, output="md",
                engine="auto", warmup=True, progress=False, run: RunConfig | None = None, type_k=None,
                type_v=None, load_mode=None, mmap=None, flash_attn=None) -> BenchParams:
    """Validate raw flag values (strings as typed; each flag may repeat) into BenchParams; run: the options every
    test shares (RunConfig's defaults when None); load_mode / mmap: the -lm and -mmp lists."""
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
                    n_threads=_ints(threads, "-t", (), 1), type_k=_types(type_k, "-ctk"), type_v=_types(type_v, "-ctv"),
                    flash_attn=_flash(flash_attn), load_mode=_load_modes(load_mode, mmap), engines=engines, reps=reps,
                    output=output, warmup=warmup, progress=progress, run=run or RunConfig())
    if "off" in p.flash_attn and any(v != "f16" for v in p.type_v):
        raise UsageError("-fa 0 with a quantized -ctv: a quantized V cache needs flash attention, as llama.cpp says")
    if not any(p.n_prompt) and not any(p.n_gen) and not p.n_pg:
        raise UsageError("nothing to run: every test is skipped (-p 0 and -n 0, no -pg)")
    return p


def tests_for(p: BenchParams, model: str) -> list:
    """llama-bench's order: per model, parameters outer to inner, then pp tests, tg tests, pp+tg tests."""
    out = []
    for engine in p.engines:
        for nb in p.n_batch:
            for tk, tv, fa, lm in ((tk, tv, fa, lm) for tk in p.type_k for tv in p.type_v for fa in p.flash_attn
                                   for lm in p.load_mode):
                for nt in p.n_threads or (default_threads(),):
                    kv = {"type_k": tk, "type_v": tv, "flash_attn": fa, "load_mode": lm}
                    out += [Test(model, engine, nb, nt, n, 0, **kv) for n in p.n_prompt if n > 0]
                    out += [Test(model, engine, nb, nt, 0, n, **kv) for n in p.n_gen if n > 0]
                    out += [Test(model, engine, nb, nt, pp, tg, **kv) for pp, tg in p.n_pg]
    return out


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes."""
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
    need = max(t.n_prompt + t.n_gen for t in tests)
    return need + 1 if need == DEFAULT_CTX else need   # RunConfig caps exactly DEFAULT_CTX at the training context


def run_model(p: BenchParams, path: str, emit, log) -> None:
    """Run every test on one model; `emit(record)` is called as each test finishes."""
    tests = tests_for(p, path)
    model = open_model(path)
    try:
        info = report.model_info(model)
        tok = model.tokenizer
        bos = tok.bos_id if tok.add_bos else None
        n_ctx = _ctx_size(tests)
        groups: dict = {}
        for t in tests:
            groups.setdefault((t.engine, t.n_threads, t.type_k, t.type_v, t.flash_attn, t.load_mode), []).append(t)
        for (engine, nt, tk, tv, fa, lm), group in groups.items():
            session = open_session(model, replace(p.run, n_ctx=n_ctx, n_threads=nt, engine=engine, cache_type_k=tk,
                                                  cache_type_v=tv, flash_attn=fa, no_mmap=lm == "none"))
            resolved = session.engine
            log(f"pi2 bench: {os.path.basename(path)}: {info['model_type']}, engine {resolved}, {nt} thread(s)"
                + (" (threads have no effect on the reference engine)" if resolved == "reference" and nt > 1 else ""))
            runner = _Runner(session.ctx, model.config.n_vocab, bos)
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
                emit(report.record(t, info, resolved, test_time, peak_rss(), session.stats()))
            del session, runner
    finally:
        model.close()


def run(p: BenchParams, out=None, err=None) -> None:
    """Run the benchmark; results on `out` (stdout) in p.output format, diagnostics on `err` (stderr)."""
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
