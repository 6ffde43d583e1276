"""How often the pooled estimators' jackknife t intervals cover, on episodes simulated from the
committed frontier rows (issue 53, item 5).

    python scripts/frontier_coverage.py --samples 400      # about 5 minutes on one core

For each final study (width 32: ``w32-final-growth`` with ``w32-final-sizes``; width 64:
``w64-final``) the rows at the chosen rates give every cell's mean over episodes (a fixed size
or growing arm at a budget) and each episode's deviation from those means. A simulated
episode is the means plus ``Σ_k z_k d_k / √(n − 1)`` (``d_k`` episode k's deviations, ``z_k``
standard normal): Gaussian, with the covariance across cells the committed episodes show
(pairing included: an episode that is lucky for one size is as lucky for the others as it was
there). The truth is the estimator applied to the means themselves. Each sample draws as many
episodes as the study has, estimates the speed-up of ``G1-4@0.1:identity`` at 1× and 2× by the
pooled power law and the pooled piecewise estimator (`estimators.Pool`) with their jackknife t
intervals, and counts how often the interval holds the truth (a bound, which has no interval,
counts as not holding it), how often it excludes 1, and the estimate's geometric mean over the
truth (its bias).
Prints a Markdown table (docs/evidence.md quotes it).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from esper_lightning.app.frontier.estimators import PIECEWISE, POWER, Pool
from esper_lightning.app.frontier.fit import speedup
from esper_lightning.app.frontier.report import at_chosen_rates
from esper_lightning.app.frontier.study import read_rows

ROOT = Path(__file__).resolve().parent.parent / "results" / "frontier"
STUDIES = {"width 32": ("w32-final-growth", "w32-final-sizes"), "width 64": ("w64-final",)}
ARM = "G1-4@0.1:identity"
BUDGETS = (1.0, 2.0)
LOSS = "test_nats"


def cells(rows: list[dict]) -> tuple[list[tuple[str, float, float]], np.ndarray]:
    """The study's cells (arm, budget, budget FLOPs) and its losses, episodes by cells."""
    keys = sorted({(r["arm"], r["budget"], r["budget_flops"]) for r in rows})
    episodes = sorted({r["episode"] for r in rows})
    index = {(r["arm"], r["budget"], r["episode"]): r[LOSS] for r in rows}
    return keys, np.array([[index[(a, b, e)] for a, b, _ in keys] for e in episodes])


def as_rows(keys: list[tuple[str, float, float]], losses: np.ndarray) -> list[dict]:
    """Rows of simulated episodes (what `estimators.Pool` reads)."""
    return [{"arm": a, "budget": b, "budget_flops": c, "episode": e, LOSS: float(v)}
            for e, episode in enumerate(losses)
            for (a, b, c), v in zip(keys, episode, strict=True)]


def estimate(pool: Pool, budget: float, flops: float, kind: str):
    """The pooled speed-up of `ARM` at ``budget`` the ``kind`` way, with its jackknife t."""
    return pool.estimate(lambda keep: speedup(pool.mean_loss(0, ARM, budget, keep), flops,
                                              pool.front(keep, kind)))


def simulate(name: str, folders: tuple[str, ...], samples: int,
             generator: np.random.Generator) -> list[str]:
    """One study's coverage table rows."""
    rows = at_chosen_rates([r for f in folders for r in read_rows(ROOT / f)])
    keys, losses = cells(rows)
    n = len(losses)
    means, deviations = losses.mean(axis=0), losses - losses.mean(axis=0)
    flops = {b: c for a, b, c in keys if a == ARM}
    truth_pool = Pool([as_rows(keys, means[None, :])], LOSS)
    truth = {(b, k): estimate(truth_pool, b, flops[b], k).value for b in BUDGETS
             for k in (POWER, PIECEWISE)}
    held = {key: 0 for key in truth}
    excluded = {key: 0 for key in truth}
    error = {key: 0.0 for key in truth}
    for _ in range(samples):
        episodes = means + generator.standard_normal((n, n)) @ deviations / math.sqrt(n - 1)
        pool = Pool([as_rows(keys, episodes)], LOSS)
        for (budget, kind), value in truth.items():
            got = estimate(pool, budget, flops[budget], kind)
            held[(budget, kind)] += got.low <= value <= got.high
            excluded[(budget, kind)] += not got.low <= 1.0 <= got.high
            error[(budget, kind)] += math.log(got.value / value) / samples
    return [f"| {name} | {n} | {budget:g} | {kind} | {value:.3f}× | "
            f"{held[(budget, kind)] / samples:.3f} | "
            f"{excluded[(budget, kind)] / samples:.3f} | {math.exp(error[(budget, kind)]):.3f} |"
            for (budget, kind), value in truth.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=400, help="simulated studies per width")
    parser.add_argument("--rng_seed", type=int, default=53, help="the simulation's rng seed")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error(f"--samples must be at least 1, got {args.samples}")
    generator = np.random.default_rng(args.rng_seed)
    lines = [f"{args.samples} simulated studies per width, rng seed {args.rng_seed}; nominal "
             "coverage 0.95.", "",
             "| study | episodes | budget (× base) | estimator | truth | jackknife t covers "
             "| excludes 1 | mean estimate / truth |", "|---|---:|---:|---|---:|---:|---:|---:|"]
    for name, folders in STUDIES.items():
        lines += simulate(name, folders, args.samples, generator)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
