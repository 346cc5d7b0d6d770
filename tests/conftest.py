"""conftest.py — shared test helpers: locating the real models fetched by scripts/fetch_models.py."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

_spec = importlib.util.spec_from_file_location("fetch_models", ROOT / "scripts" / "fetch_models.py")
fetch_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_models)


def model_file(key: str) -> Path:
    """Path of a real model ('smollm2-135m', 'qwen2.5-coder-0.5b', 'gemma3-270m'); skips the test if absent."""
    p = fetch_models.cache_dir() / fetch_models.MODELS[key]["file"]
    if not p.exists():
        pytest.skip(f"model {key} not fetched (run scripts/fetch_models.py)")
    return p


def llama_vocab_dir() -> Path:
    """llama.cpp's tokenizer test vocabularies (scripts/fetch_models.py llama-vocabs); skips the test if absent."""
    p = fetch_models.vocab_dir()
    if not (p / ".sdist-sha256").exists():
        pytest.skip("llama.cpp's test vocabularies not fetched (run scripts/fetch_models.py llama-vocabs)")
    return p
