"""test_perplexity.py — pi2.runtime.perplexity against fake models whose log-probs are known by construction."""
import math
import re

import numpy as np
import pytest

from pi2.errors import UsageError
from pi2.runtime.perplexity import (PerplexityResult, _eta_line, format_final, nll_of_rows, perplexity,
                            tokenize_input)

V = 11
BOS = 1


def stream(n, seed=0):
    return np.random.default_rng(seed).integers(2, V, size=n).tolist()


def uniform_model(chunks_seen=None):
    def eval_chunk(chunk):
        if chunks_seen is not None:
            chunks_seen.append(list(chunk))
        return np.zeros((len(chunk), V), dtype=np.float32)
    return eval_chunk


def p_of(target):
    return 0.7 if target % 2 == 0 else 0.4


def planted_model(chunk):
    """Row j gives the true next token chunk[j+1] probability 0.7 (even id) or 0.4 (odd id)."""
    rows = np.empty((len(chunk), V), dtype=np.float64)
    for j in range(len(chunk)):
        tgt = chunk[j + 1] if j + 1 < len(chunk) else 0
        p = p_of(tgt)
        rows[j] = math.log((1 - p) / (V - 1))
        rows[j, tgt] = math.log(p)
    return rows.astype(np.float32)


def test_uniform_logits_give_vocab_size():
    out = []
    r = perplexity(uniform_model(), stream(64), 16, bos_id=BOS, add_bos=True, progress=out.append)
    assert r.ppl == pytest.approx(V, rel=1e-12)
    assert r.nll == pytest.approx(math.log(V), rel=1e-12)
    assert all(c == pytest.approx(V, rel=1e-12) for c in r.chunk_ppls)
    assert f"{r.ppl:.4f}" == f"{V:.4f}"
    assert r.stderr == pytest.approx(0.0, abs=5e-6)  # cancellation in E[x^2] - E[x]^2
    assert out[-1] in (format_final(r) + "\n", "Unexpected negative standard deviation of log(prob)\n")


def test_zero_variance_prints_llama_cpp_error_line():
    out = []
    one_token = lambda chunk: np.zeros((len(chunk), 1), dtype=np.float32)  # noqa: E731
    r = perplexity(one_token, [0] * 32, 8, bos_id=0, add_bos=True, progress=out.append)
    assert r.ppl == 1.0 and r.stderr == 0.0
    assert out[-1] == "Unexpected negative standard deviation of log(prob)\n"


