"""`app.stats`: the interval, the paired test and the verdict, on plain arrays."""

import itertools

import numpy as np
import pytest

from esper_lightning.app.stats import (
    MIN_PAIRS_FOR_VERDICT,
    Estimate,
    bootstrap_ci,
    estimate,
    verdict,
    wilcoxon_p,
)


def exact_wilcoxon_p(d):
    """Two-sided exact signed-rank p by enumerating every sign assignment (no ties or zeros)."""
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    observed = ranks[d > 0].sum()
    centre = len(d) * (len(d) + 1) / 4
    null = [sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in
            itertools.product([False, True], repeat=len(d))]
    return np.mean(np.abs(np.array(null) - centre) >= abs(observed - centre) - 1e-9)


def numpy_percentile_bootstrap(x, n_resamples=10_000, confidence=0.95, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return tuple(np.percentile(means, [100 * alpha, 100 * (1 - alpha)]))


def test_bootstrap_ci_of_constant_samples_is_the_value():
    assert bootstrap_ci([71.5]) == (71.5, 71.5)
    assert bootstrap_ci([0.1] * 7) == (0.1, 0.1)
    for bad, message in [([], "non-empty"), ([1.0, float("nan")], "finite")]:
        with pytest.raises(ValueError, match=message):
            bootstrap_ci(bad)
    with pytest.raises(ValueError, match="confidence must be in"):
        bootstrap_ci([1.0, 2.0], confidence=95)


def test_bootstrap_ci_matches_a_numpy_percentile_bootstrap():
    x = np.array([3.0, 7.5, 1.25, 9.0, 4.0, 6.5])
    for kwargs in [{}, {"n_resamples": 500, "confidence": 0.8, "rng_seed": 7}]:
        expected = numpy_percentile_bootstrap(x, **kwargs)
        assert bootstrap_ci(x, **kwargs) == pytest.approx(expected, rel=1e-12)


def test_estimate_is_the_mean_and_the_bootstrap_interval():
    x = np.array([3.0, 7.5, 1.25, 9.0, 4.0, 6.5])
    full = estimate(x, n_resamples=500, rng_seed=3)
    assert full.mean == pytest.approx(x.mean())
    assert full.ci == bootstrap_ci(x, n_resamples=500, rng_seed=3)
    assert estimate(x, interval=False) == Estimate(pytest.approx(x.mean()), None)
    assert estimate([2, 4]).mean == 3.0 and isinstance(estimate([2, 4]).mean, float)


def test_wilcoxon_edge_cases():
    assert wilcoxon_p([0.0, 0.0, 0.0]) == 1.0
    assert wilcoxon_p([2.5]) == 1.0
    assert wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == pytest.approx(2 / 2**6)
    # Below six pairs even unanimous signs cannot reach 5%.
    assert wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 2**5)


def test_wilcoxon_matches_an_exact_enumeration():
    d = np.array([2.1, -0.4, 3.3, 1.7, -1.2, 2.8, 0.9, 4.5])  # distinct |d|, no zero
    assert wilcoxon_p(d) == pytest.approx(exact_wilcoxon_p(d), rel=1e-12)
    # W- = 1 + 3 = 4; seven of the 2**8 signings have W- <= 4 ({}, 1, 2, 3, 4, 1+2, 1+3).
    assert wilcoxon_p(d) == pytest.approx(2 * 7 / 256)


@pytest.mark.parametrize(
    ("ci", "better", "expected"),
    [((0.5, 2.0), "higher", "better"), ((-2.0, -0.5), "higher", "worse"),
     ((0.5, 2.0), "lower", "worse"), ((-2.0, -0.5), "lower", "better"),
     ((-0.5, 2.0), "higher", "no detectable difference at 8 seeds"),
     ((-2.0, 0.5), "lower", "no detectable difference at 8 seeds"),
     ((0.0, 2.0), "higher", "no detectable difference at 8 seeds")],
)
def test_verdict_follows_the_interval_in_the_better_direction(ci, better, expected):
    assert verdict(ci, 8, better) == expected


def test_verdict_needs_enough_pairs_and_a_direction():
    few = MIN_PAIRS_FOR_VERDICT - 1
    assert verdict((1.0, 2.0), few) == f"no detectable difference at {few} seeds"
    assert verdict((1.0, 2.0), MIN_PAIRS_FOR_VERDICT) == "better"
    with pytest.raises(ValueError, match="better must be 'higher' or 'lower', got None"):
        verdict((1.0, 2.0), 8, None)
