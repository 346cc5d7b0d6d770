"""One-token attention (ops.c's one-query path, ggml_vec_dot_f16's four accumulators) against
pi2/reference/forward.py's attention, bit for bit: head groups of 1 to 16 query heads per KV head, head sizes 16 to
256 (24 and 80: not a multiple of 16 or 64), positions past 64, 512 and 1024, sliding windows (gemma3's 512 among
them), one and two threads.
Does not: cover quantized caches or flash attention (test_kv_*.py, test_flash_attn.py), prompt batches
(test_attn_batch.py)."""
import numpy as np
import pytest

import cinternal
from pi2.reference import forward as reference

SHAPES = [   # n_head, n_head_kv, hd, hdv, n_ctx
    (9, 3, 64, 64, 1100),      # SmolLM2-135M's group of 3
    (14, 2, 64, 64, 700),      # Qwen2.5-0.5B's group of 7
    (4, 1, 256, 256, 600),     # Gemma-3-270M: one KV head, head size 256
    (16, 1, 32, 48, 200),      # one KV head for 16 query heads
    (6, 6, 80, 16, 150),       # no grouping; 80 is not a multiple of 64
    (12, 2, 128, 128, 300),    # Qwen2.5-1.5B's group of 6
    (4, 2, 24, 40, 90),        # head sizes not a multiple of 16
]


@pytest.fixture(scope="module", params=[1, 2])
def pool(request):
    with cinternal.Pool(request.param) as p:
        yield p


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [0, 7, 512])
def test_decode_attention_matches_reference(pool, shape, window):
    n_head, n_head_kv, hd, hdv, n_ctx = shape
    rng = np.random.default_rng(hash((shape, window)) & 0xFFFF)
    kc = rng.standard_normal((n_ctx, n_head_kv, hd)).astype(np.float16)
    vc = (rng.standard_normal((n_ctx, n_head_kv, hdv)) * 3).astype(np.float16)
    for pos in sorted({0, 1, 15, 63, 64, 100, n_ctx // 2 + 3, 513, 1030, n_ctx - 1} & set(range(n_ctx))):
        q = rng.standard_normal((1, n_head, hd), dtype=np.float32) * 2
        got = cinternal.attention(pool, q, kc, vc, pos, 0.125, window)
        want = reference.attention(q, kc, vc, np.arange(pos, pos + 1), pos + 1, 0.125, window)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (shape, window, pos)


def test_decode_attention_zero_weights_and_large_scores(pool):
    """Scores far apart (weights that round to F16 zero) and a query of zeros: softmax and the lane sums agree."""
    n_head, n_head_kv, hd, n_ctx = 9, 3, 64, 300
    rng = np.random.default_rng(7)
    kc = (rng.standard_normal((n_ctx, n_head_kv, hd)) * 8).astype(np.float16)
    vc = rng.standard_normal((n_ctx, n_head_kv, hd)).astype(np.float16)
    q = rng.standard_normal((1, n_head, hd), dtype=np.float32) * 30
    q[0, 4] = 0
    for pos in (70, 299):
        got = cinternal.attention(pool, q, kc, vc, pos, 0.125, 0)
        want = reference.attention(q, kc, vc, np.arange(pos, pos + 1), pos + 1, 0.125, 0)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), pos
