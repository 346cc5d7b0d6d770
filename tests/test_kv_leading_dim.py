"""test_kv_leading_dim.py — the F16 K cache's rows (one dimension of a KV head over every position) lie k_ld halves
apart: as close as the positions in use allow (64 · 2^k, kv_rows.c), at most pi2_kv_k_ld(n_ctx), n_ctx rounded up to
whole 64-byte lines, so that every row starts on a cache line; they move apart as the context fills.
Everything that indexes the keys must use that stride: prompt batches (attn_batch.c and attn.c's loops, flash
attention's tiles), single tokens (attn_decode.c), the context shift, multi-context steps. Contexts padded and not
(n_ctx 4097 and 400; 4096 and 4160; small ones for many shifts) give the reference's logits bit for bit, with flash
attention off and on, on the CPU's best loops and the portable ones.
Does not: cover quantized keys (cells of blocks, no leading dimension: test_kv_*.py)."""
import numpy as np
import pytest

import cinternal
from fixtures import write_model
from pi2.engine import CContext, CModel
from pi2.engine.multi import decode_multi
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext

LEVELS = [0, 2]        # pi2_test_attention_isa: the best loops this CPU has, the portable ones


def k_ld(n_ctx: int) -> int:
    return cinternal.lib.pi2_kv_k_ld(n_ctx)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("ld") / "m.gguf", n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                       n_ctx=8192)
    m = load_model(path)
    return m, CModel.from_model(m)


@pytest.fixture(params=LEVELS)
def level(request):
    cinternal.lib.pi2_test_attention_isa(request.param)
    yield request.param
    cinternal.lib.pi2_test_attention_isa(0)


def tokens(n: int, seed: int) -> list[int]:
    return [(13 * i + 7 * seed + 1) % 500 for i in range(n)]


def test_rows_are_whole_lines():
    for n in [*range(1, 3000), 4095, 4096, 4097, 4160, 8192, 32768, 1 << 24]:
        ld = k_ld(n)
        assert n <= ld < n + 32 and ld % 32 == 0, n        # 32 halves: one 64-byte line
    assert [k_ld(n) for n in (4096, 4097, 4160, 400)] == [4096, 4128, 4160, 416]


@pytest.mark.parametrize("flash", [False, True])
def test_large_contexts_give_the_references_logits(model, level, flash):
    """A few hundred positions: prompt batches (two of them, the second at an offset; 64 tokens take flash
    attention's tiles) and single tokens, in contexts padded (4097, 400) and not (4096, 4160)."""
    m, cm = model
    for n_ctx in (4096, 4097, 4160, 400):
        c = CContext(cm, n_ctx, n_threads=2, flash_attn=flash)
        r = ReferenceContext(m, n_ctx, flash_attn=flash)
        for part in (tokens(70, 1), tokens(30, 2)):
            assert np.array_equal(c.decode(part, all_logits=True), r.decode(part, all_logits=True)), n_ctx
        for t in tokens(60 if flash else 200, 3):
            assert np.array_equal(c.decode([t]), r.decode([t])), (n_ctx, c.n_past)


@pytest.mark.parametrize("flash", [False, True])
def test_shifts_in_padded_caches_give_the_references_logits(model, level, flash):
    """Many context shifts move keys within rows whose padding differs from n_ctx."""
    m, cm = model
    for n_ctx in (40, 65, 100):
        assert k_ld(n_ctx) != n_ctx
        c = CContext(cm, n_ctx, n_threads=2, ctx_shift=True, n_keep=3, flash_attn=flash)
        r = ReferenceContext(m, n_ctx, ctx_shift=True, n_keep=3, flash_attn=flash)
        prompt = tokens(n_ctx - 8, 4)
        assert np.array_equal(c.decode(prompt), r.decode(prompt))
        seen = set()
        for t in tokens(3 * n_ctx, 5):
            assert np.array_equal(c.decode([t]), r.decode([t])), (n_ctx, c.n_past)
            seen.add(c.n_past)
        assert min(seen) < n_ctx // 2 + 4 and max(seen) == n_ctx - 1        # shifted, several times


def test_one_step_over_contexts_of_different_padding(model):
    """decode_multi: each token's keys stored and read with its own context's stride."""
    _, cm = model
    sizes = (4160, 4096, 4097, 400)        # the first context's scratch serves the others: the largest first
    ctxs = [CContext(cm, n, n_threads=2) for n in sizes]
    alone = [CContext(cm, n, n_threads=2) for n in sizes]
    for i, (c, a) in enumerate(zip(ctxs, alone)):
        c.decode(tokens(20 + 7 * i, i))
        a.decode(tokens(20 + 7 * i, i))
    for step in range(30):
        toks = [(5 * step + 11 * i) % 500 for i in range(len(sizes))]
        rows = decode_multi(ctxs, toks)
        for row, a, t in zip(rows, alone, toks):
            assert np.array_equal(row, a.decode([t])), step


@pytest.mark.slow
def test_a_shift_at_4097(tmp_path):
    """The context shift when a 4097-position cache (rows 4128 halves apart) fills, against the reference."""
    path = write_model(tmp_path / "m.gguf", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_layer=1, n_ctx=8192)
    m = load_model(path)
    c = CContext(CModel.from_model(m), 4097, n_threads=2, ctx_shift=True, n_keep=5)
    r = ReferenceContext(m, 4097, ctx_shift=True, n_keep=5)
    toks = tokens(4090, 6)
    for i in range(0, len(toks), 512):
        assert np.array_equal(c.decode(toks[i:i + 512]), r.decode(toks[i:i + 512])), i
    for t in tokens(12, 7):
        assert np.array_equal(c.decode([t]), r.decode([t])), c.n_past
    assert c.n_past == r.n_past < 4097 // 2 + 16


def test_rows_grow_with_the_positions_in_use(model):
    """The rows lie as close as the positions in use allow (64 · 2^k halves, at most pi2_kv_k_ld(n_ctx)): a short
    sequence in a large context reads a few lines of contiguous rows, not of rows a page or more apart. They move
    apart before a decode that needs more (keys kept: the logits stay the reference's), and close up again when the
    context is emptied."""
    m, cm = model
    ld = lambda c: cinternal.lib.pi2_test_ctx_k_ld(c._h)          # noqa: E731
    c, r = CContext(cm, 4096, n_threads=2), ReferenceContext(m, 4096)
    assert ld(c) == 64
    seen = []
    for part in (tokens(40, 1), tokens(30, 2), [5], tokens(300, 3), [7]):
        assert np.array_equal(c.decode(part), r.decode(part)), c.n_past
        seen.append((c.n_past, ld(c)))
    assert seen == [(40, 64), (70, 128), (71, 128), (371, 512), (372, 512)]
    c.truncate(100)
    r.truncate(100)
    assert ld(c) == 512
    for t in tokens(20, 4):
        assert np.array_equal(c.decode([t]), r.decode([t]))
    c.reset()
    assert ld(c) == 64
    small = CContext(cm, 400, n_threads=2)
    small.decode(tokens(300, 5))
    assert ld(small) == k_ld(400) == 416                    # capped at the context's own spacing
    quant = CContext(cm, 4096, n_threads=2, type_k=8)
    quant.decode(tokens(100, 6))
    assert ld(quant) == k_ld(4096)                          # quantized keys are cells: their spacing is unused
