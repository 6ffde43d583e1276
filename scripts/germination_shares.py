"""Which blueprints a PPO run germinated, round by round, and the growth operators' share.

    python scripts/germination_shares.py results/controller/training/logs/ppo/version_2
    python scripts/germination_shares.py train-1.log train-2.log --window 4 \\
        --csv results/controller/germinations-all-none-s1.csv
    python scripts/germination_shares.py results/controller/germinations-all-none-s1.csv

A run reads from one of three sources: its TensorBoard folder (the ``germinated/<blueprint>``
tags a PPO run logs each round), its console logs (``[round 3 env 5] epoch 2: r1c0 germinated
lora (ppo)`` lines, for runs older than those tags), or a CSV this script wrote. Console logs
are given in the order they were written, one per sitting: a round interrupted by a stop and
played again after the resume counts from the last log that holds it, and only rounds whose
``round R/N:`` line was printed count. Growth blueprints are those a growth operator makes
(`blueprints.growth.operator_of`); the table gives their share of the germinations in windows
of ``--window`` rounds.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from esper_lightning.blueprints.growth import operator_of

#: A germination in a PPO run's console log (the label `app.logs.label_engine` puts in front).
_GERMINATED = re.compile(r"\[round (\d+) env \d+\] epoch \d+: \S+ germinated (\w+) \(")
#: The line the trainer prints when a round is done.
_ROUND_DONE = re.compile(r"\bround (\d+)/\d+:")
_TAG = "germinated/"


def from_logs(logs: Sequence[Path]) -> dict[int, Counter[str]]:
    """Germinations by blueprint of each finished round, each round from the last log that
    holds it (a round replayed after a resume replaces the interrupted one)."""
    rounds: dict[int, Counter[str]] = {}
    for log in logs:
        text = log.read_text(errors="replace")
        seen: dict[int, Counter[str]] = {}
        for match in _GERMINATED.finditer(text):
            seen.setdefault(int(match[1]), Counter())[match[2]] += 1
        done = {int(m[1]) for m in _ROUND_DONE.finditer(text)}
        for r in set(seen) | done:
            rounds.pop(r, None)  # played again in this sitting
            if r in done:
                rounds[r] = seen.get(r, Counter())
    return dict(sorted(rounds.items()))


def from_tensorboard(run: Path) -> dict[int, Counter[str]]:
    """Germinations by blueprint of each round from the ``germinated/<blueprint>`` tags."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith(_TAG)]
    if not tags:
        raise ValueError(f"{run} has no {_TAG}<blueprint> tags (a run older than them: give "
                         "its console logs)")
    steps = sorted({e.step for e in events.Scalars("charts/round")})
    rounds = {i + 1: Counter() for i in range(len(steps))}
    for tag in tags:
        by_step = {e.step: e.value for e in events.Scalars(tag)}  # a resumed round: the last
        for i, step in enumerate(steps):
            rounds[i + 1][tag[len(_TAG):]] += int(by_step.get(step, 0))
    return rounds


def from_csv(path: Path) -> dict[int, Counter[str]]:
    """The rounds a ``--csv`` wrote."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "round" not in rows[0]:
        raise ValueError(f"{path} has no 'round' column; accepted: a CSV written by --csv")
    return {int(r["round"]): Counter({b: int(n) for b, n in r.items() if b != "round"})
            for r in rows}


def read(sources: Sequence[Path]) -> dict[int, Counter[str]]:
    """Rounds from a TensorBoard folder, a CSV, or console logs (in the order written)."""
    if len(sources) == 1 and sources[0].is_dir():
        return from_tensorboard(sources[0])
    if len(sources) == 1 and sources[0].suffix == ".csv":
        return from_csv(sources[0])
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise ValueError(f"not a file: {', '.join(missing)}; accepted: one TensorBoard run "
                         "folder, one CSV, or console logs")
    return from_logs(sources)


def write_csv(path: Path, rounds: dict[int, Counter[str]]) -> None:
    """One row a round, one column a blueprint (every one germinated in any round)."""
    blueprints = sorted({b for counts in rounds.values() for b in counts})
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["round", *blueprints])
        for r, counts in rounds.items():
            writer.writerow([r, *(counts[b] for b in blueprints)])


def share_lines(rounds: dict[int, Counter[str]], window: int) -> list[str]:
    """The growth blueprints' share of the germinations in each window of rounds."""
    lines = ["| rounds | germinations | growth | growth share | most germinated |",
             "|---|---:|---:|---:|---|"]
    numbers = list(rounds)
    for start in range(0, len(numbers), window):
        chunk = numbers[start:start + window]
        counts = sum((rounds[r] for r in chunk), Counter())
        total = sum(counts.values())
        growth = sum(n for b, n in counts.items() if operator_of(b) is not None)
        share = f"{growth / total:.0%}" if total else "—"
        top = ", ".join(f"{b} {n}" for b, n in counts.most_common(3))
        lines.append(f"| {chunk[0]}–{chunk[-1]} | {total} | {growth} | {share} | {top} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", type=Path, nargs="+",
                        help="a TensorBoard run folder, a CSV, or console logs in order")
    parser.add_argument("--window", type=int, default=4, help="rounds per row of the table")
    parser.add_argument("--csv", type=Path, help="also write the rounds read to this CSV")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    try:
        rounds = read(args.sources)
    except (OSError, ValueError) as error:
        print(f"germination_shares: error: {error}", file=sys.stderr)
        return 2
    if not rounds:
        print("germination_shares: error: no finished round in "
              f"{', '.join(map(str, args.sources))}", file=sys.stderr)
        return 2
    if args.csv is not None:
        write_csv(args.csv, rounds)
    print("\n".join(share_lines(rounds, args.window)))
    print(f"\n{len(rounds)} rounds ({min(rounds)}–{max(rounds)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
