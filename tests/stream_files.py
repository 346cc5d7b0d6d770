"""stream_files.py — what the streamed-bundle tests share (test_stream_cache.py, test_budget_plan.py): tiny pi2 files
in several down-row types and layouts, a decode pattern of batches and single tokens, and a C context on a file."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures import write_model
from pi2file import convert_pi2

from pi2.engine import CContext, CModel
from pi2.model.loader import load_model
from pi2.runtime import ffn_rule

TOKENS = [1, 5, 9, 200, 33, 7, 80, 90, 311, 42, 17, 64, 3, 99, 12, 250, 77, 5, 9, 1]

def run(ctx) -> np.ndarray:
    """A prompt batch of 6, 8 single tokens, a batch of 3, then 3 single tokens: logits of every token."""
    out = [ctx.decode(TOKENS[:6], all_logits=True)]
    out += [ctx.decode([t], all_logits=True) for t in TOKENS[6:14]]
    out.append(ctx.decode(TOKENS[14:17], all_logits=True))
    out += [ctx.decode([t], all_logits=True) for t in TOKENS[17:]]
    return np.concatenate(out)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    q8 = write_model(d / "q8.gguf", wtype="Q8_0", n_ff=320, n_embd=64)      # 5 groups of 64
    odd = write_model(d / "odd.gguf", wtype="Q8_0", n_ff=256, n_embd=96, seed=4)
    return {"plain": q8, "q8": convert_pi2(q8, d / "q8.pi2.gguf", down_type="Q8_0", default_keep=0.5),
            "f16": convert_pi2(odd, d / "f16.pi2.gguf", down_type="F16", default_keep=0.5),
            "i8": convert_pi2(odd, d / "i8.pi2.gguf", down_type="I8", default_keep=0.5),
            "gud": convert_pi2(q8, d / "gud.pi2.gguf", layout="bundle-gud", down_type="Q8_0", default_keep=0.5)}


def ctx_for(path, keep, threads, stream=None):
    m = load_model(path)
    c = CContext(CModel.from_model(m), 64, threads)
    c.set_ffn(ffn_rule.choose_rule(m, keep))
    if stream:
        c.set_stream(**stream)
    return c
