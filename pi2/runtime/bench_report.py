"""bench_report.py — what `pi2 bench` prints, in llama-bench's formats so both tools' results merge.

Owns: llama-bench's model description (`arch size-class ftype`, named as llama.cpp names it), build and
CPU identification, the record fields (llama-bench's names, then pi2_*), and the md / csv / json / jsonl
printers. `markdown_rows` also formats records merged from both tools (scripts/bench_vs_llamacpp.sh).
Does not: time anything (bench.py); its statistics of the timings (summarize) are here.
"""
from __future__ import annotations

import csv
import functools
import json
import platform
import statistics
import subprocess
from pathlib import Path

import pi2

# llama.cpp's llm_type by layer count (src/models/{llama,qwen2,gemma3}.cpp); anything else is "?B"
_SIZE_CLASS = {
    "llama": lambda c: {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M",
                        32: "3B" if c.n_vocab == 49152 else ("7B" if c.n_vocab < 40000 else "8B"),
                        36: "8B", 40: "13B", 48: "34B", 60: "30B",
                        80: "65B" if c.n_head == c.n_head_kv else "70B"}.get(c.n_layer),
    "qwen2": lambda c: {24: "0.5B" if c.n_embd == 1024 else "1B", 28: "1.5B" if c.n_embd == 1536 else "7B",
                        32: "7B", 36: "3B", 40: "4B" if c.n_head == 20 else "13B", 48: "14B", 64: "32B",
                        80: "70B"}.get(c.n_layer),
    "gemma3": lambda c: {18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"}.get(c.n_layer),
}
# llama_ftype_name by general.file_type
_FTYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
                11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small",
                15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 32: "BF16"}
