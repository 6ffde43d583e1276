"""How often does a 95 % interval of a mean cover the truth, and how often does a table of null
comparisons call something "better" or "worse"? The simulation behind `app.compare.stats`' choices.

    python scripts/interval_coverage.py --samples 4000

Coverage: for 5 and 10 pairs, zero-mean differences drawn from a normal, a shifted exponential
(skewness 2) and a shifted lognormal with σ = 1 (skewness 6.2); the share of samples whose
interval contains 0, for the percentile bootstrap (10,000 resamples), BCa
(`scipy.stats.bootstrap`, 2,000 resamples) and the t interval (`app.compare.stats.mean_ci`).

False verdicts: tables of three controllers that are all the reference in disguise (each
episode's outcome is the episode's own level plus noise, the same distribution for every
controller), at 10 pairs; the share of tables with at least one "better" or "worse", for the
old rule (percentile interval alone, at least 6 pairs) and the current one (`app.compare.report`).

Training seeds: a method trained three times (PPO seeds) and played on the same 40 episodes,
its true mean difference 0, the seeds' own means spread by 0 to 0.01 bits (episodes 0.0075,
noise 0.003); the share of samples whose interval over seeds and episodes contains 0, for the
two-level percentile bootstrap the group verdict once read and the crossed random-effects t
interval it reads now (`app.compare.report.seed_and_episode_interval`).
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats

from esper_lightning.app.compare.report import seed_and_episode_interval
from esper_lightning.app.compare.stats import holm, mean_ci, verdict, wilcoxon_p

DRAWS = {
    "normal": lambda rng, shape: rng.standard_normal(shape),
    "exponential (skew 2)": lambda rng, shape: rng.exponential(1.0, shape) - 1.0,
    "lognormal σ=1 (skew 6)": lambda rng, shape: rng.lognormal(0.0, 1.0, shape) - np.exp(0.5),
}


def percentile_ci(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    means = x[rng.integers(0, len(x), size=(10_000, len(x)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def coverage(samples: int, rng: np.random.Generator) -> None:
    print("| pairs | differences | percentile | BCa | t |")
    print("|---:|---|---:|---:|---:|")
    for n in (5, 10):
        for name, draw in DRAWS.items():
            hits = np.zeros(3)
            for x in draw(rng, (samples, n)):
                bca = stats.bootstrap((x,), np.mean, n_resamples=2_000, method="BCa",
                                      rng=rng).confidence_interval
                for k, (low, high) in enumerate((percentile_ci(x, rng), (bca.low, bca.high),
                                                 mean_ci(x))):
                    hits[k] += low <= 0.0 <= high
            cells = " | ".join(f"{h / samples:.3f}" for h in hits)
            print(f"| {n} | {name} | {cells} |", flush=True)


def false_verdicts(tables: int, rng: np.random.Generator, n: int = 10) -> None:
    old = new = 0
    for _ in range(tables):
        level = rng.normal(45.0, 2.0, n)  # the episodes differ a lot ...
        reference = level + rng.normal(0.0, 0.5, n)  # ... every controller alike
        diffs = [level + rng.normal(0.0, 0.5, n) - reference for _ in range(3)]
        old += any(ci[0] > 0 or ci[1] < 0 for ci in (percentile_ci(d, rng) for d in diffs))
        adjusted = holm([wilcoxon_p(d) for d in diffs])
        new += any(verdict(mean_ci(d), p, n) in ("better", "worse")
                   for d, p in zip(diffs, adjusted, strict=True))
    print(f"\ntables of 3 null comparisons at {n} pairs with a 'better' or 'worse': "
          f"old rule {old / tables:.3f}, current rule {new / tables:.3f} ({tables} tables)")


def two_level_bootstrap(d: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """The interval the group verdict read before: seeds and episodes resampled, percentile."""
    n_seeds, n_episodes = d.shape
    episodes = rng.integers(0, n_episodes, size=(10_000, n_episodes))
    seeds = rng.integers(0, n_seeds, size=(10_000, n_seeds))
    per_seed = d[:, episodes].mean(axis=2).T
    means = np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def seed_coverage(samples: int, rng: np.random.Generator) -> None:
    print("\n| spread between 3 seeds (bits) | two-level bootstrap | random-effects t |")
    print("|---:|---:|---:|")
    for spread in (0.0, 0.002, 0.005, 0.01):
        hits = np.zeros(2)
        for _ in range(samples):
            d = (rng.normal(0.0, spread, (3, 1)) + rng.normal(0.0, 0.0075, (1, 40))
                 + rng.normal(0.0, 0.003, (3, 40)))
            for k, (low, high) in enumerate((two_level_bootstrap(d, rng),
                                             seed_and_episode_interval(d))):
                hits[k] += low <= 0.0 <= high
        print(f"| {spread} | {hits[0] / samples:.3f} | {hits[1] / samples:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4_000, help="samples per cell")
    parser.add_argument("--rng_seed", type=int, default=0)
    parser.add_argument("--seeds_only", action="store_true",
                        help="only the training seeds' table (a minute at 1,000 samples)")
    args = parser.parse_args()
    if not args.seeds_only:
        rng = np.random.default_rng(args.rng_seed)
        coverage(args.samples, rng)
        false_verdicts(args.samples, rng)
    seed_coverage(args.samples, np.random.default_rng(args.rng_seed))  # a stream of its own


if __name__ == "__main__":
    main()
