"""Did a PPO run learn? First rounds against last rounds of a run's TensorBoard scalars.

    python scripts/ppo_learning_summary.py runs/ppo/version_0 --rounds 5

For each tag (episodic return, final accuracy, every `actions/<op>` frequency, the PPO
diagnostics) it prints the mean of the first and the last ``--rounds`` rounds with a 95 % t
interval over those rounds (`app.compare.stats.mean_ci`), and the difference with its Welch t
interval (two independent means): "rose" / "fell" only when that interval excludes zero.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from esper_lightning.app.compare.stats import CONFIDENCE, mean_ci

TAGS = ("charts/episodic_return", "charts/final_accuracy", "morpho/seed_params",
        "actions/wait", "actions/germinate", "actions/advance", "actions/fossilize",
        "actions/prune", "actions/set_alpha_target", "losses/approx_kl",
        "losses/explained_variance", "losses/entropy")


def difference_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Welch t interval of mean(b) - mean(a); a zero-width one when neither varies."""
    if np.all(a == a[0]) and np.all(b == b[0]):
        return float(b[0] - a[0]), float(b[0] - a[0])
    ci = stats.ttest_ind(b, a, equal_var=False).confidence_interval(CONFIDENCE)
    return float(ci.low), float(ci.high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a TensorBoard run folder (…/ppo/version_N)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds must be >= 2 (an interval needs two rounds), got {args.rounds}")
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
        f_ci, l_ci = mean_ci(first), mean_ci(last)
        print(f"| {tag} | {first.mean():.3f} [{f_ci[0]:.3f}, {f_ci[1]:.3f}] | "
              f"{last.mean():.3f} [{l_ci[0]:.3f}, {l_ci[1]:.3f}] | "
              f"{last.mean() - first.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] {verdict} |")
    print(f"\n{len(values)} rounds in {args.run}")


if __name__ == "__main__":
    main()
