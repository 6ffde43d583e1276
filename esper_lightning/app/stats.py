"""Statistics of a paired comparison, on plain arrays: intervals, the paired test, the verdict.

Every controller plays the same evaluation episodes: episode ``i`` has the same host
initialisation, data order and augmentation for every controller. Comparing two controllers
episode by episode (a paired design) removes the large between-episode variance of a small host,
so a real difference shows with far fewer episodes than two independent means would need.
`app.report` pairs the records and calls these functions; they know nothing of records.

Statistical choices, one place each:

- The interval of a mean (`estimate`, `bootstrap_ci`) is a percentile bootstrap
  (`scipy.stats.bootstrap`, ``method="percentile"``), seeded, so a report is reproducible. A
  constant sample (one value, or all values equal) has the interval ``(x, x)``: every resample
  has the same mean.
- The paired test (`wilcoxon_p`) is the two-sided Wilcoxon signed-rank test
  (`scipy.stats.wilcoxon`, zero differences dropped, exact null distribution for small
  samples). When every difference is zero the p-value is 1.0: the data hold no evidence at all
  against "no difference".
- The verdict (`verdict`) follows the interval of the mean difference: ``"better"`` or
  ``"worse"`` (in the metric's better direction) only when it excludes zero *and* at least
  `MIN_PAIRS_FOR_VERDICT` pairs were played; otherwise ``"no detectable difference at N
  seeds"``. Below six pairs no paired test can reach p < 0.05 (the exact two-sided Wilcoxon p
  is at least 2 / 2**n), while a percentile bootstrap of three all-positive differences always
  excludes zero; the floor stops such a verdict.

Example::

    d = np.array([1.2, 0.4, 2.0, 0.9, 1.5, 0.7])  # controller minus reference, per episode
    diff = estimate(d)  # Estimate(mean=1.12, ci=(0.72, 1.57))
    verdict(diff.ci, len(d)), wilcoxon_p(d)  # ("better", 0.03125)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats

#: Fewest pairs for a "better"/"worse" verdict: the smallest n whose exact two-sided Wilcoxon
#: p-value can fall below 0.05 (2 / 2**6 = 0.031).
MIN_PAIRS_FOR_VERDICT = 6


@dataclass(frozen=True)
class Estimate:
    """A mean and, when one was asked for, its confidence interval ``(low, high)``."""

    mean: float
    ci: tuple[float, float] | None = None


def estimate(
    values: Sequence[float] | np.ndarray,
    *,
    interval: bool = True,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> Estimate:
    """The mean of ``values`` and (``interval``) its `bootstrap_ci`.

    Example::

        estimate([1.0, 2.0, 3.0, 4.0, 5.0])  # Estimate(mean=3.0, ci=(1.8, 4.2))
    """
    mean = float(np.mean(np.asarray(values, dtype=np.float64)))
    if not interval:
        return Estimate(mean)
    return Estimate(mean, bootstrap_ci(values, n_resamples=n_resamples, confidence=confidence,
                                       rng_seed=rng_seed))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean.

    Resamples with `scipy.stats.bootstrap` (``method="percentile"``) from
    ``np.random.default_rng(rng_seed)``: the same inputs give the same interval. A constant
    sample (a single value, or all values equal) returns ``(x, x)`` directly: every resample has
    that mean, and it avoids scipy's refusal of one-element samples.

    Args:
        values: the sample (1-D, finite, non-empty).
        n_resamples: bootstrap resamples.
        confidence: two-sided confidence level in (0, 1).
        rng_seed: seed of the resampling generator.

    Returns:
        ``(low, high)`` as Python floats.

    Raises:
        ValueError: an empty, non-1-D or non-finite sample, or a bad ``n_resamples`` /
            ``confidence``.

    Example::

        low, high = bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0])  # about (1.8, 4.2)
    """
    sample = np.asarray(values, dtype=np.float64)
    if sample.ndim != 1 or sample.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D sample, got shape {sample.shape}")
    if not np.all(np.isfinite(sample)):
        raise ValueError("bootstrap_ci needs finite values, got NaN or inf")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if np.all(sample == sample[0]):
        return float(sample[0]), float(sample[0])
    result = scipy_stats.bootstrap(
        (sample,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(rng_seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


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
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"wilcoxon_p needs a non-empty 1-D sample, got shape {d.shape}")
    if not np.any(d != 0.0):
        return 1.0
    result = scipy_stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    return float(result.pvalue)


def verdict(ci: tuple[float, float], n_pairs: int,
            better: Literal["higher", "lower"] = "higher") -> str:
    """``"better"`` / ``"worse"`` when the interval of the mean difference excludes zero and at
    least `MIN_PAIRS_FOR_VERDICT` pairs were played, else ``"no detectable difference at N
    seeds"`` (N = ``n_pairs``; here "seeds" are episode RNG seeds). ``better`` says which sign
    is better: ``"higher"`` (an accuracy) or ``"lower"`` (a loss).

    Example::

        verdict((0.8, 2.1), 10)  # "better"
        verdict((0.8, 2.1), 10, better="lower")  # "worse"
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if n_pairs >= MIN_PAIRS_FOR_VERDICT and (ci[0] > 0.0 or ci[1] < 0.0):
        return "better" if (ci[0] > 0.0) == (better == "higher") else "worse"
    return f"no detectable difference at {n_pairs} seeds"