# the file type llama.cpp guesses from the most common tensor type when general.file_type is missing
_GUESS = {"F32": 0, "F16": 1, "BF16": 32, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7, "Q2_K": 10,
          "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18}


def _loader_order(name: str) -> tuple:
    """llama.cpp's weight_name_comparer: by block number (non-block tensors first), then by name."""
    parts = name.split(".")
    layer = int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else -1
    return layer, name


def ftype_name(kv: dict, tensors: dict) -> str:
    ft = kv.get("general.file_type")
    if ft is not None:
        return _FTYPE_NAMES.get(int(ft), "unknown, may not work")
    counts: dict = {}
    best, best_n = "F32", 0
    for name in sorted(tensors, key=_loader_order):
        tn = tensors[name].type_name
        counts[tn] = counts.get(tn, 0) + 1
        if counts[tn] > best_n:
            best, best_n = tn, counts[tn]
    return "(guessed) " + _FTYPE_NAMES[_GUESS.get(best, 0)]


def model_type(model) -> str:
    c = model.config
    size = _SIZE_CLASS.get(c.arch, lambda _: None)(c) or "?B"
    return f"{c.arch} {size} {ftype_name(model.file.kv, model.file.tensors)}"


def model_info(model) -> dict:
    return {"model_filename": str(model.path), "model_type": model_type(model),
            "model_size": int(model.n_bytes), "model_n_params": int(model.n_params)}


@functools.lru_cache(maxsize=None)
def build_info() -> tuple:
    """(git short hash, commit count) of the pi2 checkout this runs from, else ("unknown", 0). The hash
    ends in "-dirty" when tracked files differ from that commit, so numbers are not credited to it."""
    root = Path(pi2.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return "unknown", 0

    def git(*args, check=True):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=check)
    try:
        commit = git("rev-parse", "--short", "HEAD").stdout.strip()
        dirty = git("diff", "--quiet", "HEAD", "--", check=False).returncode == 1
        return commit + ("-dirty" if dirty else ""), int(git("rev-list", "--count", "HEAD").stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown", 0


@functools.lru_cache(maxsize=None)
def cpu_info() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def record(t, info: dict, engine: str, test_time: str, rss: int, extra: dict) -> dict:
    """One result with llama-bench's field names (and order) followed by pi2_* fields."""
    commit, number = build_info()
    rec = {"build_commit": commit, "build_number": number, "cpu_info": cpu_info(), "gpu_info": "",
           "backends": "CPU", **info, "n_batch": t.n_batch, "n_threads": t.n_threads, "type_k": t.type_k,
           "type_v": t.type_v, "n_gpu_layers": 0, "flash_attn": FA_IDS[getattr(t, "flash_attn", "auto")],
           "load_mode": t.load_mode, "n_prompt": t.n_prompt,
           "n_gen": t.n_gen, "n_depth": 0,
           "test_time": test_time}
    rec.update(summarize(t.samples_ns, t.n_prompt + t.n_gen))
    rec.update({"pi2_version": pi2.__version__, "pi2_engine": engine, "pi2_peak_rss": rss})
    rec.update({f"pi2_{k}": v for k, v in extra.items()})
    return rec


def summarize(samples_ns: list, n_tokens: int) -> dict:
    """llama-bench's statistics: mean and sample standard deviation of ns and of per-repetition t/s."""
    ts = [1e9 * n_tokens / ns for ns in samples_ns]
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    return {"avg_ns": int(statistics.mean(samples_ns)), "stddev_ns": int(sd(samples_ns)),
            "avg_ts": round(statistics.mean(ts), 6), "stddev_ts": round(sd(ts), 6),
            "samples_ns": list(samples_ns), "samples_ts": [round(x, 3) for x in ts]}


def test_name(rec: dict) -> str:
    pp, tg = rec["n_prompt"], rec["n_gen"]
    name = f"pp{pp}" if tg == 0 else f"tg{tg}" if pp == 0 else f"pp{pp}+tg{tg}"
    return name + (f" @ d{rec['n_depth']}" if rec.get("n_depth") else "")


def human_size(n: int) -> str:
    return f"{n / 1024 ** 2:.2f} MiB" if n < 1024 ** 3 else f"{n / 1024 ** 3:.2f} GiB"


def human_params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


FA_IDS = {"auto": -1, "off": 0, "on": 1}   # llama_flash_attn_type, as llama-bench prints -fa

# (field, header, printf-style width: negative = left-aligned), as llama-bench's markdown_printer
_MD = {"model": ("model", -30), "size": ("size", 10), "params": ("params", 10), "backend": ("backend", -10),
       "n_threads": ("threads", 7), "n_batch": ("n_batch", 7), "type_k": ("type_k", 6), "type_v": ("type_v", 6),
       "flash_attn": ("fa", 3), "load_mode": ("lm", 10),
       "pi2_engine": ("engine", -10),
       "test": ("test", 15), "t/s": ("t/s", 20)}


def markdown_columns(n_batch_varies: bool = False, engine: bool = False, type_k: bool = False,
                     type_v: bool = False, load_mode: bool = False, flash_attn: bool = False) -> list:
    """llama-bench's CPU columns; n_batch, type_k, type_v and load_mode when non-default, pi2 extras just before
    `test`."""
    cols = ["model", "size", "params", "backend", "n_threads"]
    cols += ["n_batch"] if n_batch_varies else []
    cols += ["type_k"] if type_k else []
    cols += ["type_v"] if type_v else []
    cols += ["flash_attn"] if flash_attn else []
    cols += ["load_mode"] if load_mode else []
    cols += ["pi2_engine"] if engine else []
    return cols + ["test", "t/s"]


def _cell(rec: dict, col: str) -> str:
    if col == "model":
        return rec["model_type"]
    if col == "size":
        return human_size(rec["model_size"])
    if col == "params":
        return human_params(rec["model_n_params"])
    if col == "backend":
        return rec.get("backends") or "CPU"
    if col == "test":
        return test_name(rec)
    if col == "t/s":
        return f"{rec['avg_ts']:.2f} ± {rec['stddev_ts']:.2f}"
    return str(rec.get(col, ""))


def _fmt(value: str, width: int) -> str:
    return f"{value:<{-width}}" if width < 0 else f"{value:>{width}}"


def markdown_header(cols: list) -> str:
    head = "|" + "".join(f" {_fmt(_MD[c][0], _MD[c][1])} |" for c in cols)
    rule = "|" + "".join(f" {'-' * (abs(_MD[c][1]) - 1)}{':' if _MD[c][1] > 0 else '-'} |" for c in cols)
    return head + "\n" + rule


def markdown_row(rec: dict, cols: list) -> str:
    return "|" + "".join(f" {_fmt(_cell(rec, c), _MD[c][1])} |" for c in cols)


def markdown_rows(records: list, cols: list) -> str:
    return "\n".join([markdown_header(cols)] + [markdown_row(r, cols) for r in records])


def footer_line() -> str:
    return f"build: {build_info()[0]} (pi2 {pi2.__version__})"


class _Printer:
    def __init__(self, params, out):
        self.params, self.out = params, out

    def w(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def header(self) -> None: ...

    def footer(self) -> None: ...


class MarkdownPrinter(_Printer):
    def header(self) -> None:
        p = self.params
        engine = len(p.engines) > 1 or p.engines != ("auto",)
        self.cols = markdown_columns(p.n_batch != (2048,), engine, p.type_k != ("f16",), p.type_v != ("f16",),
                                      p.load_mode != ("mmap",), getattr(p, "flash_attn", ("auto",)) != ("auto",))
        self.w(markdown_header(self.cols) + "\n")

    def test(self, rec: dict) -> None:
        self.w(markdown_row(rec, self.cols) + "\n")

    def footer(self) -> None:
        self.w("\n" + footer_line() + "\n")


class JsonPrinter(_Printer):
    first = True

    def header(self) -> None:
        self.w("[\n")

    def test(self, rec: dict) -> None:
        lines = [f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in rec.items()]
        self.w(("" if self.first else ",\n") + "  {\n" + ",\n".join(lines) + "\n  }")
        self.first = False

    def footer(self) -> None:
        self.w(("" if self.first else "\n") + "]\n")


class JsonlPrinter(_Printer):
    def test(self, rec: dict) -> None:
        self.w(json.dumps(rec, ensure_ascii=False) + "\n")


class CsvPrinter(_Printer):
    """llama-bench's CSV: a header line, then every value quoted; no per-repetition samples. The columns
    are those of the first record (a later record's extra pi2_* fields are dropped, missing ones empty)."""
    fields = None

    def test(self, rec: dict) -> None:
        writer = csv.writer(self.out, quoting=csv.QUOTE_ALL, lineterminator="\n")
        if self.fields is None:
            self.fields = [k for k in rec if k not in ("samples_ns", "samples_ts")]
            self.out.write(",".join(self.fields) + "\n")
        writer.writerow([_csv_value(rec.get(k)) for k in self.fields])
        self.out.flush()


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    return f"{v:.6f}" if isinstance(v, float) else str(v)


def printer(params, out) -> _Printer:
    cls = {"md": MarkdownPrinter, "json": JsonPrinter, "jsonl": JsonlPrinter, "csv": CsvPrinter}[params.output]
    return cls(params, out)
