"""gemma4cpu.sampling: llama.cpp's default chain (penalty -> top-k -> top-p -> min-p -> temperature).

Expected distributions come from `reference()` below, written independently of the sampler (a full
float64 sort of the vocabulary, one stage after another), never from Sampler.probs. Sampled
frequencies are checked with a chi-square goodness-of-fit test; scipy is not a dependency, so the
chi-square survival function is computed here from the regularized upper incomplete gamma function
(series / continued fraction) and is itself checked against closed forms.
"""
import dataclasses
import math

import numpy as np
import pytest

from gemma4cpu.sampling import Sampler, SamplingParams

P_MIN = 1e-3          # a correct sampler fails a chi-square check with this probability per check


# -- independent reference --------------------------------------------------------------------------


def _softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


def reference(logits, params: SamplingParams, history=()):
    """(distribution over the vocabulary, number of tokens left after each stage)."""
    x = np.array(logits, dtype=np.float64)
    x[np.isnan(x)] = -np.inf
    n = x.size
    hist = list(history)
    if params.repeat_last_n == -1:
        window = hist
    elif params.repeat_last_n > 0:
        window = hist[-params.repeat_last_n:]
    else:
        window = []
    for t in set(window):
        x[t] = x[t] / params.repeat_penalty if x[t] > 0 else x[t] * params.repeat_penalty

    out = np.zeros(n)
    if params.temperature == 0:
        out[int(np.argmax(x))] = 1.0
        return out, {}

    order = np.lexsort((np.arange(n), -x))            # descending logit, ties: lowest id first
    order = order[np.isfinite(x[order])]
    sizes = {"start": order.size}
    if 0 < params.top_k < n:
        order = order[: params.top_k]
    sizes["top_k"] = order.size
    if params.top_p < 1.0:
        p = _softmax(x[order])
        cum = 0.0
        for i, pi in enumerate(p):
            cum += pi
            if cum >= params.top_p:
                break
        order = order[: i + 1]
    sizes["top_p"] = order.size
    if params.min_p > 0.0:
        p = _softmax(x[order])
        order = order[p >= params.min_p * p.max()]
    sizes["min_p"] = order.size
    out[order] = _softmax(x[order] / params.temperature)
    return out, sizes


# -- chi-square -----------------------------------------------------------------------------------


