"""test_sampling.py — pi2.runtime.sampling stage by stage on hand-made logits, plus seeds, speed and the banner."""
import time

import numpy as np
import pytest

from pi2.errors import UsageError
from pi2.runtime.sampling import LLAMA_DEFAULT_SEED, Sampler, SamplerParams, resolve_seed

OFF = dict(top_k=0, top_p=1.0, min_p=0.0, temp=1.0)  # every filter off


def make(n_vocab=8, n_ctx=64, **kw):
    return Sampler(SamplerParams(**{"seed": 1, **kw}), n_vocab=n_vocab, n_ctx=n_ctx)


def ids_after(sampler, logits):
    ids, _ = sampler.candidates(np.asarray(logits, dtype=np.float32))
    return ids.tolist()


def test_defaults_match_llama_cpp():
    p = SamplerParams()
    assert (p.temp, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.frequency_penalty, p.presence_penalty, p.seed) == \
        (1.0, 64, 0.0, 0.0, -1)


# -- top-k -------------------------------------------------------------------------------------------

def test_top_k_keeps_exactly_k_with_ties_to_lowest_id():
    logits = [1.0, 3.0, 3.0, 2.0, 3.0, 0.0]
    s = make(6, **{**OFF, "top_k": 2})
    assert ids_after(s, logits) == [1, 2]
    s = make(6, **{**OFF, "top_k": 4})
    assert ids_after(s, logits) == [1, 2, 4, 3]


def test_top_k_larger_than_vocab_keeps_all_sorted():
    s = make(4, **{**OFF, "top_k": 100})
    assert ids_after(s, [0.0, 2.0, 1.0, 3.0]) == [3, 1, 2, 0]


def test_top_k_zero_is_off():
    s = make(5, **OFF)
    assert ids_after(s, [0.0, 2.0, 1.0, 3.0, -1.0]) == [0, 1, 2, 3, 4]


def test_top_k_large_vocab_matches_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(151_936).astype(np.float32)
    logits[[5, 70_000, 150_000]] = logits.max() + 1  # three-way tie at the top
    s = make(logits.shape[0], **{**OFF, "top_k": 40})
    expect = np.argsort(-logits, kind="stable")[:40]
    assert ids_after(s, logits) == expect.tolist()
    assert ids_after(s, logits)[:3] == [5, 70_000, 150_000]


# -- top-p -------------------------------------------------------------------------------------------

PROBS = np.log(np.array([0.5, 0.25, 0.15, 0.1], dtype=np.float64)).astype(np.float32)


@pytest.mark.parametrize("p, kept", [(0.4999, [0]), (0.7499, [0, 1]), (0.7501, [0, 1, 2]),
                                     (0.8999, [0, 1, 2]), (0.9001, [0, 1, 2, 3]), (1e-6, [0])])
def test_top_p_keeps_smallest_prefix_reaching_p(p, kept):
    s = make(4, **{**OFF, "top_k": 40, "top_p": p})
    assert ids_after(s, PROBS) == kept
    s = make(4, **{**OFF, "top_p": p})  # unsorted input (top-k off) gives the same set, in order
    assert ids_after(s, PROBS[::-1].copy()) == [3 - i for i in kept]


def test_top_p_unsorted_large_vocab_matches_brute_force():
    rng = np.random.default_rng(1)
    logits = (3 * rng.standard_normal(50_000)).astype(np.float32)
    for p in (0.5, 0.95, 0.999999):
        s = make(logits.shape[0], **{**OFF, "top_p": p})
        order = np.argsort(-logits, kind="stable")
        e = np.exp(logits - logits.max(), dtype=np.float32)
        cum = np.cumsum((e / np.cumsum(e)[-1])[order], dtype=np.float32)  # float running sum
        n = int(np.flatnonzero(cum >= np.float32(p))[0]) + 1 if (cum >= np.float32(p)).any() else len(order)
        got = ids_after(s, logits)
        assert got == order[:n].tolist()


# -- min-p -------------------------------------------------------------------------------------------

MINP = np.log(np.array([0.049, 1.0, 0.051, 0.5], dtype=np.float64)).astype(np.float32)


