"""The growth literature's mid-run readings of a study with validation curves, per budget.

    python scripts/literature_check.py results/frontier/w32-literature-tuning

`frontier report`'s literature table needs a power law per arm (three budgets or more); a small
check of the curves (two budgets, say) still has the readings that need none: each growing arm
against its final size on one long schedule, against that size's WSD stable phase, and its
compute and tokens to the size's fully decayed loss (`estimators.curve_readings`: pooled over
the episodes that have the curves, with the jackknife t interval over them where there are two
or more; ≥ / ≤ a bound). Beside them, each fixed size's end-of-run loss on the frontier's
schedule (WSD, fully decayed at each budget) and on its long run where it has one: how far one
schedule is from the other at the long run's end.
"""

from __future__ import annotations

import argparse
import statistics

from esper_lightning.app.frontier.estimators import (
    Pooled,
    curve_readings,
    frontier_rows,
    growing_arms,
    long_rows,
    sizes_of,
)
from esper_lightning.app.frontier.report import loss_key, pooled_cell
from esper_lightning.app.frontier.study import read_study


def cell(reading: Pooled | None) -> str:
    return "no curve" if reading is None else pooled_cell(reading)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="a study folder with plan.json and rows.csv")
    args = parser.parse_args()
    plan, rows = read_study(args.study)
    loss = loss_key(plan)
    print("| arm | budget (× base) | episodes | long schedule | WSD stable phase | "
          "to the final size's loss | the same in tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm in growing_arms(frontier_rows(rows)):
        for budget in sorted({r["budget"] for r in frontier_rows(rows) if r["arm"] == arm}):
            read = curve_readings(rows, arm, budget, plan.decay_fraction)
            episodes = len({r["episode"] for r in rows if r["arm"] == arm
                            and r["budget"] == budget})
            print(f"| {arm} | {budget:g} | {episodes} | {cell(read.long)} | "
                  f"{cell(read.stable)} | {cell(read.reach)} | {cell(read.reach_tokens)} |")
    print(f"\nEnd-of-run {loss} (mean over episodes): the frontier's schedule and the long run")
    for arm in [*sizes_of(frontier_rows(rows)), *growing_arms(frontier_rows(rows))]:
        longs = {r["episode"]: r for r in long_rows(rows) if r["arm"] == arm}
        if not longs:
            continue
        budget = next(iter(longs.values()))["budget"]
        wsd = {r["episode"]: r[loss] for r in frontier_rows(rows)
               if r["arm"] == arm and r["budget"] == budget and r["episode"] in longs}
        if not wsd:
            continue
        schedule = next(iter(longs.values()))["schedule"]
        mean_long = statistics.mean(longs[e][loss] for e in wsd)
        print(f"- {arm} at {budget:g}× base, {len(wsd)} episodes: frontier schedule "
              f"{statistics.mean(wsd.values()):.4f}, long {schedule} run {mean_long:.4f}")

if __name__ == "__main__":
    main()
