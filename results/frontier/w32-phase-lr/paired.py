"""w32-phase-lr against the committed single-rate arm, paired by episode (issue 53, item 3).

Run from the repository root: ``python results/frontier/w32-phase-lr/paired.py`` (writes
``paired.md`` beside it and prints it). Every number comes from the two studies' rows.csv:

* this study's rows: G1-4@0.1:identity at a rate per phase (A: S1's and S4's tuned rates at the
  arm's budget; B: S1's at the compute its one-block phase spends, S4's after; C, added after
  episode 0 of A and B: B's one-block rate, the arm's own single tuned rate after; D, added
  after episode 0 of C, at 2x only: the single rate with the re-warm after growth);
* w32-tuning's rows of the same episodes (root 2911): the arm at its single tuned rate per
  budget (`frontier select`), and S1-S4 at their tuned rates (the frontier, and S4's curve).

Per episode and budget: the loss (validation, bits per byte); the speed-up against S4 alone,
``s`` (S4's compute to reach the arm's loss over the arm's budget, S4's curve log-linear between
its budgets, `fit.speedup`); against the frontier; the token ceiling ``c`` (the arm's tokens at
S4's FLOPs per token, over its budget); and the token value ``v = (s - (1 - τ)) / (c - (1 - τ))``
(`fit.token_value`, τ = 0.1), so that ``s = 1 - τ + v (c - 1 + τ)``; and against the
single-rate arm (its own curve at its tuned rate per budget, 0.25-2x: its compute to reach the
row's loss over the row's budget; a bound, ≤, where it is below that curve's range). Paired
differences are a phase-rate variant minus the single rate in the same episode.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from esper_lightning.app.frontier.fit import (
    curves_by_episode,
    frontier,
    speedup,
    token_ceiling,
    token_value,
)
from esper_lightning.app.frontier.plan import rate_text, row_rate
from esper_lightning.app.frontier.report import at_chosen_rates, select_lrs
from esper_lightning.app.frontier.study import read_rows

ARM = "G1-4@0.1:identity"
TAU = 0.1
HERE = Path(__file__).parent
TUNING = HERE.parent / "w32-tuning"
LOSS = "validation_nats"
BITS = 1.0 / math.log(2.0)
VARIANTS = {"A": {1.0: (0.008, 0.008), 2.0: (0.004, 0.008)},
            "B": {1.0: (0.016, 0.008), 2.0: (0.008, 0.008)},
            "C": {1.0: (0.016, 0.004), 2.0: (0.008, 0.002)},
            "D": {2.0: (0.002, 0.002)}}


def main() -> list[str]:
    tuning = read_rows(TUNING)
    mine = read_rows(HERE)
    single = {b: lr for b, (lr, _) in select_lrs(tuning, ARM).items()}
    sizes = [r for r in at_chosen_rates(tuning) if r["arm"].startswith("S")]
    s4 = curves_by_episode(sizes, "S4", LOSS)
    envelope = {e: frontier([curves_by_episode(sizes, f"S{k}", LOSS)[e] for k in range(1, 5)])
                for e in s4}
    cost = float(np.mean([r["spent_flops"] / r["tokens"] for r in sizes if r["arm"] == "S4"]))
    # The single-rate arm's own curve (its tuned rate at each of its budgets, 0.25-2x).
    own = curves_by_episode([r for r in at_chosen_rates(tuning) if r["arm"] == ARM], ARM, LOSS)

    def measure(row: dict) -> dict:
        e, budget = row["episode"], row["budget_flops"]
        to_s4 = speedup(row[LOSS], budget, s4[e])
        ceiling = token_ceiling(row["tokens"], cost, budget)
        return {"bits": row[LOSS] * BITS, "s4": to_s4.value, "censored": to_s4.censored,
                "front": speedup(row[LOSS], budget, envelope[e]).value, "ceiling": ceiling,
                "single": speedup(row[LOSS], budget, own[e]),
                "v": token_value(to_s4.value, ceiling, TAU)}

    def find(rows: list[dict], rate: object, budget: float, episode: int) -> dict | None:
        return next((r for r in rows if r["arm"] == ARM and row_rate(r) == rate
                     and r["budget"] == budget and r["episode"] == episode), None)

    lines = ["| budget | episode | rate | loss (bits) | vs S4 | vs frontier | vs single-rate arm "
             "| ceiling | v |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    diffs = ["", "Paired differences, phase-rate variant minus the single rate (per episode; "
             "mean; 2 episodes are a direction, not evidence):", "",
             "| budget | variant | Δ loss (bits) | Δ log₂ speed-up vs S4 | Δ v |",
             "|---:|---|---|---|---|"]
    for budget in (1.0, 2.0):
        for episode in (0, 1):
            base = find(tuning, single[budget], budget, episode)
            rates = [("single", single[budget], base)] + [
                (name, v[budget], find(mine, v[budget], budget, episode))
                for name, v in VARIANTS.items() if budget in v]
            for name, rate, row in rates:
                if row is None:
                    lines.append(f"| {budget:g} | {episode} | {name} {rate_text(rate)} | "
                                 "not run yet | | | | | |")
                    continue
                m = measure(row)
                bound = {"above": "≥ ", "below": "≤ "}.get(m["censored"] or "", "")
                mine_single = m["single"]
                mark = {"above": "≥ ", "below": "≤ "}.get(mine_single.censored or "", "")
                lines.append(f"| {budget:g} | {episode} | {name} {rate_text(rate)} | "
                             f"{m['bits']:.4f} | {bound}{m['s4']:.3f}× | {m['front']:.3f}× | "
                             f"{mark}{mine_single.value:.3f}× | {m['ceiling']:.3f}× | "
                             f"{m['v']:.2f} |")
        for name, variant in VARIANTS.items():
            if budget not in variant:
                continue
            pairs = [(find(tuning, single[budget], budget, e),
                      find(mine, variant[budget], budget, e)) for e in (0, 1)]
            pairs = [(measure(a), measure(b)) for a, b in pairs if b is not None]
            if not pairs:
                continue
            cells = []
            for key, scale in (("bits", None), ("s4", "log"), ("v", None)):
                d = [(math.log2(b[key] / a[key]) if scale else b[key] - a[key])
                     for a, b in pairs]
                cells.append(", ".join(f"{x:+.3f}" for x in d) + f" (mean {np.mean(d):+.3f})")
            diffs.append(f"| {budget:g} | {name} {rate_text(variant[budget])} | "
                         + " | ".join(cells) + " |")
    head = ["# w32-phase-lr against the single-rate arm (validation split, root 2911)", "",
            f"S4's FLOPs per token {cost:.4g}; τ = {TAU}; single rates: "
            + ", ".join(f"{b:g}×: {lr:g}" for b, lr in single.items() if b in (1.0, 2.0))
            + ". Generated by `paired.py` from the rows.", ""]
    return head + lines + diffs


if __name__ == "__main__":
    text = "\n".join(main()) + "\n"
    (HERE / "paired.md").write_text(text)
    print(text)
