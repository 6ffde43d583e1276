"""Did a PPO run learn? First rounds against last rounds of a run's TensorBoard scalars.

    python scripts/ppo_learning_summary.py runs/logs/ppo/version_0 --rounds 5 \\
        --csv results/controller/ppo-rounds-timing-s1.csv
    python scripts/ppo_learning_summary.py results/controller/ppo-rounds-timing-s1.csv

For each tag (episodic return, final accuracy, every `actions/<op>` frequency, the PPO
diagnostics) it prints the mean of the first and the last ``--rounds`` rounds with a 95 % t
interval over those rounds (`app.compare.stats.mean_ci`), and the difference with its Welch t
interval (two independent means): "rose" / "fell" only when that interval excludes zero.
``--csv`` also writes the rounds it read (one row a round, one column a tag), which the
second form reads instead of the run's TensorBoard files: the small file to commit beside a
table, since the runs themselves are not committed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

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


def read_rounds(run: Path) -> dict[str, np.ndarray]:
    """Each tag's value per round, first round first: from a TensorBoard run folder, or from
    a CSV that ``--csv`` wrote.

    Raises:
        ValueError: neither a folder nor a ``.csv``, tags of different lengths, or a CSV
            without a ``round`` column.
    """
    if run.is_dir():
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        known = events.Tags()["scalars"]
        rounds = {}
        for tag in (t for t in TAGS if t in known):
            by_step = {e.step: e.value for e in events.Scalars(tag)}  # a resumed round: last
            rounds[tag] = np.array([by_step[s] for s in sorted(by_step)], dtype=float)
        lengths = {tag: len(v) for tag, v in rounds.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{run}: the tags hold different numbers of rounds: {lengths}")
        return rounds
    if run.suffix != ".csv" or not run.is_file():
        raise ValueError(f"{run} is neither a TensorBoard run folder nor a .csv of rounds")
    with run.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "round" not in rows[0]:
        raise ValueError(f"{run} has no 'round' column; accepted: a CSV written by --csv")
    return {tag: np.array([float(r[tag]) for r in rows]) for tag in rows[0] if tag != "round"}


def write_rounds(path: Path, rounds: dict[str, np.ndarray]) -> None:
    """One row a round (``round`` from 1), one column a tag, values in round-trip precision."""
    n = len(next(iter(rounds.values())))
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["round", *rounds])
        for i in range(n):
            writer.writerow([i + 1, *(repr(float(v[i])) for v in rounds.values())])


def summary_lines(rounds: dict[str, np.ndarray], k: int) -> list[str]:
    """The first ``k`` rounds against the last ``k``, a Markdown row per tag."""
    lines = [f"| tag | rounds 1-{k} [95% CI] | last {k} rounds [95% CI] | last − first [95% CI] |",
             "|---|---:|---:|---:|"]
    for tag, values in rounds.items():
        first, last = values[:k], values[-k:]
        lo, hi = difference_ci(first, last)
        verdict = "rose" if lo > 0 else "fell" if hi < 0 else "no detectable change"
        f_ci, l_ci = mean_ci(first), mean_ci(last)
        lines.append(f"| {tag} | {first.mean():.3f} [{f_ci[0]:.3f}, {f_ci[1]:.3f}] | "
                     f"{last.mean():.3f} [{l_ci[0]:.3f}, {l_ci[1]:.3f}] | "
                     f"{last.mean() - first.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] {verdict} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path,
                        help="a TensorBoard run folder (…/ppo/version_N) or a CSV of rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv", type=Path, help="also write the rounds read to this CSV")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds must be >= 2 (an interval needs two rounds), got {args.rounds}")
    try:
        rounds = read_rounds(args.run)
    except (OSError, ValueError) as error:
        print(f"ppo_learning_summary: error: {error}", file=sys.stderr)
        return 2
    n = min((len(v) for v in rounds.values()), default=0)
    if n < 2 * args.rounds:
        print(f"ppo_learning_summary: error: {args.run} holds {n} rounds; --rounds "
              f"{args.rounds} needs at least {2 * args.rounds}", file=sys.stderr)
        return 2
    if args.csv is not None:
        write_rounds(args.csv, rounds)
    print("\n".join(summary_lines(rounds, args.rounds)))
    print(f"\n{n} rounds in {args.run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
