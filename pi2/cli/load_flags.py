"""load_flags.py — how a command loads its model, as llama.cpp spells it: --no-mmap, --mlock and -lm / --load-mode
(run, perplexity, serve), turned into (lock, read): whether to lock the model's pages and whether the C engine reads
the whole file into memory instead of mapping it (RunConfig.no_mmap). pi2 bench's lists are in pi2/runtime/bench.py.
"""
from __future__ import annotations

import sys
from typing import Optional

import typer

from pi2.errors import UsageError

LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")

NoMmapOpt = typer.Option(False, "--no-mmap", help="read the whole model into memory at load instead of mapping it "
                         "(the C engine; not with --memory-budget)")
LoadModeOpt = typer.Option(None, "-lm", "--load-mode", help="auto | mmap | none | dio (none, dio: as --no-mmap) | "
                           "mlock | mmap+mlock (as --mlock)")


def load_notes(no_mmap: bool, mlock: bool, load_mode: Optional[str], locks: bool = True) -> tuple:
    """(lock, read) from the flags (as llama.cpp's loaders: none and dio read the file, mlock locks a mapping).
    locks=False: the command does not lock pages (perplexity, serve): asking for it gets a note."""
    if load_mode is not None and load_mode not in LOAD_MODES:
        raise UsageError(f"invalid -lm {load_mode!r}: auto, none, mmap, mlock, mmap+mlock or dio")
    read = no_mmap or load_mode in ("none", "dio")
    lock = mlock or load_mode in ("mlock", "mmap+mlock")
    if read and lock:
        print("pi2: note: --mlock not applied: --no-mmap reads the model into memory", file=sys.stderr)
    elif lock and not locks:
        print("pi2: note: --mlock not applied: only pi2 run locks the model's pages", file=sys.stderr)
    return lock and not read and locks, read
