"""test_moe_routing.py — the router math of pi2/reference/moe_routing.py: gating functions, the top-k order of tied scores
(libstdc++'s std::sort, as ggml_argsort runs it), the weight normalisation with its clamp, the scale, and the
grouping of rows by expert (moe_matmul.group_by_expert)."""
import numpy as np
import pytest

from pi2.reference import moe_routing as mr
from pi2.reference.moe_matmul import group_by_expert

F32 = np.float32

# std::sort(idx, idx + n, [](a, b) { return v[a] > v[b]; }) from g++ 12.2 / libstdc++ (Debian 12), on
# v = rng(seed).integers(0, levels, n) / 4: the order ggml_argsort(DESC) leaves tied scores in.
LIBSTDCXX = [
    (20, 3, 1, [2, 3, 6, 7, 13, 10, 1, 17, 16, 15, 11, 0, 9, 12, 8, 14, 5, 4, 18, 19]),
    (32, 3, 2, [28, 27, 5, 26, 24, 10, 11, 12, 14, 0, 16, 31, 29, 25, 21, 19, 9, 8, 6, 4, 15, 17, 18, 13, 20, 22, 23,
                7, 3, 2, 30, 1]),
    (64, 2, 3, [31, 51, 50, 49, 22, 23, 26, 27, 29, 30, 0, 32, 44, 35, 36, 37, 38, 43, 40, 17, 16, 55, 12, 60, 5, 6,
                7, 59, 42, 52, 63, 62, 61, 45, 58, 57, 56, 46, 47, 48, 54, 53, 15, 1, 2, 3, 4, 8, 9, 10, 11, 13, 14,
                41, 18, 19, 20, 21, 24, 25, 28, 33, 34, 39]),
    (128, 4, 4, [83, 29, 30, 33, 35, 43, 52, 55, 56, 64, 65, 70, 71, 80, 1, 90, 92, 94, 95, 97, 105, 109, 110, 112,
                 117, 123, 124, 125, 27, 13, 17, 21, 6, 5, 4, 24, 2, 28, 66, 0, 100, 61, 62, 63, 19, 9, 101, 67, 16,
                 12, 75, 86, 84, 14, 81, 48, 41, 34, 120, 45, 39, 32, 107, 53, 3, 36, 121, 10, 87, 88, 89, 127, 119,
                 11, 106, 115, 114, 113, 111, 99, 104, 8, 40, 51, 50, 54, 20, 57, 49, 23, 42, 69, 38, 73, 74, 25, 77,
                 78, 31, 122, 37, 26, 118, 116, 44, 46, 47, 126, 82, 18, 15, 79, 85, 76, 91, 72, 93, 68, 96, 7, 98,
                 60, 59, 58, 102, 103, 22, 108]),
]


@pytest.mark.parametrize("n,levels,seed,want", LIBSTDCXX)
def test_tied_scores_fall_as_std_sort_leaves_them(n, levels, seed, want):
    v = np.random.default_rng(seed).integers(0, levels, n).astype(F32) / 4
    assert mr.argsort_desc(v[None])[0].tolist() == want


def test_up_to_16_ties_keep_index_order():
    """Below 17 values std::sort is an insertion sort: stable, so tied experts stay in index order."""
    v = np.array([0.5, 0.25, 0.5, 0.5, 0.25, 0.75, 0.5, 0.0], F32)
    assert mr.argsort_desc(v[None])[0].tolist() == [5, 0, 2, 3, 6, 1, 4, 7]


def test_distinct_scores_sort_descending():
    v = np.random.default_rng(0).standard_normal((5, 60)).astype(F32)
    assert (mr.argsort_desc(v) == np.argsort(-v, axis=1)).all()


def test_heapsort_fallback_sorts():
    """The depth limit's heapsort (reached only on adversarial input) still sorts descending."""
    keys = [float(x) for x in np.random.default_rng(5).integers(0, 9, 300)]
    idx = list(range(300))
    mr._heap_sort(idx, 0, 300, lambda a, b: keys[a] > keys[b])
    assert all(keys[idx[i]] >= keys[idx[i + 1]] for i in range(299))


@pytest.mark.parametrize("n", [4, 8, 16, 17, 32, 60, 128])
def test_softmax_sums_to_one_and_tracks_float64(n):
    x = (np.random.default_rng(n).standard_normal((7, n)) * 3).astype(F32)
    p = mr.softmax(x)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    assert p.dtype == F32
    assert np.allclose(p, ref, rtol=2e-6, atol=1e-9)


