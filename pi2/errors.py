"""errors.py — pi2's one exception hierarchy; the CLI turns these into one-line errors."""


class Pi2Error(Exception):
    """Base of every error pi2 reports to a user. `hint` is an optional second line."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


class UsageError(Pi2Error, ValueError):
    """Bad flags or arguments (exit status 2)."""

    exit_code = 2


class FileError(Pi2Error, OSError):
    """A file named on the command line that cannot be read or written (exit status 1, as every error that is not
    a usage error)."""

    def __init__(self, message: str, hint: str = ""):
        Pi2Error.__init__(self, message, hint)


class ContextFullError(UsageError):
    """A prompt (or a conversation) longer than the context holds."""


class ModelFormatError(Pi2Error, ValueError):
    """A model file that is not GGUF, is truncated or corrupted, or is inconsistent."""


class UnsupportedError(Pi2Error, NotImplementedError):
    """A valid file that uses an architecture, type or feature pi2 does not support."""


class EngineError(Pi2Error, RuntimeError):
    """An error reported by the C core."""


class FlashIOError(EngineError, OSError):
    """A read of a model file failed in the C core (PI2_ERR_IO): `errno` and `filename` as OSError has them (errno
    ENODATA: the file ended before the read did); catchable as OSError, EngineError or Pi2Error."""

    def __init__(self, message: str, hint: str = "", *, sys_errno: int = 0, filename: str | None = None):
        EngineError.__init__(self, message, hint)
        self.errno = sys_errno or None
        self.strerror = message
        self.filename = filename

    def __str__(self) -> str:
        return self.args[0]