def test_min_p_relative_to_max_prob_sorted_and_unsorted():
    s = make(4, **{**OFF, "top_k": 40, "min_p": 0.05})
    assert ids_after(s, MINP) == [1, 3, 2]
    s = make(4, **{**OFF, "min_p": 0.05})
    assert ids_after(s, MINP) == [1, 2, 3]
    s = make(4, **{**OFF, "min_p": 0.0})
    assert ids_after(s, MINP) == [0, 1, 2, 3]


def test_min_p_always_keeps_the_top_token():
    s = make(3, **{**OFF, "top_k": 3, "min_p": 0.999})
    assert ids_after(s, [0.0, 1.0, 0.5]) == [1]


# -- penalties ---------------------------------------------------------------------------------------

def test_repeat_penalty_divides_positive_multiplies_negative_once_per_token():
    s = make(5, repeat_penalty=2.0)
    for t in (0, 1, 0, 3):
        s.accept(t)
    out = s.apply_penalties(np.array([2.0, -2.0, 1.0, 0.0, 5.0], dtype=np.float32))
    np.testing.assert_array_equal(out, np.float32([1.0, -4.0, 1.0, 0.0, 5.0]))


def test_frequency_and_presence_penalties():
    s = make(4, frequency_penalty=0.5, presence_penalty=0.25)
    for t in (0, 1, 0):
        s.accept(t)
    out = s.apply_penalties(np.array([2.0, -2.0, 1.0, 0.0], dtype=np.float32))
    np.testing.assert_allclose(out, [2.0 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 1.0, 0.0], rtol=1e-6)


def test_penalty_window_of_last_n():
    x = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    s = make(4, repeat_penalty=2.0, repeat_last_n=2)
    for t in (0, 1, 2):
        s.accept(t)
    np.testing.assert_array_equal(s.apply_penalties(x), np.float32([1.0, 0.5, 0.5, 1.0]))
    s = make(4, n_ctx=3, repeat_penalty=2.0, repeat_last_n=-1)  # -1 = context size
    assert s.repeat_last_n == 3
    for t in (0, 1, 2, 3):
        s.accept(t)
    np.testing.assert_array_equal(s.apply_penalties(x), np.float32([1.0, 0.5, 0.5, 0.5]))
    s = make(4, repeat_penalty=2.0, repeat_last_n=0)  # 0 = off
    s.accept(0)
    np.testing.assert_array_equal(s.apply_penalties(x), x)
    with pytest.raises(UsageError):
        make(4, repeat_last_n=-2)


def test_penalty_off_at_defaults_leaves_logits_untouched():
    s = make(3)
    s.accept(0)
    x = np.array([1.0, -1.0, 0.5], dtype=np.float32)
    np.testing.assert_array_equal(s.apply_penalties(x), x)
    assert not s.penalties_active


# -- temperature / greedy ----------------------------------------------------------------------------

def test_temp_zero_is_greedy_after_penalties_lowest_id_on_ties():
    s = make(4, temp=0.0)
    assert s.sample(np.float32([0.0, 2.0, 1.0, 2.0])) == 1
    s = make(4, temp=-1.0, repeat_penalty=4.0)
    s.accept(1)
    s.accept(3)
    assert s.sample(np.float32([0.0, 2.0, 1.0, 2.0])) == 2  # 2/4 = 0.5 < 1.0


def test_temp_scales_logits():
    s = make(3, **{**OFF, "temp": 0.5})
    _, lv = s.candidates(np.float32([1.0, -1.0, 0.5]))
    np.testing.assert_array_equal(lv, np.float32([2.0, -2.0, 1.0]))


# -- draws -------------------------------------------------------------------------------------------

