"""Prompt-batch attention (csrc/attn_batch.c: queries of one KV head scored and weighed together on AVX-512, and
attn_batch_avx2.c's kernels with AVX-512 turned off by pi2_test_attention_isa) against pi2/reference/forward.py's
attention, bit for bit: head groups of 1 to 16 query heads per KV head (chunks of PI2_ATTN_ROWS, and of 6 on AVX2),
token blocks cut at odd places, head sizes 16 to 128 (and 24, 40: ops.c's path), sliding windows, a cache already
holding earlier positions and key ranges ending at the cache's last key (AVX2's zero-padded last block), one and two
threads.
Does not: cover quantized caches or flash attention (test_kv_*.py, test_flash_attn.py)."""
import numpy as np
import pytest

import cinternal
from pi2.reference import forward as reference

SHAPES = [   # n_tok, n_head, n_head_kv, hd, hdv, n_ctx
    (2, 2, 2, 16, 16, 19),
    (5, 9, 3, 64, 64, 40),      # SmolLM2's group of 3
    (17, 12, 2, 128, 128, 50),  # Qwen2.5-1.5B's group of 6
    (33, 14, 2, 64, 64, 70),    # Qwen2.5-0.5B's group of 7
    (7, 16, 1, 32, 48, 23),     # one KV head for 16 query heads: two chunks
    (9, 4, 4, 48, 32, 9),       # no grouping; the cache holds exactly the batch
    (6, 4, 2, 24, 40, 30),      # head sizes not a multiple of 16: ops.c
    (14, 13, 1, 64, 64, 37),    # 13 query heads per KV head: AVX2 chunks of 5 and 4 (and 1 token x 13 heads)
]


@pytest.fixture(scope="module", params=[1, 2])
def pool(request):
    with cinternal.Pool(request.param) as p:
        yield p


@pytest.fixture(params=[0, 1], ids=["avx512", "avx2"])
def isa(request):
    """0: every loop this CPU has; 1: none of AVX-512 (attn_batch_avx2.c where the CPU has AVX2)."""
    cinternal.lib.pi2_test_attention_isa(request.param)
    yield request.param
    cinternal.lib.pi2_test_attention_isa(0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [0, 6])
def test_batch_attention_matches_reference(pool, shape, window, isa):
    n_tok, n_head, n_head_kv, hd, hdv, n_ctx = shape
    rng = np.random.default_rng(hash((shape, window)) & 0xFFFF)
    q = rng.standard_normal((n_tok, n_head, hd), dtype=np.float32) * 2
    kc = rng.standard_normal((n_ctx, n_head_kv, hd)).astype(np.float16)
    vc = (rng.standard_normal((n_ctx, n_head_kv, hdv)) * 3).astype(np.float16)
    for pos0 in sorted({0, n_ctx - n_tok, (n_ctx - n_tok) // 2}):
        n_kv = pos0 + n_tok
        got = cinternal.attention(pool, q, kc, vc, pos0, 0.125, window)
        want = reference.attention(q, kc[:n_ctx], vc[:n_ctx], np.arange(pos0, n_kv), n_kv, 0.125, window)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (shape, window, pos0)
