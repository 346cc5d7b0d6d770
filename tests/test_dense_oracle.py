"""test_dense_oracle.py — the C engine's dense logits against llama.cpp 0c1e570's records (tests/data/*.oracle.json,
made by scripts/dense_oracle.py) on model files CI does not fetch (a Q5_K_M file made with llama-quantize).

Each record's file is looked for in the model cache (scripts/fetch_models.py) and in $PI2_ORACLE_MODELS (a
directory); the test skips when it is absent and fails when a file of that name has other bytes. Per prompt, at
-t 1 and -t 2: the teacher-forced logits of the prompt decoded in one batch are llama.cpp's bit for bit (sha256),
and the greedy continuation equals llama.cpp's token for token (the logits agree bit for bit, near ties too).
"""
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, fetch_models

RECORDS = sorted(DATA.glob("*.oracle.json"))
pytestmark = [pytest.mark.model, pytest.mark.slow]
_models: dict = {}


def model_for(record: dict):
    """The opened model of a record (checked once per session), or a skip when its file is absent."""
    name = record["model"]["file"]
    if name not in _models:
        extra = os.environ.get("PI2_ORACLE_MODELS")
        dirs = [fetch_models.cache_dir()] + ([Path(extra)] if extra else [])
        path = next((d / name for d in dirs if (d / name).exists()), None)
        if path is None:
            pytest.skip(f"{name} is not here (made by: {record['model']['made']}); put it in the model cache or "
                        "PI2_ORACLE_MODELS")
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        assert h.hexdigest() == record["model"]["sha256"], f"{path}: not the file llama.cpp was run on"
        from pi2.runtime.session import open_model
        _models[name] = open_model(path)
    return _models[name]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("path", RECORDS, ids=[p.name.split(".oracle")[0] for p in RECORDS])
def test_logits_and_greedy_match_llamacpp(path, threads):
    from pi2.runtime.config import RunConfig
    from pi2.runtime.session import open_session
    record = json.loads(path.read_text())
    model = model_for(record)
    ctx = open_session(model, RunConfig(n_ctx=1024, n_threads=threads, engine="c"))
    for p in record["prompts"]:
        ctx.reset()
        tf = np.ascontiguousarray(ctx.decode(p["prompt_ids"], all_logits=True), np.float32)
        assert hashlib.sha256(tf.tobytes()).hexdigest() == p["logits_sha256"], p["prompt"]
        ctx.reset()
        logits, gen = ctx.decode(p["prompt_ids"]), []
        for _ in p["ids"]:
            gen.append(int(np.argmax(logits)))
            logits = ctx.decode([gen[-1]])
        assert gen == p["ids"], p["prompt"]
