"""Statistics of a paired comparison, on plain arrays: intervals, the paired test, the Holm
correction, the minimum detectable effect and the verdict.

Every controller plays the same evaluation episodes: episode ``i`` has the same host
initialisation, data order and augmentation for every controller. Comparing two controllers
episode by episode (a paired design) removes the large between-episode variance of a small host,
so a real difference shows with far fewer episodes than two independent means would need.
`app.compare.report` pairs the records and calls these functions; they know nothing of records.

Statistical choices, one place each:

- The interval of a mean (`estimate`, `mean_ci`) is the Student t interval
  ``mean ± t_{(1+c)/2, n-1} · s / √n`` (`scipy.stats.ttest_1samp`). It was chosen over the
  percentile and BCa bootstraps by simulating the coverage of a nominal 95 % interval of a mean
  (4,000 samples per cell, ``scripts/interval_coverage.py``; zero-mean differences)::

      pairs  differences              percentile  BCa    t
      5      normal                   0.844       0.848  0.949
      5      exponential (skew 2)     0.788       0.809  0.883
      5      lognormal σ=1 (skew 6)   0.728       0.744  0.818
      10     normal                   0.897       0.895  0.950
      10     exponential (skew 2)     0.865       0.881  0.905
      10     lognormal σ=1 (skew 6)   0.806       0.829  0.840

  The t interval is exact for normal differences and the least optimistic of the three for
  skewed ones; both bootstraps are too narrow at 5 and 10 pairs, because a resample of a few
  values cannot show the spread the sample itself misses. (The t interval of skewed differences
  still covers less than 95 %, which is one more reason for the test below.) A constant sample
  of two or more values has the interval ``(x, x)`` (the limit as the spread goes to 0); a
  single value has none (``None``): one value says nothing about the spread.
- The paired test (`wilcoxon_p`) is the two-sided Wilcoxon signed-rank test
  (`scipy.stats.wilcoxon`, zero differences dropped, exact null distribution for small
  samples). When every difference is zero the p-value is 1.0: the data hold no evidence at all
  against "no difference".
- A table of several comparisons is one family: its p-values are Holm-adjusted (`holm`), which
  keeps the chance of any false "better" or "worse" in the table at or below 5 %. In 4,000
  simulated tables of three null comparisons at 10 pairs, the percentile interval alone called
  one of them "better" or "worse" in 24.1 % of the tables; the rule below in 4.0 %.
- The verdict (`verdict`) says ``"better"`` or ``"worse"`` (in the metric's better direction)
  only when the interval of the mean difference excludes zero *and* the Holm-adjusted p-value
  is below `ALPHA`; otherwise ``"no detectable difference at N episodes"``, with the reason in
  brackets when only one of the two holds. Below six pairs no
  verdict is possible: the exact two-sided Wilcoxon p is at least 2 / 2**n = 0.0625.
- The minimum detectable effect (`min_detectable_effect`) is the mean difference a paired t test
  at `ALPHA` (two-sided) detects with probability `POWER`, from the observed standard deviation
  of the differences: ``MDE = (t_{1-α/2, n-1} + t_{power, n-1}) · sd / √n``. It says how small a
  difference "no detectable difference" can still hide.

Example::

    d = np.array([1.2, 0.4, 2.0, 0.9, 1.5, 0.7])  # controller minus reference, per episode
    diff = estimate(d)  # Estimate(mean=1.12, ci=(0.51, 1.72))
    p = holm([wilcoxon_p(d)])[0]  # 0.03125
    verdict(diff.ci, p, len(d)), min_detectable_effect(d)  # ("better", 0.82)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats

#: Significance level of the paired test (after the Holm correction).
ALPHA = 0.05
#: Level of every confidence interval.
CONFIDENCE = 0.95
#: Probability of detecting an effect of the minimum detectable size.
POWER = 0.8


@dataclass(frozen=True)
class Estimate:
    """A mean and, when one was asked for and can be given, its confidence interval
    ``(low, high)``."""

    mean: float
    ci: tuple[float, float] | None = None


def _sample(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    sample = np.asarray(values, dtype=np.float64)
    if sample.ndim != 1 or sample.size == 0:
        raise ValueError(f"{what} needs a non-empty 1-D sample, got shape {sample.shape}")
    if not np.all(np.isfinite(sample)):
        raise ValueError(f"{what} needs finite values, got NaN or inf")
    return sample


def estimate(
    values: Sequence[float] | np.ndarray,
    *,
    interval: bool = True,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """The mean of ``values`` and (``interval``) its `mean_ci`.

    Example::

        estimate([1.0, 2.0, 3.0, 4.0, 5.0])  # Estimate(mean=3.0, ci=(1.04, 4.96))
    """
    mean = float(np.mean(_sample(values, "estimate")))
    if not interval:
        return Estimate(mean)
    return Estimate(mean, mean_ci(values, confidence=confidence))


def mean_ci(
    values: Sequence[float] | np.ndarray, *, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Student t confidence interval of the mean (the module docstring says why t).

    Args:
        values: the sample (1-D, finite, non-empty).
        confidence: two-sided confidence level in (0, 1).

    Returns:
        ``(low, high)`` as Python floats; ``(x, x)`` for a constant sample of two or more
        values; None for a single value.

    Raises:
        ValueError: an empty, non-1-D or non-finite sample, or a bad ``confidence``.

    Example::

        low, high = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])  # (1.04, 4.96)
    """
    sample = _sample(values, "mean_ci")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if sample.size == 1:
        return None
    if np.all(sample == sample[0]):
        return float(sample[0]), float(sample[0])
    ci = scipy_stats.ttest_1samp(sample, 0.0).confidence_interval(confidence)
    return float(ci.low), float(ci.high)


