"""Is the frontier's schedule the strongest at its largest budget? A final's speed-ups with each
fixed size's fully decayed WSD run at the largest budget and, beside them, with that point
taken from the size's long cosine run instead (the same size, rate and budget, one cosine decay
over the whole run), for every size that has a long run:

    python scripts/cosine_frontier.py results/frontier/w32-growth-final

The frontier is the strongest baseline a practitioner would pick only if no schedule of a size
beats it; a long cosine run that ends below the WSD run lowers the envelope at that budget and
with it every speed-up read against the envelope there. The swap takes the cosine endpoint for
every episode when its mean over episodes is lower (a choice made once, on means, not the
better of two per episode, which would favour the frontier by the noise of the minimum). Both
tables use the headline estimator (pooled power law, jackknife t over the episodes) and the
per-episode piecewise one beside it (`estimators.estimates`).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from esper_lightning.app.frontier.estimators import (
    estimates,
    frontier_rows,
    long_rows,
    sizes_of,
)
from esper_lightning.app.frontier.report import loss_key, pooled_cell
from esper_lightning.app.frontier.study import read_study

Row = Mapping[str, Any]


def cosine_swapped(rows: Sequence[Row], loss: str) -> tuple[list[Row], list[str]]:
    """The rows with each fixed size's WSD row at its long run's budget replaced by the long
    run's endpoint, for the sizes whose long runs end lower on the mean; and a line per size
    with a long run saying what each schedule ends at and whether it was swapped."""
    frontier, lines = list(frontier_rows(rows)), []
    for size in sizes_of(frontier):
        longs = {r["episode"]: r for r in long_rows(rows) if r["arm"] == size}
        if not longs:
            continue
        budget = next(iter(longs.values()))["budget"]
        wsd = {i: j for i, r in enumerate(frontier) if r["arm"] == size
               and r["budget"] == budget and (j := r["episode"]) in longs}
        if set(wsd.values()) != set(longs):
            raise SystemExit(f"{size}: the long runs' episodes are not its WSD runs' at "
                             f"{budget:g}x")
        wsd_mean = statistics.fmean(frontier[i][loss] for i in wsd)
        cos_mean = statistics.fmean(r[loss] for r in longs.values())
        swap = cos_mean < wsd_mean
        lines.append(f"{size} at {budget:g}x over {len(longs)} episodes: WSD {wsd_mean:.4f}, "
                     f"cosine {cos_mean:.4f} nats ({loss}); "
                     f"{'cosine taken' if swap else 'WSD kept'}")
        if swap:
            for i, episode in wsd.items():
                frontier[i] = {**frontier[i], loss: longs[episode][loss]}
    return frontier, lines


def table(rows: Sequence[Row], loss: str) -> list[str]:
    """The growing arms' speed-ups by the headline and per-episode piecewise estimators."""
    lines = ["| arm | budget (× base) | pooled power law [jackknife t] | "
             "per-episode piecewise [t] |", "|---|---:|---:|---:|"]
    for est in estimates(rows, loss):
        piece = est.episode_piecewise
        lines.append(f"| {est.arm} | {est.budget:g} | {pooled_cell(est.power)} | "
                     f"{piece.mean:.3f}× [{piece.t_low:.3f}, {piece.t_high:.3f}] |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="a study folder with plan.json and rows.csv")
    plan, rows = read_study(parser.parse_args(argv).study)
    loss = loss_key(plan)
    swapped, notes = cosine_swapped(rows, loss)
    print("\n".join(notes))
    print("\nAgainst the frontier's WSD runs (as `frontier report`):\n")
    print("\n".join(table(frontier_rows(rows), loss)))
    print("\nWith the sizes' long cosine endpoints where they end lower:\n")
    print("\n".join(table(swapped, loss)))


if __name__ == "__main__":
    main()
