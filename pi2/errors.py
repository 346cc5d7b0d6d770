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


class ContextFullError(UsageError):
    """A prompt (or a conversation) longer than the context holds."""


class ModelFormatError(Pi2Error, ValueError):
    """A model file that is not GGUF, is truncated or corrupted, or is inconsistent."""


class UnsupportedError(Pi2Error, NotImplementedError):
    """A valid file that uses an architecture, type or feature pi2 does not support."""


class EngineError(Pi2Error, RuntimeError):
    """An error reported by the C core."""
