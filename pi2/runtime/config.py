"""config.py — what a run is asked to do: RunConfig (how the model runs) and SamplerParams (how tokens are drawn).

Owns: every run option's default (the CLI, bench and the Python API build these objects by keyword and state no
defaults of their own), the check of each value (one-line usage errors), and memory sizes as users write them
(500M, 1.5G).
Imports nothing heavy (no numpy, no engine): the CLI builds these objects before a command runs, and `pi2 --help`
stays fast.
"""
from __future__ import annotations

import math
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
    n_batch: int = 512                  # -b / -ub: tokens of a prompt computed in one pass
    ctx_shift: bool = False             # --context-shift: a full context drops half of what follows n_keep
    n_keep: int = 0                     # --keep-tokens: tokens a context shift keeps (after BOS, as llama.cpp)
    repack: bool = True                 # --no-repack: dense matrices stay in the file's layout (same results)
    no_mmap: bool = False               # --no-mmap: the C engine reads the whole file into memory at load
    expert_profile: bool = True         # --no-expert-profile: a run streaming a MoE file's experts neither learns hot
                                        # experts nor adds its routing to the file's routing profile
    cache_type_k: str = "f16"           # -ctk: the K cache's type (f16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1)
    cache_type_v: str = "f16"           # -ctv: the V cache's type (f16, or with flash attention as -ctk's types)
    flash_attn: str = "auto"            # -fa: on | off | auto (off unless -ctv is quantized: see `flash`)

    @property
    def type_k(self) -> int:
        """The K cache's ggml type id."""
        return cache_type("-ctk", self.cache_type_k)

    @property
    def type_v(self) -> int:
        """The V cache's ggml type id."""
        return cache_type("-ctv", self.cache_type_v)

    @property
    def flash(self) -> bool:
        """Whether attention takes llama.cpp's flash-attention numbers. `auto` is off (the goldens' and the more
        precise path: F32 softmax weights, no F16 accumulator) unless the V cache is quantized, which only flash
        attention computes: then on, as llama.cpp's auto is on the CPU."""
        return self.flash_attn == "on" or (self.flash_attn == "auto" and self.type_v != 1)

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise UsageError(f"unknown engine '{self.engine}' (choose from {', '.join(ENGINES)})")
        if self.keep is not None and not 0.0 < self.keep <= 1.0:
            tokens = self.keep == -1 or (self.keep > 1 and float(self.keep).is_integer())
            raise UsageError(f"invalid --keep {self.keep:g}: pi2's --keep is a fraction of the FFN neurons in (0, 1]",
                             hint=f"llama.cpp's --keep N (tokens a context shift keeps) is pi2's --keep-tokens N"
                             if tokens else "")
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
        if self.n_keep < 0:
            raise UsageError(f"invalid --keep-tokens {self.n_keep}: it must be >= 0")
        if not 1 <= self.n_batch <= 65536:
            raise UsageError(f"invalid batch size {self.n_batch}: it must be in [1, 65536]")
        if self.n_threads < 0:
            object.__setattr__(self, "n_threads", 0)
        cache_type("-ctk", self.cache_type_k), cache_type("-ctv", self.cache_type_v)
        object.__setattr__(self, "flash_attn", flash_mode(self.flash_attn))
        if self.flash_attn == "off" and cache_type("-ctv", self.cache_type_v) != 1:
            raise UsageError(f"-ctv {self.cache_type_v}: a quantized V cache needs flash attention (-fa on or auto), "
                             "as llama.cpp says", hint="-fa off keeps -ctv f16")
        object.__setattr__(self, "cache_type_k", self.cache_type_k.strip().lower())
        object.__setattr__(self, "cache_type_v", self.cache_type_v.strip().lower())


KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7}   # -ctk values pi2 computes with, by
# ggml type id (reference/kv_cache.py)
V_TYPES = KV_TYPES                     # -ctv: types other than F16 with flash attention only (llama.cpp's rule)
FLASH_MODES = {"on": "on", "off": "off", "auto": "auto", "1": "on", "0": "off", "true": "on", "false": "off",
               "enabled": "on", "disabled": "off"}


