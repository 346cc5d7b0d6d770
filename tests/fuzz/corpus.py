"""corpus.py — the fuzzer's seed files: tiny synthetic models of every architecture and weight layout pi2 reads
(plain GGUF, PowerInfer PWRI with predictors, pi2 files in both layouts and with int8 down rows) and, when they
are on disk, the real test models (their headers are mutated, their tensor data copied as it is)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

REAL = ("SmolLM2-135M-Instruct.Q4_1.gguf",)      # its header mutated, its 94 MiB of tensors copied


def _models_dir() -> Path:
    return Path(os.environ.get("PI2_MODELS", Path.home() / ".cache" / "pi2" / "models"))


def build(d: Path, real: bool = True) -> list:
    """Write the seeds into d (once: reused when d/seeds.json exists); return [{path, kind, budget}]."""
    d.mkdir(parents=True, exist_ok=True)
    index = d / "seeds.json"
    if index.exists():
        return json.loads(index.read_text())
    from fixtures import write_model
    from pi2file import convert_pi2
    seeds = [
        write_model(d / "llama-q8.gguf", n_layer=2, seed=1),
        write_model(d / "llama-q41-untied.gguf", wtype="Q4_1", tied=False, n_layer=2, seed=2),
        write_model(d / "qwen2-f16.gguf", "qwen2", wtype="F16", n_layer=2, seed=3),
        write_model(d / "gemma3-q40.gguf", "gemma3", wtype="Q4_0", n_layer=2, seed=4),
        write_model(d / "bamboo-pwri.gguf", "bamboo", pwri=True, n_layer=2, seed=5),
        write_model(d / "llama-pwri-lowrank.gguf", pwri=True, pred_rank=8, n_layer=2, seed=6),
    ]
    src = write_model(d / "src.gguf", wtype="Q8_0", n_ff=256, n_layer=2, seed=7)
    pi2 = [convert_pi2(src, d / "q8.pi2.gguf", down_type="Q8_0", default_keep=0.5),
           convert_pi2(src, d / "i8-gud.pi2.gguf", down_type="I8", layout="bundle-gud", default_keep=0.5)]
    out = [{"path": str(p), "kind": "gguf"} for p in seeds] + [{"path": str(p), "kind": "pi2"} for p in pi2]
    if real:
        out += [{"path": str(_models_dir() / n), "kind": "real"} for n in REAL if (_models_dir() / n).exists()]
    for s in out:
        s["budget"] = _budget(s["path"]) if s["kind"] == "pi2" else "64M"
    index.write_text(json.dumps(out))
    return out


def _budget(path: str) -> str:
    """A pi2 seed's own minimum budget rounded up to a MiB, so its cold clusters stream every token (64M for a
    layout that cannot stream: the run is refused, which is what that file should get)."""
    from pi2.engine import CModel
    from pi2.errors import UsageError
    from pi2.model.loader import load_model
    from pi2.plan.budget import make_plan
    m = load_model(path)
    try:
        floor = make_plan(m, CModel.from_model(m), 1 << 40, 64, 1, io="pread").floor
    except UsageError:
        return "64M"
    finally:
        m.close()
    return f"{(floor >> 20) + 1}M"