def test_seed_reproducibility_and_random_seed():
    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32)

    def run(seed):
        s = make(1000, seed=seed)
        return s, [s.sample(logits) for _ in range(50)]

    assert run(42)[1] == run(42)[1]
    assert run(42)[1] != run(43)[1]
    s, seq = run(-1)
    assert 0 <= s.seed < 2**32 and s.seed != LLAMA_DEFAULT_SEED
    assert run(s.seed)[1] == seq
    assert 0 <= resolve_seed(LLAMA_DEFAULT_SEED) < 2**32
    s = make(1000, seed=42)
    first = [s.sample(logits) for _ in range(20)]
    s.accept(3)
    s.reset()  # fixed seed: the same draws again, history gone
    assert [s.sample(logits) for _ in range(20)] == first and not s._count
    assert resolve_seed(7) == 7 and resolve_seed(2**32 + 7) == 7


def test_empirical_frequencies_follow_softmax():
    logits = np.float32([0.0, 1.0, 2.0, 0.5, -1.0])
    temp = 0.7
    s = make(5, seed=123, **{**OFF, "temp": temp})
    n = 40_000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=5)
    p = np.exp(logits / temp - (logits / temp).max())
    p /= p.sum()
    sigma = np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) < 5 * sigma), (counts, n * p)


def test_filtered_tokens_are_never_drawn():
    logits = np.float32([5.0, 4.9, 0.0, -3.0, -9.0])
    s = make(5, seed=9, top_k=3, top_p=0.95, min_p=0.05, temp=0.8)
    drawn = {s.sample(logits) for _ in range(2000)}
    assert drawn == {0, 1}


def test_sampling_speed_on_152k_vocab():
    n_vocab = 151_936
    logits = np.random.default_rng(5).standard_normal(n_vocab).astype(np.float32) * 4
    s = make(n_vocab, seed=1, repeat_penalty=1.1)
    for t in range(64):
        s.accept(t * 97)
    s.sample(logits)
    t0 = time.perf_counter()
    for _ in range(100):
        s.accept(s.sample(logits))
    assert time.perf_counter() - t0 < 1.0  # well over 100 tokens/s of sampling


def test_describe_banner():
    s = make(32000, n_ctx=4096, seed=5)
    lines = s.describe().split("\n")
    assert lines[0] == "sampler seed: 5"
    assert lines[1] == "sampler params: "
    assert lines[2] == ("\trepeat_last_n = 64, repeat_penalty = 1.000, frequency_penalty = 0.000, "
                        "presence_penalty = 0.000")
    assert lines[4] == ("\ttop_k = 40, top_p = 0.950, min_p = 0.050, xtc_probability = 0.000, "
                        "xtc_threshold = 0.100, typical_p = 1.000, top_n_sigma = -1.000, temp = 0.800")
    assert lines[-1] == ("sampler chain: logits -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical "
                         "-> top-p -> min-p -> ?xtc -> temp-ext -> dist ")
    s = make(10, repeat_penalty=1.1, top_k=0, min_p=0.0, temp=1.0)
    chain = s.describe().split("\n")[-1]
    assert chain.startswith("sampler chain: logits -> penalties -> ?dry -> ?top-n-sigma -> ?top-k ")
    assert "-> ?min-p -> ?xtc -> ?temp-ext -> dist " in chain


# -- llama.cpp's other samplers: parameters, ranges, order --------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"temp": float("nan")}, "--temp"), ({"top_p": 2.0}, "--top-p"), ({"min_p": -1.0}, "--min-p"),
    ({"repeat_penalty": 0.0}, "--repeat-penalty"), ({"repeat_penalty": -1.0}, "--repeat-penalty"),
    ({"typ_p": 1.5}, "--typical"), ({"mirostat": 3}, "--mirostat"), ({"xtc_probability": 2.0}, "--xtc-probability"),
    ({"dry_base": 0.5}, "--dry-base"), ({"top_k": -2}, "--top-k"), ({"presence_penalty": float("inf")}, "presence"),
    ({"dry_penalty_last_n": -2}, "--dry-penalty-last-n"), ({"samplers": "top_k;bogus"}, "bogus"),
])
def test_out_of_range_values_are_usage_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        SamplerParams(**kw)


