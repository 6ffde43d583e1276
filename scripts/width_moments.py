"""The copy-or-reset decision of width growth's AdamW moments, from its committed rows.

    python scripts/width_moments.py            # results/frontier/w32-width-moments/rows.csv

Prints, per episode, the validation loss (nats per byte) of the width-32 one-block GPT widened
to width 64 at tau 0.1 with its widened parameters' AdamW moments carried into the new shapes
(``copy``, `core.width`'s default) and reset (``+reset``), then the paired difference reset −
copy: its mean with a t interval over the episodes (the plan's decision rule) and, beside it,
the Wilcoxon signed-rank p-value.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from scipy import stats

ROWS = Path(__file__).resolve().parents[1] / "results/frontier/w32-width-moments/rows.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, default=ROWS)
    rows = list(csv.DictReader(parser.parse_args().rows.open()))
    by_episode: dict[int, dict[str, float]] = {}
    for row in rows:
        kind = "reset" if row["arm"].endswith("+reset") else "copy"
        by_episode.setdefault(int(row["episode"]), {})[kind] = float(row["validation_nats"])
    print("| episode | copy | reset | reset − copy |\n|---:|---:|---:|---:|")
    diffs = []
    for episode, loss in sorted(by_episode.items()):
        diffs.append(loss["reset"] - loss["copy"])
        print(f"| {episode} | {loss['copy']:.4f} | {loss['reset']:.4f} | {diffs[-1]:+.4f} |")
    n, mean = len(diffs), statistics.mean(diffs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / n ** 0.5
    wilcoxon = stats.wilcoxon(diffs).pvalue
    print(f"\nreset − copy: {mean:+.4f} nats [{mean - half:+.4f}, {mean + half:+.4f}] "
          f"(95 % t over {n} episodes); Wilcoxon signed-rank p = {wilcoxon:.2f}")


if __name__ == "__main__":
    main()
