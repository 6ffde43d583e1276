"""The per-phase rate checks of `G1-4@0.1:identity` side by side, from their committed rows.

    python scripts/phase_rates.py

Reads three studies of the same two tuning episodes (root 2911, validation split, 1x and 2x of
the width-32 base): `w32-tuning` (one rate throughout, its tuned best at each budget),
`w32-phase-lr` (a rate per phase, re-warmed from 0 at the growth) and `w32-phase-steady` (a
rate per phase, no re-warm: ``+steady``). Prints, per budget and rate, each episode's
validation loss (nats per byte) and their mean; two episodes give no interval, so this is a
tuning reading, not a comparison with a verdict.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "results" / "frontier"
ARM = "G1-4@0.1:identity"
#: The single rate w32-tuning tuned best for the arm, per budget (`frontier select`).
SINGLE = {1.0: 0.004, 2.0: 0.002}


def _rows(study: str, arm: str = ARM) -> list[dict[str, str]]:
    """``study``'s rows of ``arm`` (exactly: not its ``+rewarm`` or other variants)."""
    with (ROOT / study / "rows.csv").open(newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["arm"] == arm]


def _label(row: dict[str, str]) -> str:
    phases = row.get("lr_phases") or ""
    return phases.replace(";", " → ") if phases else f"{float(row['lr']):g} throughout"


def main() -> None:
    studies = {"one rate": [r for r in _rows("w32-tuning")
                            if float(r["lr"]) == SINGLE.get(float(r["budget"]))],
               "per phase, re-warmed": _rows("w32-phase-lr"),
               "per phase, steady": _rows("w32-phase-steady", ARM + "+steady")}
    print("| budget | how | rates | episode 0 | episode 1 | mean |")
    print("|---:|---|---|---:|---:|---:|")
    for budget in (1.0, 2.0):
        for how, rows in studies.items():
            cells: dict[str, dict[int, float]] = {}
            for row in rows:
                if float(row["budget"]) == budget:
                    cells.setdefault(_label(row), {})[int(row["episode"])] = float(
                        row["validation_nats"])
            for label, by_episode in cells.items():
                values = [by_episode.get(e) for e in (0, 1)]
                shown = [f"{v:.4f}" if v is not None else "" for v in values]
                mean = statistics.mean(v for v in values if v is not None)
                print(f"| {budget:g}x | {how} | {label} | {shown[0]} | {shown[1]} | {mean:.4f} |")


if __name__ == "__main__":
    main()