def test_softmax_tail_uses_libm_expf():
    """ggml_vec_soft_max_f32 computes the n % 16 last values with libm's expf, the rest with ggml_v_expf."""
    x = np.linspace(-3, 0, 20, dtype=F32)[None]
    p = mr.softmax(x)
    s = mr.softmax(x)[0, 16:] / mr.expf(x[0, 16:])          # every tail value is expf(x - max) · the same factor
    assert np.all(s == s[0])
    assert p.shape == (1, 20)


def test_sigmoid_is_one_over_one_plus_expf():
    x = np.array([-20, -1.5, 0, 0.25, 3, 30], F32)
    want = np.array([1 / (1 + np.float32(np.exp(np.float32(-v)))) for v in x], F32)
    assert np.allclose(mr.sigmoid(x), want, rtol=1e-7)
    assert mr.sigmoid(np.float32([0]))[0] == F32(0.5)


def test_sqrt_softplus():
    x = np.array([-5, 0, 1, 19.5, 20, 25], F32)
    got = mr.sqrt_softplus(x)
    assert got[-1] == np.sqrt(F32(25))                     # above 20 softplus is the identity
    assert np.allclose(got, np.sqrt(np.log1p(np.exp(x.astype(np.float64)))), rtol=1e-6)


def test_route_picks_top_k_in_descending_order_and_normalises():
    logits = np.array([[0.1, 2.0, -1.0, 1.5, 0.3, 2.0]], F32)
    sel, w = mr.route(logits, 3, "softmax", norm=True)
    assert sel.tolist() == [[1, 5, 3]]                       # the tie 1/5 in index order (n <= 16)
    p = mr.softmax(logits)[0]
    total = np.float32(np.float64(p[1]) + np.float64(p[5]) + np.float64(p[3]))
    assert w[0].tolist() == (p[[1, 5, 3]] / total).tolist()


def test_route_without_normalisation_keeps_probabilities():
    logits = np.random.default_rng(3).standard_normal((4, 12)).astype(F32)
    sel, w = mr.route(logits, 4, "softmax", norm=False)
    p = mr.softmax(logits)
    assert (w == np.take_along_axis(p, sel, axis=1)).all()


def test_normalisation_clamps_tiny_sums():
    """Sigmoid of very negative logits sums below 2^-14: the divisor is clamped, the weights stay tiny."""
    logits = np.full((1, 8), -30, F32)
    logits[0, 2] = -29
    sel, w = mr.route(logits, 2, "sigmoid", norm=True)
    p = mr.sigmoid(logits)[0]
    assert sel[0].tolist() == [2, 0]
    assert w[0].tolist() == (p[[2, 0]] / mr.NORM_CLAMP).tolist()
    assert w.sum() < 1e-3


def test_softmax_weight_softmaxes_the_selected_logits():
    logits = np.array([[1.0, 4.0, 2.0, 3.0]], F32)
    sel, w = mr.route(logits, 2, "softmax_weight", norm=False)
    assert sel.tolist() == [[1, 3]]
    assert w[0].tolist() == mr.softmax(np.array([[4.0, 3.0]], F32))[0].tolist()


@pytest.mark.parametrize("scale,factor", [(0.0, 1.0), (1.0, 1.0), (2.5, 2.5)])
def test_scale_applies_unless_zero_or_one(scale, factor):
    logits = np.random.default_rng(9).standard_normal((3, 10)).astype(F32)
    _, w0 = mr.route(logits, 3, "softmax", norm=True)
    _, w = mr.route(logits, 3, "softmax", norm=True, scale=scale)
    assert (w == (w0 * F32(factor))).all()


def test_unknown_gating_is_refused():
    with pytest.raises(ValueError):
        mr.gate_probs(np.zeros((1, 4), F32), "relu")


def test_group_by_expert_scans_tokens_then_slots():
    sel = np.array([[2, 0], [0, 3], [2, 3], [1, 2]], np.int32)
    got = [(e, t.tolist(), s.tolist()) for e, t, s in group_by_expert(sel, 5)]
    assert got == [(0, [0, 1], [1, 0]), (1, [3], [0]), (2, [0, 2, 3], [0, 0, 1]), (3, [1, 2], [1, 1])]
