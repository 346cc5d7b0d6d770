"""engine/lib.py — the only module that imports the compiled extension pi2._pi2.

Owns: loading the extension, the ABI check, passing PI2_CPU_VARIANT to the core, turning C status codes and the C
error record into Pi2 exceptions (check, raise_last), and the enum values the rest of the binding names (read from
the module, never restated).
Does not: wrap any C object (model.py, context.py, kernels.py, nnapi.py, flash_io.py do).
"""
from __future__ import annotations

import os

from pi2.errors import EngineError, FlashIOError, ModelFormatError, UnsupportedError

ABI_VERSION = 15

try:
    from pi2._pi2 import ffi, lib
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(f"pi2's compiled core is missing ({e}); reinstall with `pip install .`") from None

if lib.PI2_ABI_VERSION != ABI_VERSION:  # pragma: no cover
    raise ImportError(f"pi2's compiled core has ABI {lib.PI2_ABI_VERSION}, expected {ABI_VERSION}: "
                      "a stale build; reinstall with `pip install .`")

# PI2_CPU_VARIANT=avx2 (neon on aarch64) runs the baseline kernels on a CPU with more; asked before any kernel runs
lib.pi2_cpu_variant_request(os.environ.get("PI2_CPU_VARIANT", "").encode())

_ERRORS = {lib.PI2_ERR_FORMAT: ModelFormatError, lib.PI2_ERR_UNSUPPORTED: UnsupportedError}


def last_error() -> tuple:
    """(status, message, errno, path) of the calling thread's last C error."""
    e = ffi.new("pi2_error *", {"size": ffi.sizeof("pi2_error")})
    lib.pi2_last_error(e)
    text = lambda p: ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""  # noqa: E731
    return e.status, text(e.message), e.sys_errno, text(e.path)


def error_for(status: int, message: str, sys_errno: int = 0, path: str = "") -> Exception:
    """The Pi2Error a negative status stands for; I/O errors as FlashIOError with their errno and file."""
    message = message or f"C core error {status}"
    if status == lib.PI2_ERR_IO:
        return FlashIOError(message, sys_errno=sys_errno, filename=path or None)
    return _ERRORS.get(status, EngineError)(message)


def check(status: int) -> int:
    """Raise the matching Pi2Error for a negative status; return the status otherwise."""
    if status < 0:
        _, message, sys_errno, path = last_error()
        raise error_for(status, message, sys_errno, path)
    return status


def enum(prefix: str, names) -> dict:
    """{name: lib.<PREFIX><NAME>} for the lower-case names of a C enum."""
    return {n: getattr(lib, prefix + n.upper()) for n in names}


def guard_mapping(buf, path: str, fd: int = -1) -> int:
    """Guard a read-only mapping (an mmap.mmap): a page of it that fails (SIGBUS) reads as zeros and check_mapping
    raises instead of the process dying. Returns the guard's id (-1: not guarded)."""
    return int(lib.pi2_map_guard_add(ffi.from_buffer(buf), len(buf), str(path).encode(), fd))


def check_mapping(gid: int) -> None:
    """Raise FlashIOError (an EngineError) when the guarded mapping `gid` failed (or its file shrank)."""
    check(lib.pi2_map_guard_check(gid, 0))


def unguard_mapping(gid: int) -> None:
    lib.pi2_map_guard_check(gid, 1)