def test_samplers_order_by_names_aliases_and_letters():
    assert SamplerParams(samplers="top_k;temp;min-p").samplers == ("top_k", "temperature", "min_p")
    assert SamplerParams(samplers="kt").samplers == ("top_k", "temperature")
    s = make(10, samplers="temperature;top_k", top_k=3, typ_p=0.9)
    assert s.describe().split("\n")[-1] == "sampler chain: logits -> temp-ext -> top-k -> dist "
    s = make(10, mirostat=2)
    assert s.describe().split("\n")[-1] == "sampler chain: logits -> temp -> mirostat-v2 "


def test_order_changes_the_candidates():
    logits = np.float32([4.0, 3.9, 1.0, 0.5, 0.0])
    # min-p before temperature cuts at 0.5 of the top probability; after a high temperature, it keeps more
    first = ids_after(make(5, **{**OFF, "min_p": 0.5, "temp": 10.0, "samplers": "min_p;temperature"}), logits)
    after = ids_after(make(5, **{**OFF, "min_p": 0.5, "temp": 10.0, "samplers": "temperature;min_p"}), logits)
    assert first == [0, 1] and after == [0, 1, 2, 3, 4]


class _Vocab:
    """A tokenizer of single characters, for DRY's sequence breakers."""
    pieces = [b"a", b"b", b"c", b"\n", b"x:", b"d"]
    n_vocab = len(pieces)

    def token_to_piece(self, t, special=True):
        return self.pieces[t]

    def encode(self, text, add_special=False, parse_special=False):
        return [self.pieces.index(ch.encode()) for ch in text]


def test_dry_penalises_a_repeat_and_stops_at_a_breaker():
    kw = {**OFF, "dry_multiplier": 1.0, "dry_base": 2.0, "dry_allowed_length": 2, "samplers": "dry"}
    s = Sampler(SamplerParams(**kw, seed=1), 6, 64, tokenizer=_Vocab())
    for t in [0, 1, 2, 5, 0, 1]:          # "a b c d a b": c would extend the repeat "a b" (length 2)
        s.accept(t)
    _, lv = s.candidates(np.zeros(6, dtype=np.float32))
    assert lv.tolist() == [0, 0, -1.0, 0, 0, 0]
    kw["dry_allowed_length"] = 1
    s = Sampler(SamplerParams(**kw, seed=1), 6, 64, tokenizer=_Vocab())
    for t in [0, 1, 2, 5, 0, 1, 5]:       # "... d": a would extend the repeat "d" (length 1)
        s.accept(t)
    _, lv = s.candidates(np.zeros(6, dtype=np.float32))
    assert lv.tolist() == [-1.0, 0, 0, 0, 0, 0]
    s = Sampler(SamplerParams(**kw, seed=1), 6, 64, tokenizer=_Vocab())
    for t in [0, 1, 2, 5, 0, 1, 3]:       # a newline (a breaker) last: no repeat may reach past it
        s.accept(t)
    _, lv = s.candidates(np.zeros(6, dtype=np.float32))
    assert lv.tolist() == [0] * 6
    assert 4 in s._dry.breakers and [] in s._dry.breakers[4]     # "x:" contains the breaker ":"


def test_top_k_of_a_large_vocabulary_is_exact_with_ties():
    """The column-maxima bound (_TOP_K_GROUPS) selects exactly what a full sort does, ties at the cut to the lowest
    ids: integer logits (many ties), all equal, normal, heavy-tailed with -inf, and the largest in the last few ids
    (past the columns when n is not a multiple of the groups)."""
    from pi2.runtime.sampling import _top_k_order
    rng = np.random.default_rng(7)
    for trial in range(100):
        n = int(rng.choice([20000, 20001, 49152, 151936]))
        kind = trial % 5
        logits = (rng.integers(-5, 6, n) if kind == 0 else np.zeros(n) if kind == 1
                  else rng.standard_normal(n) if kind == 2 else rng.standard_cauchy(n)).astype(np.float32)
        if kind == 3:
            logits[rng.integers(0, n, 50)] = -np.inf
        if kind == 4:
            logits[-(n % 64 or 1):] = 100.0
        k = int(rng.choice([1, 5, 40, 200]))
        want = np.lexsort((np.arange(n), -logits))[:k]
        assert (_top_k_order(logits, k) == want).all(), (trial, n, k)