def chi2_sf(x, df):
    """P(X >= x) for X ~ chi-square(df) = Q(df/2, x/2), the regularized upper incomplete gamma
    function: power series for P = 1 - Q when z < a + 1, else Lentz's continued fraction for Q
    (Numerical Recipes' gser/gcf)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0.0:
        return 1.0
    log_pref = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1.0:
        term = 1.0 / a
        total = term
        k = 1
        while term > total * 1e-17:
            term *= z / (a + k)
            total += term
            k += 1
        return max(0.0, 1.0 - total * math.exp(log_pref))
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = d if abs(d) > tiny else tiny
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_pref) * h


def chi_square_p(samples, expected_probs):
    """Goodness-of-fit p-value of integer samples against a distribution; bins with expected count
    < 5 are merged into one bin (and that into the smallest other bin if it is still < 5)."""
    n = len(samples)
    counts = np.bincount(samples, minlength=expected_probs.size)
    support = np.flatnonzero(expected_probs > 0)
    exp = n * expected_probs[support]
    obs = counts[support].astype(np.float64)
    small = exp < 5
    bins_e, bins_o = list(exp[~small]), list(obs[~small])
    if small.any():
        se, so = exp[small].sum(), obs[small].sum()
        if se < 5 and bins_e:
            j = int(np.argmin(bins_e))
            bins_e[j] += se
            bins_o[j] += so
        else:
            bins_e.append(se)
            bins_o.append(so)
    assert len(bins_e) >= 2, "need at least two bins for a chi-square test"
    e, o = np.array(bins_e), np.array(bins_o)
    stat = float(((o - e) ** 2 / e).sum())
    return chi2_sf(stat, len(e) - 1)


def _q_closed_form(df, x):
    """Q(df/2, x/2) from the integer / half-integer recurrences: Q(1, z) = e^-z,
    Q(1/2, z) = erfc(sqrt z), Q(a+1, z) = Q(a, z) + z^a e^-z / Gamma(a+1)."""
    z = x / 2.0
    if df % 2 == 0:
        a, q = 1.0, math.exp(-z)
    else:
        a, q = 0.5, math.erfc(math.sqrt(z))
    while a < df / 2.0:
        q += math.exp(a * math.log(z) - z - math.lgamma(a + 1.0))
        a += 1.0
    return q


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 25, 40, 61])
def test_chi2_sf_matches_closed_forms(df):
    for x in [0.05, 0.5, 1.0, 3.0, df * 0.5, df - 1.0, float(df), df + 2.0, 2.0 * df, 3.0 * df + 10, 100.0]:
        if x <= 0:
            continue
        want = _q_closed_form(df, x)
        got = chi2_sf(x, df)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-14), (df, x)


# -- fixtures / helpers -----------------------------------------------------------------------------

V = 50


@pytest.fixture(scope="module")
def logits50():
    """Zipf-like logits (log p ~ -1.5 log rank, as language-model outputs roughly are) with a little
    noise, at shuffled token ids: a long tail for top-p, a spread for min-p to cut."""
    r = np.random.default_rng(20240601)
    x = -1.5 * np.log(np.arange(1, V + 1)) + r.normal(0.0, 0.1, V)
    return r.permutation(x).astype(np.float32)


def _draw(sampler, logits, n, history=()):
    return np.array([sampler.sample(logits, history) for _ in range(n)], dtype=np.int64)


# -- determinism ----------------------------------------------------------------------------------


def test_same_seed_same_sequence_different_seed_differs_and_reset_restarts():
    logits = np.random.default_rng(7).normal(0.0, 0.1, 100)     # flat-ish: ~1% per token
    p = SamplingParams(temperature=1.0, top_k=0, seed=1234)
    a = Sampler(p, 100)
    b = Sampler(p, 100)
    sa = [a.sample(logits) for _ in range(200)]
    sb = [b.sample(logits) for _ in range(200)]
    assert sa == sb
    assert all(type(t) is int for t in sa)
    c = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=1235), 100)
    assert [c.sample(logits) for _ in range(200)] != sa
    a.reset()
    assert [a.sample(logits) for _ in range(200)] == sa
    assert len(set(sa)) > 20          # really random draws, not a constant


def test_seed_none_draws_one_and_exposes_it():
    logits = np.random.default_rng(8).normal(0.0, 0.1, 100)
    p = SamplingParams(temperature=1.0, top_k=0)
    a = Sampler(p, 100)
    b = Sampler(p, 100)
    assert isinstance(a.seed, int) and a.seed >= 0
    assert a.seed != b.seed
    seq = [a.sample(logits) for _ in range(100)]
    again = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=a.seed), 100)
    assert [again.sample(logits) for _ in range(100)] == seq


def test_probs_does_not_consume_rng():
    logits = np.random.default_rng(9).normal(0.0, 1.0, 64)
    p = SamplingParams(temperature=0.8, seed=5)
    a, b = Sampler(p, 64), Sampler(p, 64)
    for _ in range(20):
        a.probs(logits)
    assert [a.sample(logits) for _ in range(50)] == [b.sample(logits) for _ in range(50)]


# -- greedy / top-k = 1 ---------------------------------------------------------------------------


def test_top_k_1_equals_greedy_equals_argmax(rng):
    greedy = Sampler(SamplingParams(temperature=0.0), 1000)
    for i in range(150):
        if i % 3 == 0:      # many exact ties at the maximum: argmax (lowest id) must win
            logits = rng.integers(0, 6, 1000).astype(np.float32)
        else:
            logits = rng.normal(0.0, rng.uniform(0.1, 5.0), 1000).astype(np.float32)
        want = int(np.argmax(logits))
        t = float(rng.uniform(0.1, 3.0))
        s = Sampler(SamplingParams(temperature=t, top_k=1, seed=i), 1000)
        assert s.sample(logits) == want
        assert greedy.sample(logits) == want
        onehot = np.zeros(1000)
        onehot[want] = 1.0
        np.testing.assert_array_equal(s.probs(logits), onehot)
        np.testing.assert_array_equal(greedy.probs(logits), onehot)


def test_greedy_ignores_filters_and_rng():
    logits = np.random.default_rng(3).normal(0.0, 2.0, 300)
    want = int(np.argmax(logits))
    for p in [SamplingParams(), SamplingParams(top_k=0, top_p=0.1, min_p=0.9, seed=1)]:
        s = Sampler(p, 300)
        assert [s.sample(logits) for _ in range(5)] == [want] * 5


# -- repetition penalty ---------------------------------------------------------------------------


def test_penalty_changes_argmax_as_hand_computed():
    logits = np.zeros(16, dtype=np.float32)
    logits[3], logits[7], logits[9] = 2.0, 1.9, -1.0
    pen = 1.1
    assert 2.0 / pen < 1.9 < 2.0                        # the case is constructed to flip
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=pen), 16)
    assert s.sample(logits) == 3
    assert s.sample(logits, history=[3]) == 7
    assert s.sample(logits, history=[3, 7]) == 3        # both divided: order restored


def test_penalty_divides_positive_multiplies_negative():
    n = 32
    logits = np.random.default_rng(11).normal(0.0, 1.0, n).astype(np.float32)
    pos, neg = int(np.argmax(logits)), int(np.argmin(logits))
    assert logits[pos] > 0 > logits[neg]
    far = next(i for i in range(n) if i not in (pos, neg))
    history = [far, pos, pos, neg]                       # `far` drops out of a 3-token window
    pen = 1.7
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, repeat_penalty=pen, repeat_last_n=3), n)
    got = s.probs(logits, history)
    x = logits.astype(np.float64)
    want_x = x.copy()
    want_x[pos] = x[pos] / pen                           # once, although seen twice
    want_x[neg] = x[neg] * pen
    want = np.exp(want_x - want_x.max())
    want /= want.sum()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # log-probability differences expose the penalized logits themselves
    lg = np.log(got)
    assert lg[pos] - lg[far] == pytest.approx(x[pos] / pen - x[far], abs=1e-9)
    assert lg[neg] - lg[far] == pytest.approx(x[neg] * pen - x[far], abs=1e-9)

    # any iterable of ids works (a generator, an array) and gives the same result
    np.testing.assert_array_equal(s.probs(logits, iter(history)), got)
    np.testing.assert_array_equal(s.probs(logits, np.array(history, dtype=np.int32)), got)

    # -1 looks at the whole history (far penalized too); 0 and penalty 1 turn it off
    whole = Sampler(SamplingParams(temperature=1.0, top_k=0, repeat_penalty=pen, repeat_last_n=-1), n)
    ref_whole, _ = reference(logits, whole.params, history)
    np.testing.assert_allclose(whole.probs(logits, history), ref_whole, rtol=0, atol=1e-12)
    plain = _softmax(x)
    for p in [SamplingParams(temperature=1.0, top_k=0, repeat_penalty=pen, repeat_last_n=0),
              SamplingParams(temperature=1.0, top_k=0, repeat_penalty=1.0)]:
        np.testing.assert_allclose(Sampler(p, n).probs(logits, history), plain, rtol=0, atol=1e-12)


def test_callers_arrays_unchanged():
    logits = np.random.default_rng(12).normal(0.0, 1.0, 40).astype(np.float32)
    logits[5] = np.nan
    before = logits.copy()
    hist = np.array([1, 2, 3, 1])
    s = Sampler(SamplingParams(temperature=0.9, repeat_penalty=1.5, seed=0), 40)
    s.sample(logits, hist)
    s.probs(logits, hist)
    np.testing.assert_array_equal(logits, before)       # (NaN == NaN here)
    np.testing.assert_array_equal(hist, [1, 2, 3, 1])


# -- filtered distributions: chi-square against the reference ----------------------------------------

# (params, history, number of draws)
SETTINGS = {
    "temp0.7": (SamplingParams(temperature=0.7, top_k=0, seed=101), (), 20000),
    "top_p0.8_temp1.3": (SamplingParams(temperature=1.3, top_k=0, top_p=0.8, seed=202), (), 20000),
    "top_k10_min_p0.05_temp0.9": (SamplingParams(temperature=0.9, top_k=10, min_p=0.05, seed=303), (),
                                  20000),
    "all_filters_penalty": (SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05,
                                           repeat_penalty=1.3, repeat_last_n=8, seed=404),
                            (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), 8000),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampled_frequencies_match_reference(name, logits50):
    params, history, n_draws = SETTINGS[name]
    want, sizes = reference(logits50, params, history)
    # the filters under test must actually remove tokens here, or the check would be vacuous
    if params.top_k:
        assert sizes["top_k"] < sizes["start"]
    if params.top_p < 1:
        assert sizes["top_p"] < sizes["top_k"]
    if params.min_p > 0:
        assert sizes["min_p"] < sizes["top_p"]
    if history:
        ref_no_pen, _ = reference(logits50, dataclasses.replace(params, repeat_penalty=1.0))
        assert np.abs(ref_no_pen - want).max() > 1e-3

    s = Sampler(params, V)
    np.testing.assert_allclose(s.probs(logits50, history), want, rtol=0, atol=1e-12)
    samples = _draw(s, logits50, n_draws, history)
    outside = np.flatnonzero(want == 0)
    assert not np.isin(samples, outside).any(), "drew a token the filters removed"
    p = chi_square_p(samples, want)
    assert p > P_MIN, f"{name}: chi-square p = {p:.3g}"


@pytest.mark.parametrize("wrong_t,n_draws", [(1.0, 2000), (0.75, 5000)])
def test_chi_square_check_has_power(logits50, wrong_t, n_draws):
    """Samples at a wrong temperature judged against the temperature-0.7 reference are rejected
    (even a 7% error in the temperature, with fewer draws than the checks above use)."""
    want, _ = reference(logits50, SETTINGS["temp0.7"][0])
    wrong = Sampler(SamplingParams(temperature=wrong_t, top_k=0, seed=505), V)
    samples = _draw(wrong, logits50, n_draws)
    assert chi_square_p(samples, want) < P_MIN


# -- top-k ties, large vocabularies -------------------------------------------------------------------


def test_top_k_ties_keep_lowest_ids():
    logits = np.array([5.0, 3.0, 1.0, 3.0, 3.0, 0.0, 3.0, 2.0])
    s = Sampler(SamplingParams(temperature=1.0, top_k=3), logits.size)
    assert set(np.flatnonzero(s.probs(logits))) == {0, 1, 3}
    s = Sampler(SamplingParams(temperature=1.0, top_k=5), logits.size)
    assert set(np.flatnonzero(s.probs(logits))) == {0, 1, 3, 4, 6}
    # top-p cuts inside a run of equal logits: lowest ids first
    flat = np.zeros(10)
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.35), 10)
    assert set(np.flatnonzero(s.probs(flat))) == {0, 1, 2, 3}


@pytest.mark.parametrize("case", ["normal", "quantized_ties", "ascending", "with_neg_inf"])
def test_large_vocab_matches_reference(case):
    n = 262144
    r = np.random.default_rng(99)
    if case == "normal":
        logits = r.normal(0.0, 2.0, n).astype(np.float32)
    elif case == "quantized_ties":
        logits = np.round(r.normal(0.0, 2.0, n), 1).astype(np.float32)   # large tie groups
    elif case == "ascending":
        logits = np.linspace(-5.0, 5.0, n).astype(np.float32)           # a sorted vocabulary
    else:
        logits = r.normal(0.0, 2.0, n).astype(np.float32)
        logits[r.random(n) < 0.9] = -np.inf
    hist = r.integers(0, n, 100)
    for params in [SamplingParams(temperature=0.8, top_k=40, repeat_penalty=1.2, seed=1),
                   SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=1),
                   SamplingParams(temperature=1.1, top_k=1000, top_p=0.95, seed=1),
                   SamplingParams(temperature=0.7, top_k=0, top_p=0.6, seed=1)]:
        want, _ = reference(logits, params, hist)
        s = Sampler(params, n)
        np.testing.assert_allclose(s.probs(logits, hist), want, rtol=0, atol=1e-12)
        tok = s.sample(logits, hist)
        assert want[tok] > 0


def test_peaked_large_vocab_nucleus(rng):
    """top-p without top-k over a peaked vocabulary (a small nucleus found without a full sort)."""
    n = 262144
    logits = rng.normal(0.0, 1.0, n) * 3.0
    logits[rng.choice(n, 3000, replace=False)] += 12.0
    for top_p in [0.5, 0.9, 0.999]:
        params = SamplingParams(temperature=1.0, top_k=0, top_p=top_p)
        want, sizes = reference(logits, params)
        assert 1 < sizes["top_p"] < n
        np.testing.assert_allclose(Sampler(params, n).probs(logits), want, rtol=0, atol=1e-12)


def test_probs_sums_to_one_and_is_float64(logits50):
    for params, history, _ in SETTINGS.values():
        pr = Sampler(params, V).probs(logits50, history)
        assert pr.dtype == np.float64 and pr.shape == (V,)
        assert pr.sum() == pytest.approx(1.0, abs=1e-12)


def test_nan_entries_never_drawn():
    logits = np.random.default_rng(13).normal(0.0, 0.5, 20)
    logits[::2] = np.nan
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=3), 20)
    draws = {s.sample(logits) for _ in range(300)}
    assert draws and all(t % 2 == 1 for t in draws)
    assert np.all(s.probs(logits)[::2] == 0)


# -- validation -----------------------------------------------------------------------------------

BAD = [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "1"),
    ("top_k", 1.5), ("top_k", True), ("top_k", "40"), ("top_k", None),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.01), ("top_p", float("nan")),
    ("min_p", -0.01), ("min_p", 1.5), ("min_p", float("nan")),
    ("repeat_penalty", 0.0), ("repeat_penalty", -1.1), ("repeat_penalty", float("nan")),
    ("repeat_penalty", float("inf")),
    ("repeat_last_n", -2), ("repeat_last_n", 3.0),
    ("seed", -1), ("seed", 1.5), ("seed", "7"),
]


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_bad_params_raise_naming_the_field(field, value):
    p = SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        p.validate()
    with pytest.raises(ValueError, match=field):
        Sampler(p, 10)


def test_good_params_validate():
    for p in [SamplingParams(), SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=1.0,
                                               repeat_penalty=0.5, repeat_last_n=-1, seed=0),
              SamplingParams(top_k=-5, top_p=1e-9, min_p=0.0, seed=2**70)]:
        p.validate()
        Sampler(p, 10)


def test_bad_logits_and_history():
    s = Sampler(SamplingParams(temperature=1.0, repeat_penalty=1.2, seed=0), 10)
    with pytest.raises(ValueError, match="n_vocab"):
        s.sample(np.zeros(11))
    with pytest.raises(ValueError, match="1-D"):
        s.probs(np.zeros((1, 10)))
    with pytest.raises(ValueError, match="finite"):
        s.sample(np.full(10, np.nan))
    with pytest.raises(ValueError, match="finite"):
        Sampler(SamplingParams(), 10).sample(np.full(10, -np.inf))
    with pytest.raises(ValueError, match=r"\+inf"):
        s.sample(np.array([0.0] * 9 + [np.inf]))
    with pytest.raises(ValueError, match="history"):
        s.sample(np.zeros(10), history=[3, 10])
    with pytest.raises(ValueError, match="history"):
        s.sample(np.zeros(10), history=[-1])
    with pytest.raises(ValueError, match="n_vocab"):
        Sampler(SamplingParams(), 0)
