"""engine.py — the only module that imports the compiled extension pi2._pi2.

Owns: loading the extension, the ABI check, and turning C status codes into Pi2 exceptions.
"""
from __future__ import annotations

from pi2.errors import EngineError, ModelFormatError, UnsupportedError

ABI_VERSION = 1

try:
    from pi2._pi2 import ffi, lib
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(f"pi2's compiled core is missing ({e}); reinstall with `pip install .`") from None

if lib.pi2_abi_version() != ABI_VERSION:  # pragma: no cover
    raise ImportError(f"pi2's compiled core has ABI {lib.pi2_abi_version()}, expected {ABI_VERSION}: "
                      "a stale build; reinstall with `pip install .`")

_ERRORS = {lib.PI2_ERR_FORMAT: ModelFormatError, lib.PI2_ERR_UNSUPPORTED: UnsupportedError}


def check(status: int) -> int:
    """Raise the matching Pi2Error for a negative status; return the status otherwise."""
    if status < 0:
        msg = ffi.string(lib.pi2_last_error()).decode("utf-8", "replace") or f"C core error {status}"
        raise _ERRORS.get(status, EngineError)(msg)
    return status
