"""Did a PPO run learn? First rounds against last rounds of a run's TensorBoard scalars.

    python scripts/ppo_learning_summary.py runs/logs/ppo/version_0 --rounds 5 \\
        --csv results/controller/ppo-rounds-timing-s1.csv
    python scripts/ppo_learning_summary.py results/controller/ppo-rounds-timing-s1.csv
    python scripts/ppo_learning_summary.py results/controller/ppo-rounds-all-s1.csv \\
        --against results/controller/ppo-rounds-all-none-s1.csv

For each tag (episodic return, final accuracy, every `actions/<op>` frequency, the PPO
diagnostics) it prints the mean of the first and the last ``--rounds`` rounds with a 95 % t
interval over those rounds (`app.compare.stats.mean_ci`), and the difference with its Welch t
interval (two independent means): "rose" / "fell" only when that interval excludes zero.
``--csv`` also writes the rounds it read (one row a round, one column a tag), which the
second form reads instead of the run's TensorBoard files: the small file to commit beside a
table, since the runs themselves are not committed.

``--against OTHER`` compares two runs round by round instead: two trainings of one
``--rng_seed`` draw the same budgets in the same round (checked: their training FLOPs agree
round by round to 0.1 %), so each round is a pair, and the table gives each tag's mean over
all rounds of both runs and the paired difference (OTHER − RUN) with a t interval over
rounds.
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

#: The tag that says which budgets a round drew (its episodes' mean training FLOPs).
BUDGET_TAG = "morpho/train_flops"
#: How closely two trainings' rounds must agree in it to share their budgets: an episode
#: stops at its first step past the budget, and a grown host's steps cost more, so runs of
#: one --rng_seed differ by a fraction of a step (1e-4 measured); rounds of different draws
#: differ by tens of percent.
SAME_BUDGETS_RTOL = 1e-3
TAGS = ("charts/episodic_return", "charts/final_accuracy", "morpho/seed_params", BUDGET_TAG,
        "actions/wait", "actions/germinate", "actions/advance", "actions/fossilize",
        "actions/prune", "actions/set_alpha_target", "losses/approx_kl",
        "losses/explained_variance", "losses/entropy", "losses/entropy/blueprint")


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


def paired_lines(rounds: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> list[str]:
    """Each tag both runs hold: its mean over the rounds of each, and the paired difference
    (other − rounds) with a t interval over rounds, a Markdown row per tag.

    Raises:
        ValueError: the runs hold different numbers of rounds, either lacks the budget tag,
            or a round's budgets differ (not the same ``--rng_seed``'s draws).
    """
    n, m = (len(next(iter(r.values()))) for r in (rounds, other))
    if n != m or n < 2:
        raise ValueError(f"the runs hold {n} and {m} rounds; a paired comparison needs the "
                         "same number, at least 2")
    if BUDGET_TAG not in rounds or BUDGET_TAG not in other:
        raise ValueError(f"a run lacks {BUDGET_TAG}: whether its rounds drew the same budgets "
                         "cannot be checked")
    same = np.isclose(rounds[BUDGET_TAG], other[BUDGET_TAG], rtol=SAME_BUDGETS_RTOL, atol=0)
    if not same.all():
        k = int(np.argmin(same))
        raise ValueError(f"round {k + 1} drew different budgets ({rounds[BUDGET_TAG][k]:.6g} "
                         f"and {other[BUDGET_TAG][k]:.6g} training FLOPs): not trainings of "
                         "one --rng_seed")
    lines = [f"| tag | run (mean of {n} rounds) | against | against − run [95% CI] |",
             "|---|---:|---:|---:|"]
    for tag in (t for t in rounds if t in other and t != BUDGET_TAG):
        diff = other[tag] - rounds[tag]
        lo, hi = mean_ci(diff)
        verdict = "higher" if lo > 0 else "lower" if hi < 0 else "no detectable difference"
        lines.append(f"| {tag} | {rounds[tag].mean():.3f} | {other[tag].mean():.3f} | "
                     f"{diff.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] {verdict} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path,
                        help="a TensorBoard run folder (…/ppo/version_N) or a CSV of rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv", type=Path, help="also write the rounds read to this CSV")
    parser.add_argument("--against", type=Path,
                        help="a second run of the same --rng_seed: compare round by round")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds must be >= 2 (an interval needs two rounds), got {args.rounds}")
    try:
        rounds = read_rounds(args.run)
        n = min((len(v) for v in rounds.values()), default=0)
        if args.against is not None:
            lines = paired_lines(rounds, read_rounds(args.against))
            footer = f"{args.against} against {args.run}, paired over {n} rounds"
        elif n < 2 * args.rounds:
            raise ValueError(f"{args.run} holds {n} rounds; --rounds {args.rounds} needs at "
                             f"least {2 * args.rounds}")
        else:
            lines, footer = summary_lines(rounds, args.rounds), f"{n} rounds in {args.run}"
    except (OSError, ValueError) as error:
        print(f"ppo_learning_summary: error: {error}", file=sys.stderr)
        return 2
    if args.csv is not None:
        write_rounds(args.csv, rounds)
    print("\n".join(lines))
    print(f"\n{footer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
