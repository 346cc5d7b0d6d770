"""test_golden.py — the dense path against llama.cpp's goldens on real models (tests/data/*.{logits,greedy}.json).

Teacher-forced: top-1 agreement with llama.cpp at >= 98 % of positions and mean |Δ logit| <= 0.05 over
llama.cpp's top-5. Greedy: 48 tokens equal up to the first near tie (llama.cpp's two best logits within
0.05). Both for every engine pi2 has; the CLI's `--json` path is checked once per model.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA, model_file
from pi2.runtime.config import ENGINES, RunConfig
from pi2.runtime.session import open_model, open_session

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b"]
LOGIT_MODELS = MODELS + ["gemma3-270m"]   # gemma3: teacher-forced logits only
pytestmark = [pytest.mark.model, pytest.mark.slow]


def golden(key: str, kind: str) -> dict:
    return json.loads((DATA / f"{key}.{kind}.json").read_text())


def engines():
    return [e for e in ENGINES if e != "auto"]


_contexts = {}


def context(key: str, engine: str):
    """One context per (model, engine) for the whole module: loading Qwen's weights takes seconds."""
    if (key, engine) not in _contexts:
        model = open_model(model_file(key))
        _contexts[(key, engine)] = (model, open_session(model, RunConfig(n_ctx=512, n_threads=1, engine=engine)))
    return _contexts[(key, engine)]


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("key", LOGIT_MODELS)
def test_teacher_forced_logits(key, engine):
    model, ctx = context(key, engine)
    for text in golden(key, "logits")["texts"]:
        ctx.reset()
        logits = ctx.decode(text["ids"], all_logits=True)
        agree, diffs = 0, []
        for i, top5 in enumerate(text["top5"]):
            ids = [t[0] for t in top5]
            ref = np.array([np.float32(t[1]) for t in top5])
            agree += int(np.argmax(logits[i])) == ids[0]
            diffs.append(np.abs(logits[i][ids] - ref))
        mean_diff = float(np.mean(diffs))
        share = agree / len(text["top5"])
        assert share >= 0.98, f"{text['name']}: top-1 agrees at {share:.1%} of positions"
        assert mean_diff <= 0.05, f"{text['name']}: mean |Δ logit| {mean_diff:.4f}"


def greedy_ids(ctx, prompt_ids, n):
    ctx.reset()
    logits = ctx.decode(prompt_ids)
    out = []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = ctx.decode([tok])
    return out


def agreeing_prefix(p) -> int:
    return p["first_near_tie_index"] if p["first_near_tie_index"] is not None else len(p["ids"])


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("key", MODELS)
def test_greedy_continuations(key, engine):
    model, ctx = context(key, engine)
    tok = model.tokenizer
    for p in golden(key, "greedy")["prompts"]:
        assert tok.encode(p["prompt"], parse_special=True) == p["prompt_ids"], p["name"]
        n = agreeing_prefix(p)
        got = greedy_ids(ctx, p["prompt_ids"], n)
        assert got == p["ids"][:n], f"{p['name']}: first difference at {next(i for i in range(n) if got[i] != p['ids'][i])}"


@pytest.mark.parametrize("key", MODELS)
def test_cli_json_greedy(key, tmp_path):
    """`pi2 run --temp 0 -n 48 --json` on one golden prompt: the same tokens, stopping at end of generation."""
    p = golden(key, "greedy")["prompts"][0]
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_bytes(p["prompt"].encode())
    r = subprocess.run([sys.executable, "-m", "pi2", "run", str(model_file(key)), "-f", str(prompt_file),
                        "--temp", "0", "-n", "48", "-c", "512", "-t", "1", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == p["prompt_ids"]
    n = agreeing_prefix(p)
    if p["first_eog_index"] is not None:
        n = min(n, p["first_eog_index"])
    assert out["tokens"][:n] == p["ids"][:n]
