"""test_attn_half_loops.py — the F16 K/V cache as 2-byte halves: its size as the engine and the CLI report it (2 bytes
per value, llama.cpp's), and every attention loop over it bit for bit against pi2/reference/forward.py, also the
loops this CPU would not take (pi2_test_attention_isa: without AVX-512 — AVX2 with F16C where the CPU has it — and
the portable C loops): one token (csrc/attn_decode.c, attn.c), prompt batches (attn.c without attn_batch.c), and
whole decodes with flash attention off and on against the best loops' logits.
Does not: cover quantized caches (test_kv_*.py) or repeat the shapes of test_attn_decode.py / test_attn_batch.py."""
import re

import numpy as np
import pytest

import cinternal
from clirun import assert_error, cli
from fixtures import write_model
from pi2.engine import CContext, CModel, ctx_sizes
from pi2.model.loader import load_model
from pi2.plan.budget import fmt
from pi2.reference import forward as reference

LEVELS = {"no-avx512": 1, "portable": 2}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("half") / "m.gguf", n_embd=256, n_head=4, n_head_kv=2, head_dim=64)
    m = load_model(path)
    return path, m, CModel.from_model(m)


@pytest.fixture(params=list(LEVELS))
def level(request):
    cinternal.lib.pi2_test_attention_isa(LEVELS[request.param])
    yield request.param
    cinternal.lib.pi2_test_attention_isa(0)


@pytest.fixture(scope="module", params=[1, 2])
def pool(request):
    with cinternal.Pool(request.param) as p:
        yield p


def test_f16_cache_takes_two_bytes_per_value(small):
    path, m, cm = small
    cfg = m.config
    kd, vd = cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    for n_ctx in (1000, 2000):     # keys: rows of pi2_kv_k_ld(n_ctx) halves (test_kv_leading_dim.py)
        kv, scratch = ctx_sizes(cm, n_ctx, 1)
        ld = cinternal.lib.pi2_kv_k_ld(n_ctx)
        assert kv == cfg.n_layer * (kd * ld + vd * n_ctx) * 2     # 4 bytes per value was the cache before


def test_the_cli_counts_two_bytes_per_value(small, monkeypatch):
    import pi2.plan.devices
    path, m, cm = small
    cfg = m.config
    n_ctx = 1 << 20
    monkeypatch.setattr(pi2.plan.devices, "memory_limit", lambda *a: 64 << 20)
    line = assert_error(cli("run", path, "-p", "hi", "-n", "1", "-c", str(n_ctx)), 2, match="for its KV cache")
    need = re.search(r"needs ([0-9.]+ [KMG]iB) for its KV cache", line)[1]
    kv, scratch = ctx_sizes(cm, n_ctx, 1)
    assert need == fmt(kv + scratch)
    ld = cinternal.lib.pi2_kv_k_ld(n_ctx)
    assert kv == cfg.n_layer * cfg.n_head_kv * (cfg.head_dim * ld + cfg.head_dim_v * n_ctx) * 2


SHAPES = [   # n_head, n_head_kv, hd, hdv, n_ctx
    (9, 3, 64, 64, 300),       # SmolLM2's group of 3
    (12, 2, 128, 128, 200),    # Qwen2.5-1.5B's group of 6
    (6, 6, 80, 24, 150),       # head sizes not a multiple of 64 or 16
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [0, 7])
def test_one_token_loops_match_reference(level, pool, shape, window):
    n_head, n_head_kv, hd, hdv, n_ctx = shape
    rng = np.random.default_rng(hash((shape, window)) & 0xFFFF)
    kc = rng.standard_normal((n_ctx, n_head_kv, hd)).astype(np.float16)
    vc = (rng.standard_normal((n_ctx, n_head_kv, hdv)) * 3).astype(np.float16)
    for pos in (0, 15, 16, 63, 64, 65, 130, n_ctx - 1):
        q = rng.standard_normal((1, n_head, hd), dtype=np.float32) * 2
        got = cinternal.attention(pool, q, kc, vc, pos, 0.125, window)
        want = reference.attention(q, kc, vc, np.arange(pos, pos + 1), pos + 1, 0.125, window)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (level, shape, window, pos)


@pytest.mark.parametrize("shape", [(5, 9, 3, 64, 64, 40), (17, 12, 2, 128, 128, 50), (6, 4, 2, 24, 40, 30)])
def test_batch_loops_match_reference(level, pool, shape):
    n_tok, n_head, n_head_kv, hd, hdv, n_ctx = shape
    rng = np.random.default_rng(hash(shape) & 0xFFFF)
    q = rng.standard_normal((n_tok, n_head, hd), dtype=np.float32) * 2
    kc = rng.standard_normal((n_ctx, n_head_kv, hd)).astype(np.float16)
    vc = (rng.standard_normal((n_ctx, n_head_kv, hdv)) * 3).astype(np.float16)
    for pos0 in (0, n_ctx - n_tok):
        n_kv = pos0 + n_tok
        got = cinternal.attention(pool, q, kc, vc, pos0, 0.125, 0)
        want = reference.attention(q, kc, vc, np.arange(pos0, n_kv), n_kv, 0.125, 0)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (level, shape, pos0)


@pytest.mark.parametrize("flash", [False, True])
def test_decodes_agree_with_the_best_loops(small, flash):
    """A prompt (tiled flash attention past 64 tokens) and single tokens: the same logits with every set of loops."""
    path, m, cm = small
    prompt = [int(t) for t in np.random.default_rng(3).integers(1, m.config.n_vocab, 90)]

    def run():
        c = CContext(cm, 128, 2, flash_attn=flash)
        rows = [c.decode(prompt, all_logits=True)]
        rows += [c.decode([t]) for t in (5, 6, 7)]
        return np.concatenate([r.reshape(-1) for r in rows])

    best = run()
    for lv in LEVELS.values():
        cinternal.lib.pi2_test_attention_isa(lv)
        try:
            got = run()
        finally:
            cinternal.lib.pi2_test_attention_isa(0)
        assert np.array_equal(got.view(np.uint32), best.view(np.uint32)), (lv, flash)
