"""llama_flags.py — llama.cpp's spellings on pi2's command line, before Typer parses it.

Owns: the llama.cpp flags that have no meaning in pi2 (GPU offload, flash attention, NUMA, logging colours, ...):
each is accepted with its value and one note on stderr, then removed; and the refusal of an unknown multi-letter
short flag by its full spelling (`-xyz`), which click would otherwise read as `-x yz`. The flags pi2 implements are
declared on the commands themselves (pi2/cli/app.py).
"""
from __future__ import annotations

import re
import sys

from pi2.errors import UsageError

_NUMBER = re.compile(r"-[0-9.]")

# flag spellings -> (takes a value, why pi2 ignores it)
_CPU_ONLY = "pi2 computes on the CPU (and NNAPI with --npu)"
NOTED: dict = {}


def _note(names: str, value: bool, why: str) -> None:
    for n in names.split():
        NOTED[n] = (value, why)


_note("-ngl --gpu-layers --n-gpu-layers", True, _CPU_ONLY)
_note("-sm --split-mode -ts --tensor-split -mg --main-gpu -dev --device", True, _CPU_ONLY)
_note("-fa --flash-attn", True, "flash attention applies to run, perplexity, bench, plan and serve")
_note("-kvo --kv-offload -nkvo --no-kv-offload --no-host --op-offload --no-op-offload", False, _CPU_ONLY)
_note("--repack -nr --no-repack", False, "pi2 lays its weights out at load time by itself")
_note("-C --cpu-mask -Cr --cpu-range -Cb --cpu-mask-batch -Crb --cpu-range-batch --prio --prio-batch --poll "
      "--poll-batch --numa -np --parallel -dt --defrag-thold", True, "pi2 schedules its own threads")
_note("--cpu-strict --cpu-strict-batch --swa-full --check-tensors --no-warmup --warmup --perf --no-perf "
      "--log-disable --log-colors --log-prefix --no-log-prefix --log-timestamps --no-log-timestamps -co --color "
      "--simple-io -mli --multiline-input --jinja --no-jinja --verbose-prompt", False,
      "it does not change what pi2 computes")
_note("-lv --verbosity --log-verbosity --log-file -tb --threads-batch", True, "it does not change what pi2 computes")


def _known(command) -> dict:
    """{spelling: takes a value} for every option of a click command."""
    out = {}
    for p in getattr(command, "params", []):
        for name in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
            if name.startswith("-"):
                out[name] = not getattr(p, "is_flag", False) and not getattr(p, "count", False)
    return out


def rewrite(argv: list, group) -> list:
    """argv without the noted flags (a note each on stderr); a UsageError for an unknown `-xyz`."""
    sub = next((a for a in argv if not a.startswith("-")), None)
    command = group.commands.get(sub) if sub is not None and hasattr(group, "commands") else None
    if command is None:
        return argv
    known = _known(command)
    out, i, seen = [], 0, set()
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if a == "--":
            out += argv[i:]
            break
        if name in known:
            out.append(a)
            if known[name] and "=" not in a and i + 1 < len(argv):
                out.append(argv[i + 1])
                i += 1
        elif name in NOTED:
            takes, why = NOTED[name]
            if takes and "=" not in a and i + 1 < len(argv):
                i += 1
            if name not in seen:
                print(f"pi2: note: {name} accepted and ignored: {why}", file=sys.stderr)
                seen.add(name)
        elif a.startswith("-") and not a.startswith("--") and len(name) > 2 and not _NUMBER.match(a):
            raise UsageError(f"unknown option {name}", hint=f"see 'pi2 {sub} --help'")
        else:
            out.append(a)
        i += 1
    return out