def flash_mode(value) -> str:
    """A -fa value (llama.cpp's on | off | auto; 1 / 0 as llama-bench lists them) as on, off or auto."""
    v = str(value).strip().lower()
    if v not in FLASH_MODES:
        raise UsageError(f"-fa {value}: expected on, off or auto")
    return FLASH_MODES[v]
_QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
_OTHER_TYPES = ("f32", "bf16", "iq4_nl")


def cache_type(flag: str, value: str) -> int:
    """The ggml type id of a -ctk / -ctv value; a UsageError saying what pi2 computes with otherwise."""
    v = str(value).strip().lower()
    table = KV_TYPES if flag == "-ctk" else V_TYPES
    if v in table:
        return table[v]
    known = "known to llama.cpp but not computed by pi2" if v in _OTHER_TYPES else "not a cache type"
    raise UsageError(f"{flag} {value}: {known}; pi2's {'K' if flag == '-ctk' else 'V'} cache holds "
                     f"{', '.join(table)}")


SAMPLER_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_SAMPLER_ALIASES = {"top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "typical-p": "typ_p", "typical": "typ_p",
                    "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p", "temp": "temperature", "top-n-sigma": "top_n_sigma"}
_SAMPLER_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                  "m": "min_p", "x": "xtc", "t": "temperature"}


def parse_samplers(text: str) -> tuple:
    """`--samplers` (names separated by ';', as llama.cpp; ',' too) or `--sampling-seq` letters (e.g. 'edskypmxt')."""
    parts = [t.strip() for t in re.split(r"[;,]", text) if t.strip()]
    if len(parts) == 1 and parts[0] not in SAMPLER_NAMES and parts[0] not in _SAMPLER_ALIASES and \
            all(ch in _SAMPLER_CHARS for ch in parts[0]):
        return tuple(_SAMPLER_CHARS[ch] for ch in parts[0])
    out = []
    for t in parts:
        name = _SAMPLER_ALIASES.get(t.lower(), t.lower())
        if name not in SAMPLER_NAMES:
            raise UsageError(f"unknown sampler {t!r} in --samplers", hint="choose from " + ";".join(SAMPLER_NAMES))
        out.append(name)
    return tuple(out)


def _finite(flag: str, v, lo=None, hi=None, lo_open=False, hi_open=False, what=""):
    """A usage error unless v is a finite number in [lo, hi] (open ends where asked)."""
    bad = not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or \
        (hi is not None and (v >= hi if hi_open else v > hi))
    if bad:
        rng = what or f"{'(' if lo_open else '['}{lo if lo is not None else '-inf'}, " \
                      f"{hi if hi is not None else 'inf'}{')' if hi_open else ']'}"
        raise UsageError(f"invalid {flag} {v:g}: it must be {rng}")


