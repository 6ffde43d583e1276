"""The paired losses of `w64-tau-tuning`: each τ of the depth-and-width arm against τ 0.05.

    python scripts/tau_pairs.py            # results/frontier/w64-tau-tuning/rows.csv

Prints each arm's validation loss (nats per byte) at 2× per episode, then, for τ 0.1, τ 0.15
and S4 against τ 0.05 on the same episode, the paired difference: its mean with a 95 % t
interval over the episodes (`frontier.fit.mean_t`) and, beside it, the Wilcoxon signed-rank
p-value (at 4 episodes it can never fall below 0.125).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from esper_lightning.app.compare.stats import wilcoxon_p
from esper_lightning.app.frontier.fit import mean_t

ROWS = Path(__file__).resolve().parents[1] / "results/frontier/w64-tau-tuning/rows.csv"
REFERENCE = "G1w32-4w64@0.05:identity"
OTHERS = ("G1w32-4w64@0.1:identity", "G1w32-4w64@0.15:identity", "S4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, default=ROWS)
    rows = [r for r in csv.DictReader(parser.parse_args().rows.open())
            if float(r["budget"]) == 2.0]
    loss = {(r["arm"], int(r["episode"])): float(r["validation_nats"]) for r in rows}
    episodes = sorted({e for _, e in loss})
    arms = (REFERENCE, *OTHERS)
    print("| episode | " + " | ".join(arms) + " |\n|---:|" + "---:|" * len(arms))
    for episode in episodes:
        print(f"| {episode} | " + " | ".join(f"{loss[a, episode]:.4f}" for a in arms) + " |")
    print()
    for arm in OTHERS:
        diffs = [loss[arm, e] - loss[REFERENCE, e] for e in episodes]
        mean, low, high = mean_t(diffs)
        print(f"{arm} − {REFERENCE}: {mean:+.4f} nats [{low:+.4f}, {high:+.4f}] (95 % t over "
              f"{len(diffs)} episodes); Wilcoxon signed-rank p = {wilcoxon_p(diffs):.3f}")


if __name__ == "__main__":
    main()
