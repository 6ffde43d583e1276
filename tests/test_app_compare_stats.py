"""`app.compare.stats`: the interval, the paired test, the Holm correction, the minimum detectable
effect and the verdict, on plain arrays."""

import itertools

import numpy as np
import pytest

from esper_lightning.app.compare.stats import (
    Estimate,
    estimate,
    holm,
    mean_ci,
    min_detectable_effect,
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


def numpy_percentile_bootstrap(x, n_resamples=2_000, confidence=0.95, rng_seed=0):
    """The interval the verdict used before: a percentile bootstrap of the mean."""
    rng = np.random.default_rng(rng_seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return tuple(np.percentile(means, [100 * alpha, 100 * (1 - alpha)]))


def test_mean_ci_is_the_t_interval_and_handles_degenerate_samples():
    x = np.array([3.0, 7.5, 1.25, 9.0, 4.0, 6.5])
    # By hand: mean 5.208333, sd 2.942859 (n - 1), t(0.975, 5) = 2.570582.
    half = 2.5705818356363146 * np.std(x, ddof=1) / np.sqrt(6)
    assert mean_ci(x) == pytest.approx((x.mean() - half, x.mean() + half), rel=1e-12)
    assert half == pytest.approx(3.0883, abs=1e-4)
    low, high = mean_ci(x, confidence=0.8)
    assert high - low < 2 * half
    assert mean_ci([71.5]) is None  # one value says nothing about the spread
    assert mean_ci([0.1] * 7) == (0.1, 0.1)
    for bad, message in [([], "non-empty"), ([1.0, float("nan")], "finite")]:
        with pytest.raises(ValueError, match=message):
            mean_ci(bad)
    with pytest.raises(ValueError, match="confidence must be in"):
        mean_ci([1.0, 2.0], confidence=95)


@pytest.mark.parametrize("n", [5, 10])
@pytest.mark.parametrize("skewed", [False, True])
def test_the_interval_covers_the_mean_about_95_percent_of_the_time(n, skewed):
    """A seeded coverage simulation: the percentile bootstrap the verdict used before covers
    0.83 to 0.90 at these sizes (normal differences) and less for skewed ones; the t interval
    is exact for normal differences and the best of both for skewed ones."""
    rng = np.random.default_rng(100 + n + 7 * skewed)
    samples = 600
    if skewed:
        draws = rng.exponential(1.0, (samples, n)) - 1.0  # skewness 2, mean 0
    else:
        draws = rng.standard_normal((samples, n))
    covered = np.mean([low <= 0.0 <= high for low, high in map(mean_ci, draws)])
    old = np.mean([low <= 0.0 <= high for low, high in
                   (numpy_percentile_bootstrap(x, rng_seed=k) for k, x in enumerate(draws))])
    floor = {(5, False): 0.93, (10, False): 0.93, (5, True): 0.85, (10, True): 0.88}[n, skewed]
    assert covered >= floor > old, (covered, old)


def test_estimate_is_the_mean_and_its_interval():
    x = np.array([3.0, 7.5, 1.25, 9.0, 4.0, 6.5])
    full = estimate(x)
    assert full.mean == pytest.approx(x.mean())
    assert full.ci == mean_ci(x)
    assert estimate(x, confidence=0.8).ci == mean_ci(x, confidence=0.8)
    assert estimate(x, interval=False) == Estimate(pytest.approx(x.mean()), None)
    assert estimate([2, 4]).mean == 3.0 and isinstance(estimate([2, 4]).mean, float)
    assert estimate([2.0]) == Estimate(2.0, None)


def test_holm_adjustment_matches_a_hand_computation():
    # Sorted: 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> kept monotone: 0.06).
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # Sorted: 0.005 (x4 = 0.02), 0.011 (x3 = 0.033), 0.02 (x2 = 0.04), 0.5 (x1 = 0.5).
    assert holm([0.5, 0.011, 0.005, 0.02]) == pytest.approx([0.5, 0.033, 0.02, 0.04])
    assert holm([0.4, 0.6]) == pytest.approx([0.8, 0.8])  # capped at 1 before the maximum
    assert holm([0.7, 0.6]) == [1.0, 1.0]
    assert holm([0.03]) == [0.03] and holm([]) == []
    with pytest.raises(ValueError, match="p-values must be"):
        holm([0.1, 1.5])
    with pytest.raises(ValueError, match="p-values must be"):
        holm([float("nan")])


def test_minimum_detectable_effect_is_the_paired_t_formula():
    d = np.array([1.2, 0.4, 2.0, 0.9, 1.5, 0.7])
    # t(0.975, 5) = 2.570582, t(0.8, 5) = 0.919544; sd = 0.577639; sqrt(6) = 2.449490.
    expected = (2.5705818356363146 + 0.9195437802408271) * np.std(d, ddof=1) / np.sqrt(6)
    assert min_detectable_effect(d) == pytest.approx(expected, rel=1e-12)
    assert min_detectable_effect(d) == pytest.approx(0.8230, abs=1e-4)
    assert min_detectable_effect([3.0]) is None
    assert min_detectable_effect([2.0, 2.0, 2.0]) == 0.0
    # n = 10, sd = 1: (t(0.975, 9) + t(0.8, 9)) / sqrt(10) = (2.262157 + 0.883404) / 3.162278.
    unit = np.array([-1.0, 1.0] * 5) * np.sqrt(0.9)  # sd exactly 1 with n - 1 = 9
    assert min_detectable_effect(unit) == pytest.approx(0.99471, abs=1e-5)


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
     ((-0.5, 2.0), "higher", "no detectable difference at 8 episodes (the interval includes 0)"),
     ((-2.0, 0.5), "lower", "no detectable difference at 8 episodes (the interval includes 0)"),
     ((0.0, 2.0), "higher", "no detectable difference at 8 episodes (the interval includes 0)"),
     (None, "higher", "no detectable difference at 8 episodes")],
)
def test_verdict_follows_the_interval_in_the_better_direction(ci, better, expected):
    assert verdict(ci, 0.01, 8, better) == expected


def test_verdict_needs_the_adjusted_test_too():
    # The interval excludes zero, yet the (Holm-adjusted) test is not significant: no verdict,
    # and the verdict says why.
    assert verdict((0.03, 0.21), 0.07, 10) == "no detectable difference at 10 episodes (p >= 0.05)"
    assert verdict((0.03, 0.21), 0.05, 10) == "no detectable difference at 10 episodes (p >= 0.05)"
    assert verdict((0.03, 0.21), 0.049, 10) == "better"
    assert verdict((0.03, 0.21), 0.049, 10, alpha=0.01) == (
        "no detectable difference at 10 episodes (p >= 0.01)")
    assert verdict((-0.1, 0.2), 0.5, 10) == "no detectable difference at 10 episodes"
    with pytest.raises(ValueError, match="better must be 'higher' or 'lower', got None"):
        verdict((1.0, 2.0), 0.01, 8, None)
