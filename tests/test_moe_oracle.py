"""test_moe_oracle.py — the MoE-family reference against llama.cpp 0c1e570 (tests/data/moe-oracle.json) on the
synthetic files of tests/moe_files.py, every architecture in F32, F16, Q8_0 and Q4_K_M.

Each file is written from its seed and must have the sha256 llama.cpp was run on (for the quantized ones also
what llama-quantize writes). Then: the teacher-forced logits of a prompt are llama.cpp's bit for bit (sha256);
`llama-perplexity -fa off -c 128 --chunks 3` is matched to its printed precision, chunk by chunk; greedy
continuations equal llama.cpp's token for token (10 of the 16 recorded), past the first near tie too (the
logits agree bit for bit).
"""
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA
from moe_files import ARCHS, WTYPES, write_moe

ORACLE = json.loads((DATA / "moe-oracle.json").read_text())
TEXT = (DATA / "moe-text.txt").read_text()
pytestmark = pytest.mark.slow
GREEDY = 10
_files: dict = {}


def moe_file(tmp_path_factory, arch: str, wtype: str):
    """The file for (arch, wtype), written once per session and checked against the recorded sha256."""
    key = f"{arch}.{wtype}"
    if key not in _files:
        path = write_moe(tmp_path_factory.mktemp("moe") / f"{key}.gguf", arch, wtype)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest == ORACLE["files"][key]["sha256"], f"{key}: not the file llama.cpp was run on"
        _files[key] = path
    return _files[key]


def context(path):
    from pi2.runtime import RunConfig, open_context, open_model
    model = open_model(path)
    return model, open_context(model, RunConfig(n_ctx=256, n_threads=1, engine="reference"))


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_against_llama_cpp(tmp_path_factory, arch, wtype):
    rec = ORACLE["files"][f"{arch}.{wtype}"]
    if wtype != "F32":
        assert rec["llama_quantize_sha256"] == rec["sha256"]
    model, ctx = context(moe_file(tmp_path_factory, arch, wtype))
    g0 = rec["greedy"][0]
    logits = ctx.decode(g0["prompt_ids"], all_logits=True)
    assert hashlib.sha256(np.ascontiguousarray(logits, np.float32).tobytes()).hexdigest() == rec["logits_sha256"]

    from pi2.perplexity import perplexity
    tokens = model.tokenizer.encode(TEXT, add_special=None, parse_special=False)
    n_ctx = ORACLE["n_ctx"]
    res = perplexity(lambda chunk: ctx.decode_from(chunk, len(chunk) // 2), tokens, n_ctx,
                     n_chunks=ORACLE["chunks"], bos_id=model.tokenizer.bos_id, add_bos=model.tokenizer.add_bos)
    assert [f"{p:.4f}" for p in res.chunk_ppls] == rec["perplexity"]["chunks"]
    assert (f"{res.ppl:.4f}", f"{res.stderr:.5f}") == (rec["perplexity"]["ppl"], rec["perplexity"]["stderr"])

    for g in rec["greedy"]:            # bit-identical logits: near ties included (the first GREEDY tokens: CI time)
        assert model.tokenizer.encode(g["prompt"]) == g["prompt_ids"]
        n = min(GREEDY, len(g["ids"]))
        ctx.reset()
        lg, got = ctx.decode(g["prompt_ids"]), []
        for _ in range(n):
            got.append(int(np.argmax(lg)))
            lg = ctx.decode([got[-1]])
        assert got == g["ids"][:n], g["prompt"]


def test_cli_perplexity_prints_llama_cpp_figure(tmp_path_factory, tmp_path):
    """`pi2 perplexity -c 128 --chunks 3` (default engine: falls back to the reference with a note)."""
    path = moe_file(tmp_path_factory, "qwen3moe", "Q8_0")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    r = subprocess.run([sys.executable, "-m", "pi2", "perplexity", "-m", str(path), "-f", str(text), "-c", "128",
                        "--chunks", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    p = ORACLE["files"]["qwen3moe.Q8_0"]["perplexity"]
    assert r.stdout.strip() == f"Final estimate: PPL = {p['ppl']} +/- {p['stderr']}"
    assert "does not run qwen3moe models yet" in r.stderr


def test_working_sets_are_recorded():
    """Routing on these files is varied (some experts hot), never collapsed onto a few experts."""
    for arch in ARCHS:
        rows = ORACLE["files"][f"{arch}.F32"].get("expert_working_set", [])
        for r in rows:
            assert r["used"] == r["of"] and 0.25 < r["top_quarter_share"] < 0.9