def wilcoxon_p(differences: Sequence[float] | np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences.

    Zero differences are dropped (scipy's ``zero_method="wilcox"``); scipy uses the exact null
    distribution up to 50 differences without ties or zeros, an exact permutation distribution
    up to 13 with them, and the normal approximation beyond. All differences zero (no pair
    differs) gives 1.0. A single pair gives 1.0 too; below six pairs the p-value is always at
    least 2 / 2**n >= 0.0625, so it can never be significant at 5%.

    Example::

        wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # 0.03125 = 2 / 2**6
    """
    d = _sample(differences, "wilcoxon_p")
    if not np.any(d != 0.0):
        return 1.0
    result = scipy_stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    return float(result.pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of one family of tests, in the given order.

    With the raw p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted one of rank
    ``i`` is ``max_{j <= i} min(1, (m - j + 1) · p_(j))``; a test is rejected at level α when
    its adjusted p-value is below α, which keeps the family-wise error rate at or below α
    whatever the dependence between the tests (comparisons sharing a reference are
    dependent). Twelve lines of code here instead of a statsmodels dependency.

    Raises:
        ValueError: a p-value outside [0, 1].

    Example::

        holm([0.01, 0.04, 0.03])  # [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or np.any(~(p >= 0.0) | (p > 1.0)):
        raise ValueError(f"p-values must be a 1-D list in [0, 1], got {list(p_values)}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in adjusted]


def min_detectable_effect(
    differences: Sequence[float] | np.ndarray, *, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The mean paired difference a two-sided paired t test at ``alpha`` detects with
    probability ``power``, at this sample's size and standard deviation:
    ``(t_{1-α/2, n-1} + t_{power, n-1}) · sd / √n`` (``sd`` with ``n - 1`` degrees of freedom).
    None below two differences (no spread can be estimated).

    Example::

        min_detectable_effect([1.2, 0.4, 2.0, 0.9, 1.5, 0.7])  # 0.82
    """
    d = _sample(differences, "min_detectable_effect")
    if not (0.0 < alpha < 1.0 and 0.0 < power < 1.0):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha} and {power}")
    n = d.size
    if n < 2:
        return None
    t = scipy_stats.t.ppf(1.0 - alpha / 2.0, n - 1) + scipy_stats.t.ppf(power, n - 1)
    return float(t * np.std(d, ddof=1) / np.sqrt(n))


def verdict(ci: tuple[float, float] | None, p_adjusted: float, n_pairs: int,
            better: Literal["higher", "lower"] = "higher", *, alpha: float = ALPHA) -> str:
    """``"better"`` / ``"worse"`` when the interval of the mean difference excludes zero and
    the (Holm-adjusted) p-value is below ``alpha``, else ``"no detectable difference at N
    episodes"`` (N = ``n_pairs``, the paired episodes), saying why when the two
    disagree: the interval includes zero, or the p-value is not below ``alpha``. ``better``
    says which sign is better: ``"higher"`` (an accuracy) or ``"lower"`` (a loss).

    Example::

        verdict((0.8, 2.1), 0.01, 10)  # "better"
        verdict((0.8, 2.1), 0.07, 10)  # "no detectable difference at 10 episodes (p >= 0.05)"
        verdict((-0.1, 2.1), 0.01, 10)  # "... at 10 episodes (the interval includes 0)"
        verdict((0.8, 2.1), 0.01, 10, better="lower")  # "worse"
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    excludes_zero = ci is not None and (ci[0] > 0.0 or ci[1] < 0.0)
    significant = p_adjusted < alpha
    if excludes_zero and significant:
        return "better" if (ci[0] > 0.0) == (better == "higher") else "worse"  # type: ignore
    none = f"no detectable difference at {n_pairs} episode{'' if n_pairs == 1 else 's'}"
    if significant and ci is not None:
        return f"{none} (the interval includes 0)"
    if excludes_zero:
        return f"{none} (p >= {alpha:g})"
    return none
