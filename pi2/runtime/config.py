"""config.py — what a run is asked to do: RunConfig (how the model runs) and SamplerParams (how tokens are drawn).

Owns: every run option's default (the CLI, bench and the Python API build these objects by keyword and state no
defaults of their own), the check of each value (one-line usage errors), and memory sizes as users write them
(500M, 1.5G).
Imports nothing heavy (no numpy, no engine): the CLI builds these objects before a command runs, and `pi2 --help`
stays fast.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from pi2.errors import UsageError

ENGINES = ("auto", "c", "reference")     # auto: the C engine, or the reference for what C cannot run
NPU_MODES = ("auto", "nnapi", "off")
IO_BACKENDS = ("auto", "uring", "aio", "pread", "mmap")    # --io: the probe's choice, or one of csrc/io/'s backends
_IO_ALIASES = {"io_uring": "uring", "linux-aio": "aio", "libaio": "aio"}
DEFAULT_CTX = 4096                       # capped at the model's training context (pi2/runtime/plan.py)
_KW = {"kw_only": True} if sys.version_info >= (3, 10) else {}   # keyword-only where Python has it

MiB = 1 << 20
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": MiB, "MB": MiB, "MIB": MiB,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes in '500M', '1.5G', '800MiB', '65536' (K, M, G are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"invalid memory size {text!r}", hint="write it like 500M or 1.5G")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise UsageError(f"invalid memory size {text!r}: it must be positive")
    return n


def parse_io(value: str) -> str:
    """The backend a `--io` value names: auto, uring, aio, pread or mmap (io_uring, linux-aio accepted)."""
    v = _IO_ALIASES.get(value.strip().lower(), value.strip().lower())
    if v not in IO_BACKENDS:
        raise UsageError(f"--io must be one of {', '.join(IO_BACKENDS)}, not {value!r}")
    return v


@dataclass(frozen=True, **_KW)
class RunConfig:
    """How a model runs: the engine, its context and threads, which FFN neurons it computes, the memory it may
    hold and the devices it uses. One per opened model and context (pi2/runtime/plan.py plans it)."""
    n_ctx: int = DEFAULT_CTX            # -c: context size; 0 = the model's training context
    n_threads: int = 0                  # -t: threads; <= 0 = the cores this process may use
    engine: str = "auto"                # --engine: auto | c | reference
    keep: float | None = None           # --keep: model-wide mean FFN keep-fraction (None = the file's default)
    dense: bool = False                 # --dense: every FFN neuron
    predictor: bool = False             # --predictor: a pi2 file's own predictor chooses the gate rows it reads
    memory_budget: int | str | None = None   # --memory-budget: bytes (or '500M'); None = what the machine allows
    io: str = "auto"                    # --io: auto | uring | aio | pread | mmap
    npu: str = "auto"                   # --npu: auto | nnapi | off
    nnapi_lib: str | None = None        # --nnapi-lib: libneuralnetworks.so to open (None = the system's)
    npu_gbps: float | None = None       # --npu-gbps: the NPU's throughput to plan with (None = measured)
    repack: bool = True                 # --no-repack: dense matrices stay in the file's layout (same results)

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise UsageError(f"unknown engine '{self.engine}' (choose from {', '.join(ENGINES)})")
        if self.keep is not None and not 0.0 < self.keep <= 1.0:
            raise UsageError(f"invalid --keep {self.keep:g}: a fraction of the FFN neurons in (0, 1]")
        if self.n_ctx < 0:
            raise UsageError(f"invalid context size -c {self.n_ctx}", hint="-c 0 uses the model's training context")
        if self.npu not in NPU_MODES:
            raise UsageError(f"unknown --npu '{self.npu}' (choose from {', '.join(NPU_MODES)})")
        if self.npu_gbps is not None and not self.npu_gbps > 0:
            raise UsageError(f"invalid --npu-gbps {self.npu_gbps:g}: a positive throughput in GB/s")
        if isinstance(self.memory_budget, str):
            object.__setattr__(self, "memory_budget", parse_size(self.memory_budget))
        elif self.memory_budget is not None and self.memory_budget <= 0:
            raise UsageError(f"invalid --memory-budget {self.memory_budget}: it must be positive")
        object.__setattr__(self, "io", parse_io(self.io))
        if self.n_threads < 0:
            object.__setattr__(self, "n_threads", 0)


@dataclass(frozen=True, **_KW)
class SamplerParams:
    """llama.cpp's default sampler chain (pi2/runtime/sampling.py): penalties -> top-k -> top-p -> min-p -> temp."""
    temp: float = 0.8                   # --temp: <= 0 is greedy
    top_k: int = 40                     # --top-k: 0 = off
    top_p: float = 0.95                 # --top-p: 1.0 = off
    min_p: float = 0.05                 # --min-p: 0 = off
    repeat_penalty: float = 1.0         # --repeat-penalty: 1.0 = off
    repeat_last_n: int = 64             # --repeat-last-n: 0 = off, -1 = the context size
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = -1                      # -s: -1 = a random seed
