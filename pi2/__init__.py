"""pi2 — LLM inference that computes only the FFN neurons a token activates (PowerInfer-2 design).

The Python API (pi2/api.py): `model = pi2.load("model.gguf", n_ctx=2048)`, then `model.generate(...)`,
`model.chat(...)`, `model.tokenize(...)`. Every error it raises is a pi2.Pi2Error (pi2/errors.py). The API's names
load on first use, so that importing a pi2 module (and `pi2 --help`) does not load numpy and the engine.
"""
__version__ = "0.1.0"

_API = ("load", "Model", "Sequence", "Stream", "Piece", "Completion")
_ERRORS = ("Pi2Error", "UsageError", "ContextFullError", "ModelFormatError", "UnsupportedError", "EngineError")
__all__ = list(_API + _ERRORS)


def __getattr__(name):
    if name in _API:
        from pi2 import api
        return getattr(api, name)
    if name in _ERRORS:
        from pi2 import errors
        return getattr(errors, name)
    raise AttributeError(f"module 'pi2' has no attribute {name!r}")
