"""Did a PPO run learn? First rounds against last rounds of a run's TensorBoard scalars.

    python scripts/ppo_learning_summary.py runs/ppo/version_0 --rounds 5

For each tag (episodic return, final accuracy, every `actions/<op>` frequency, the PPO
diagnostics) it prints the mean of the first and the last ``--rounds`` rounds with a percentile
bootstrap 95 % CI over those rounds, and the difference with its CI (a bootstrap of the
difference of two independent means): "rose" / "fell" only when that CI excludes zero.
"""

from __future__ import annotations

import argparse

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from esper_lightning.app.stats import bootstrap_ci

TAGS = ("charts/episodic_return", "charts/final_accuracy", "morpho/seed_params",
        "actions/wait", "actions/germinate", "actions/advance", "actions/fossilize",
        "actions/prune", "actions/set_alpha_target", "losses/approx_kl",
        "losses/explained_variance", "losses/entropy")


def difference_ci(a: np.ndarray, b: np.ndarray, n: int = 10_000) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    diffs = (rng.choice(b, (n, len(b))).mean(1) - rng.choice(a, (n, len(a))).mean(1))
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a TensorBoard run folder (…/ppo/version_N)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    events = EventAccumulator(args.run, size_guidance={"scalars": 0})
    events.Reload()
    k = args.rounds
    print(f"| tag | rounds 1-{k} [95% CI] | last {k} rounds [95% CI] | last − first [95% CI] |")
    print("|---|---:|---:|---:|")
    for tag in TAGS:
        if tag not in events.Tags()["scalars"]:
            continue
        values = np.array([e.value for e in events.Scalars(tag)], dtype=float)
        first, last = values[:k], values[-k:]
        lo, hi = difference_ci(first, last)
        verdict = "rose" if lo > 0 else "fell" if hi < 0 else "no detectable change"
        f_ci, l_ci = bootstrap_ci(first), bootstrap_ci(last)
        print(f"| {tag} | {first.mean():.3f} [{f_ci[0]:.3f}, {f_ci[1]:.3f}] | "
              f"{last.mean():.3f} [{l_ci[0]:.3f}, {l_ci[1]:.3f}] | "
              f"{last.mean() - first.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] {verdict} |")
    print(f"\n{len(values)} rounds in {args.run}")


if __name__ == "__main__":
    main()
