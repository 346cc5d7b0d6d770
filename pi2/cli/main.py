"""main.py — `pi2`'s entry point: runs the Typer app (pi2/cli/app.py) and turns every failure into one line on
stderr: `pi2: error: ...` (and `  hint: ...`), exit 2 for usage errors, 1 otherwise, 130 on Ctrl-C; no traceback
unless --verbose. A failed read or write names the file and the errno.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
from typing import List, Optional

import typer

from pi2 import __version__
from pi2.cli import net  # noqa: F401 — registers pi2 serve and pi2 pull on the app
from pi2.cli.app import app
from pi2.cli.llama_flags import rewrite
from pi2.cli.options import CliState
from pi2.errors import Pi2Error

try:        # recent Typer vendors click as typer._click, with its own Abort and Exit; older Typer uses click's
    from typer._click import exceptions as _ce
except ImportError:
    from click import exceptions as _ce

_CLICK_ERROR, _USAGE_ERROR, _NO_ARGS_HELP = _ce.ClickException, _ce.UsageError, getattr(_ce, "NoArgsIsHelpError", ())
_ABORTS = tuple(c for c in (typer.Abort, getattr(_ce, "Abort", None)) if c is not None)
_EXITS = tuple(c for c in (typer.Exit, getattr(_ce, "Exit", None)) if c is not None)


_STATUS = [130]      # exit status of an interruption: 128 + the signal (SIGINT unless SIGTERM/SIGHUP came)


def _interrupted() -> None:
    print("\npi2: interrupted" if _STATUS[0] == 130 else f"\npi2: terminated (signal {_STATUS[0] - 128})",
          file=sys.stderr)
    context = sys.modules.get("pi2.engine.context")
    if context is not None and context.STUCK:     # a decode still blocked in a read: no clean-up may free its
        sys.stdout.flush()                         # memory under it; the process ends when the kernel lets it
        sys.stderr.flush()
        os._exit(_STATUS[0])
    sys.exit(_STATUS[0])


def _on_termination(signum, frame) -> None:
    """SIGTERM and SIGHUP end a run as Ctrl-C does (the same clean-up: a conversion's temporary file removed,
    timings printed), with status 128 + signal."""
    _STATUS[0] = 128 + signum
    raise KeyboardInterrupt


def _one_line(msg: str) -> str:
    """The error contract is one line: control characters (from a damaged file's strings) are escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in msg)


def error_line(e: Pi2Error) -> str:
    """The one line of a Pi2Error; an I/O error (an OSError too) adds its errno's name and the file when the
    message does not say them already. Unprintable characters are escaped."""
    msg = f"pi2: error: {_one_line(str(e))}"
    if isinstance(e, OSError):
        name = errno.errorcode.get(e.errno or 0, "")
        text = os.strerror(e.errno) if name else ""
        what = [name if text in msg else f"{name}: {text}"] if name and name not in msg else []
        what += [str(e.filename)] if e.filename and str(e.filename) not in msg else []
        msg += f" ({', '.join(what)})" if what else ""
    return msg


def _version() -> str:
    return f"pi2 {__version__}"


def main(argv: Optional[List[str]] = None) -> None:
    if argv is None:                  # the command itself, not a caller's in-process use
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, _on_termination)
    state = CliState()
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args[: args.index("--") if "--" in args else len(args)]:
        print(_version())       # as llama.cpp: --version on any command, exit 0
        return
    try:
        args = rewrite(args, typer.main.get_command(app))
        rc = app(args=args, prog_name="pi2", standalone_mode=False, obj=state)
    except Pi2Error as e:
        print(error_line(e), file=sys.stderr)
        if e.hint:
            print(f"  hint: {_one_line(e.hint)}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as e:  # click usage errors and unexpected failures
        if isinstance(e, _ABORTS) or isinstance(e.__cause__, KeyboardInterrupt):
            _interrupted()
        if isinstance(e, _NO_ARGS_HELP):
            sys.exit(e.exit_code)       # the help text has been printed
        if isinstance(e, _CLICK_ERROR):
            print(f"pi2: error: {e.format_message()}", file=sys.stderr)
            ctx = getattr(e, "ctx", None)
            if isinstance(e, _USAGE_ERROR) and ctx is not None:
                print(f"  hint: see '{ctx.command_path} --help'", file=sys.stderr)
            sys.exit(e.exit_code)
        if isinstance(e, _EXITS):
            sys.exit(e.exit_code)
        if state.verbose:
            raise
        print(f"pi2: error: {type(e).__name__}: {_one_line(str(e))}", file=sys.stderr)
        sys.exit(1)
    if rc == 130:       # Typer turns a KeyboardInterrupt into Exit(130), returned in non-standalone mode
        _interrupted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)