@dataclass(frozen=True, **_KW)
class SamplerParams:
    """llama.cpp's sampler chain (pi2/runtime/sampling.py): the stages of `samplers` in order, then the draw; with
    mirostat 1 or 2, temperature then mirostat instead. Defaults are llama.cpp's (common/common.h)."""
    temp: float = 0.8                   # --temp: <= 0 is greedy
    top_k: int = 40                     # --top-k: 0 = off
    top_p: float = 0.95                 # --top-p: 1.0 = off
    min_p: float = 0.05                 # --min-p: 0 = off
    repeat_penalty: float = 1.0         # --repeat-penalty: 1.0 = off
    repeat_last_n: int = 64             # --repeat-last-n: 0 = off, -1 = the context size
    frequency_penalty: float = 0.0      # --frequency-penalty: 0 = off
    presence_penalty: float = 0.0       # --presence-penalty: 0 = off
    seed: int = -1                      # -s: -1 = a random seed
    typ_p: float = 1.0                  # --typical: locally typical sampling, 1.0 = off
    top_n_sigma: float = -1.0           # --top-nsigma: keep logits within n standard deviations of the max, <= 0 off
    xtc_probability: float = 0.0        # --xtc-probability: chance of removing the top tokens, 0 = off
    xtc_threshold: float = 0.1          # --xtc-threshold: tokens above it are removed (all but the last), > 0.5 off
    dynatemp_range: float = 0.0         # --dynatemp-range: temperature in temp +- range by entropy, 0 = off
    dynatemp_exponent: float = 1.0      # --dynatemp-exp
    mirostat: int = 0                   # --mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (replaces the chain)
    mirostat_tau: float = 5.0           # --mirostat-ent: target entropy
    mirostat_eta: float = 0.1           # --mirostat-lr: learning rate
    dry_multiplier: float = 0.0         # --dry-multiplier: 0 = off
    dry_base: float = 1.75              # --dry-base
    dry_allowed_length: int = 2         # --dry-allowed-length
    dry_penalty_last_n: int = -1        # --dry-penalty-last-n: 0 = off, -1 = the context size
    dry_sequence_breakers: tuple = ("\n", ":", "\"", "*")   # --dry-sequence-breaker
    samplers: tuple = SAMPLER_NAMES     # --samplers: the stages in order
    min_keep: int = 0                   # --min-keep: stages keep at least this many tokens (0 = off)

    def __post_init__(self):
        if isinstance(self.samplers, str):
            object.__setattr__(self, "samplers", parse_samplers(self.samplers))
        else:
            object.__setattr__(self, "samplers", tuple(self.samplers))
        for name in self.samplers:
            if name not in SAMPLER_NAMES:
                raise UsageError(f"unknown sampler {name!r}", hint="choose from " + ";".join(SAMPLER_NAMES))
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        _finite("--temp", self.temp)
        _finite("--top-p", self.top_p, 0.0, 1.0)
        _finite("--min-p", self.min_p, 0.0, 1.0)
        _finite("--typical", self.typ_p, 0.0, 1.0)
        _finite("--repeat-penalty", self.repeat_penalty, 0.0, lo_open=True, what="positive (1.0 = off)")
        _finite("--frequency-penalty", self.frequency_penalty)
        _finite("--presence-penalty", self.presence_penalty)
        _finite("--top-nsigma", self.top_n_sigma)
        _finite("--xtc-probability", self.xtc_probability, 0.0, 1.0)
        _finite("--xtc-threshold", self.xtc_threshold, 0.0, 1.0)
        _finite("--dynatemp-range", self.dynatemp_range, 0.0)
        _finite("--dynatemp-exp", self.dynatemp_exponent)
        _finite("--mirostat-ent", self.mirostat_tau, 0.0)
        _finite("--mirostat-lr", self.mirostat_eta, 0.0)
        _finite("--dry-multiplier", self.dry_multiplier, 0.0)
        _finite("--dry-base", self.dry_base, 1.0, what=">= 1")
        if self.top_k < 0:
            raise UsageError(f"invalid --top-k {self.top_k}: it must be >= 0 (0 = off)")
        if self.mirostat not in (0, 1, 2):
            raise UsageError(f"invalid --mirostat {self.mirostat}: 0 (off), 1 or 2")
        if self.repeat_last_n < -1:
            raise UsageError(f"invalid --repeat-last-n {self.repeat_last_n}: -1 (context size), 0 (off) or positive")
        if self.dry_penalty_last_n < -1:
            raise UsageError(f"invalid --dry-penalty-last-n {self.dry_penalty_last_n}: -1 (context size), 0 (off) "
                             "or positive")
        if self.dry_allowed_length < 0:
            raise UsageError(f"invalid --dry-allowed-length {self.dry_allowed_length}: it must be >= 0")
        if self.min_keep < 0:
            raise UsageError(f"invalid --min-keep {self.min_keep}: it must be >= 0")