def test_planted_model_matches_hand_computation():
    n_ctx, toks = 10, stream(37, seed=4)
    r = perplexity(planted_model, toks, n_ctx, bos_id=BOS, add_bos=True)
    first = n_ctx // 2
    nll = []
    for i in range(len(toks) // n_ctx):  # 3 chunks; positions 5..8 predict tokens 6..9 of each chunk
        for j in range(first, n_ctx - 1):
            nll.append(-math.log(p_of(toks[i * n_ctx + j + 1])))
    nll = np.array(nll)
    mean = nll.mean()
    ppl = math.exp(mean)
    err = ppl * math.sqrt(((nll ** 2).mean() - mean ** 2) / (len(nll) - 1))
    assert r.n_tokens_scored == len(nll) == 3 * 4
    assert r.ppl == pytest.approx(ppl, rel=1e-6)
    assert r.nll == pytest.approx(mean, rel=1e-6)
    assert r.stderr == pytest.approx(err, rel=1e-5)
    running = [math.exp(nll[: 4 * (i + 1)].mean()) for i in range(3)]
    assert r.chunk_ppls == pytest.approx(running, rel=1e-6)


def test_second_half_rows_only_give_the_same_answer():
    n_ctx, toks = 12, stream(50, seed=2)
    full = perplexity(planted_model, toks, n_ctx, bos_id=BOS, add_bos=True)
    half = perplexity(lambda c: planted_model(c)[n_ctx // 2:], toks, n_ctx, bos_id=BOS, add_bos=True)
    assert half.ppl == full.ppl and half.stderr == full.stderr
    with pytest.raises(ValueError):
        perplexity(lambda c: planted_model(c)[:3], toks, n_ctx, bos_id=BOS, add_bos=True)


@pytest.mark.parametrize("n_tokens, n_ctx, n_chunks, expect_chunks", [
    (2 * 16, 16, -1, 2), (2 * 16 + 15, 16, -1, 2), (5 * 16 + 3, 16, -1, 5),
    (5 * 16 + 3, 16, 3, 3), (5 * 16 + 3, 16, 10, 5), (40, 9, -1, 4)])
def test_chunk_counting(n_tokens, n_ctx, n_chunks, expect_chunks):
    seen = []
    out = []
    r = perplexity(uniform_model(seen), stream(n_tokens), n_ctx, n_chunks=n_chunks, bos_id=BOS, add_bos=True,
                   progress=out.append)
    assert len(seen) == expect_chunks and all(len(c) == n_ctx for c in seen)
    assert len(r.chunk_ppls) == expect_chunks
    assert r.n_tokens_scored == expect_chunks * (n_ctx - n_ctx // 2 - 1)  # n_ctx/2 - 1 when n_ctx is even
    assert out[0].startswith(f"perplexity: calculating perplexity over {expect_chunks} chunks, n_ctx={n_ctx},")


def test_odd_context_scores_from_n_ctx_over_2():
    r = perplexity(uniform_model(), stream(40), 9, bos_id=BOS, add_bos=True)
    assert r.n_tokens_scored == 4 * 4  # first = 4, positions 4..7


def test_first_token_of_each_chunk_replaced_by_bos():
    toks = stream(48, seed=7)
    orig = list(toks)
    seen = []
    perplexity(uniform_model(seen), toks, 16, bos_id=BOS, add_bos=True)
    assert toks == orig  # the caller's stream is not modified
    for i, c in enumerate(seen):
        assert c[0] == BOS and c[1:] == orig[i * 16 + 1:(i + 1) * 16]
    seen.clear()
    perplexity(uniform_model(seen), toks, 16, bos_id=None, add_bos=False)
    assert [c for c in seen] == [orig[i * 16:(i + 1) * 16] for i in range(3)]


def test_bos_replacement_does_not_change_targets():
    toks = stream(40, seed=9)
    a = perplexity(planted_model, toks, 10, bos_id=BOS, add_bos=True)
    b = perplexity(planted_model, toks, 10, bos_id=None, add_bos=False)
    assert a.ppl == b.ppl


def test_too_short_text_is_a_usage_error():
    with pytest.raises(UsageError) as e:
        perplexity(uniform_model(), stream(31), 16, bos_id=BOS, add_bos=True)
    assert "32" in str(e.value) and "16" in str(e.value) and "31" in str(e.value)
    assert isinstance(e.value, ValueError) and e.value.exit_code == 2
    with pytest.raises(UsageError):
        perplexity(uniform_model(), stream(64), 16, bos_id=None, add_bos=True)
    with pytest.raises(UsageError):
        perplexity(uniform_model(), stream(64), 16, n_chunks=0, bos_id=BOS, add_bos=True)


def test_output_lines():
    out = []
    r = perplexity(planted_model, stream(70, seed=1), 16, bos_id=BOS, add_bos=True, progress=out.append,
                   n_batch=2048)
    assert out[0] == "perplexity: calculating perplexity over 4 chunks, n_ctx=16, batch_size=16, n_seq=1\n"
    assert re.fullmatch(r"perplexity: \d+\.\d\d seconds per pass - ETA \d+\.\d\d minutes\n", out[1])
    assert out[2:6] == [f"[{i + 1}]{v:.4f}," for i, v in enumerate(r.chunk_ppls)]
    assert out[6] == "\n"
    assert out[7] == format_final(r) + "\n"
    assert re.fullmatch(r"Final estimate: PPL = \d+\.\d{4} \+/- \d+\.\d{5}", format_final(r))


def test_format_final_and_eta_match_llama_cpp_samples():
    assert format_final(PerplexityResult(ppl=19.518, stderr=1.946321, chunk_ppls=[], n_tokens_scored=1,
                                         nll=0.0)) == "Final estimate: PPL = 19.5180 +/- 1.94632"
    assert _eta_line(2.89, 6) == "perplexity: 2.89 seconds per pass - ETA 0.28 minutes\n"
    assert _eta_line(3000.0, 2) == "perplexity: 3000.00 seconds per pass - ETA 1 hours 40.00 minutes\n"


def test_tokenize_input_lines():
    out = []
    toks = tokenize_input(lambda s: [BOS] + [ord(ch) for ch in s], "ab", progress=out.append)
    assert toks == [BOS, 97, 98]
    assert out[0] == "perplexity: tokenizing the input ..\n"
    assert re.fullmatch(r"perplexity: tokenization took \S+ ms\n", out[1])


def test_nll_of_rows_is_float64_log_softmax():
    logits = np.array([[0.0, 1.0, 2.0], [5.0, 5.0, -5.0]], dtype=np.float32)
    got = nll_of_rows(logits, np.array([2, 0]))
    ref = [-(2.0 - math.log(1 + math.e + math.e ** 2)), math.log(2 + math.exp(-10))]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref, rtol=1e-6)
