"""test_decode_multi.py — pi2_decode_multi (pi2.engine.decode_multi): one token of each of several contexts in one
step gives, bit for bit, the logits and the caches that separate single-token decodes give, on real models (llama,
qwen2 with its biases, gemma3 with its sliding window and norms), contexts at different positions; and its refusals."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import model_file
from pi2.engine import CContext, CModel, decode_multi
from pi2.errors import Pi2Error
from pi2.model.loader import load_model

pytestmark = pytest.mark.model
PROMPTS = [[1, 504, 3575, 282], [1, 2683, 2013, 253, 655, 28, 314], [1, 8, 9], [1, 77, 88, 99, 111, 222]]


@pytest.mark.parametrize("key", ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_multi_step_equals_separate_decodes(key):
    model = load_model(model_file(key))
    cm = CModel.from_model(model)
    n_vocab = model.config.n_vocab
    prompts = [[t % n_vocab for t in p] for p in PROMPTS]
    multi = [CContext(cm, 64, 2) for _ in prompts]
    alone = [CContext(cm, 64, 2) for _ in prompts]
    nxt = []
    for a, b, p in zip(multi, alone, prompts):
        la, lb = a.decode(p), b.decode(p)
        assert np.array_equal(la, lb)
        nxt.append(int(np.argmax(la)))
    for _ in range(6):       # greedy steps: every context at its own position
        rows = decode_multi(multi, nxt)
        want = np.stack([b.decode([t]) for b, t in zip(alone, nxt)])
        assert np.array_equal(rows, want)
        assert [c.n_past for c in multi] == [c.n_past for c in alone]
        nxt = [int(np.argmax(r)) for r in rows]
    for a, b in zip(multi, alone):    # the caches hold the same entries: a later batch decode agrees too
        assert np.array_equal(a.decode([5, 6, 7], all_logits=True), b.decode([5, 6, 7], all_logits=True))


def test_multi_step_refusals():
    model = load_model(model_file("smollm2-135m"))
    cm = CModel.from_model(model)
    a, b = CContext(cm, 32, 1), CContext(cm, 64, 1)
    a.decode([1, 2])
    with pytest.raises(Pi2Error, match="twice"):
        decode_multi([a, a], [3, 4])
    with pytest.raises(Pi2Error, match="larger than the first"):
        decode_multi([a, b], [3, 4])
    with pytest.raises(Pi2Error, match="outside the vocabulary"):
        decode_multi([b, a], [3, 10 ** 7])
    assert (a.n_past, b.n_past) == (2, 0)
    rows = decode_multi([b, a], [3, 4])
    assert rows.shape == (2, model.config.n_vocab) and (a.n_past, b.n_past) == (3, 1)
