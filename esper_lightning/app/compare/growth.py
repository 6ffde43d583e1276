"""When each arm grew: the share of its budget spent at each growth decision, per budget.

An episode's report after epoch ``j`` holds the parameters of the seeds present then
(``seed_params_curve``). A growth is an epoch whose seed parameters exceed the epoch's before
(0 before the first): its seed was germinated at the decision that ended the epoch before, so
the growth happened when ``train_flops_curve[j - 1]`` of the budget was spent (`growth_times`:
that over the episode's budget; at 0 for seeds present from the first epoch, e.g. implanted by
``matched:``). Without a budget the share is of the episode's epochs instead. A seed pruned and
another germinated later counts twice: the table counts decisions to add parameters, not seeds
at the end.

Why it is here: a timing arm's loss says whether it beat another, not why; its growth times say
whether it grew earlier, later or not at all where the other did (the learned controller's
"measured reason" where a target fails). Per controller and budget (`growth_rows`): how many
episodes grew 0, 1 or 2+ times, and the mean share of the budget at the first and the second
growth over the episodes that made one.

Example::

    rows = growth_rows(records)
    print("\\n".join(markdown(rows)))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esper_lightning.app.compare.records import (
    BUDGET,
    EpisodeRecord,
    group_by_budget,
    group_by_controller,
)

SEEDS, FLOPS = "seed_params_curve", "train_flops_curve"


def growth_times(seed_params: Sequence[float], train_flops: Sequence[float],
                 budget_flops: float | None) -> tuple[float, ...]:
    """The share of the episode spent at each growth decision (module docstring): of the
    budget under one, else of the epochs (``train_flops`` is then not read).

    Raises:
        ValueError: under a budget, curves that differ in length or a budget that is not
            positive.

    Example::

        growth_times([0, 0, 10, 10, 30], [1, 2, 3, 4, 5], 5.0)  # (0.4, 0.8)
    """
    if budget_flops is not None:
        if len(seed_params) != len(train_flops):
            raise ValueError(f"{len(seed_params)} seed-parameter points against "
                             f"{len(train_flops)} FLOP points")
        if budget_flops <= 0:
            raise ValueError(f"budget_flops must be positive, got {budget_flops}")
    times, before = [], 0.0
    for j, params in enumerate(seed_params):
        if params > before:
            if j == 0:
                times.append(0.0)
            elif budget_flops is None:
                times.append(j / len(seed_params))
            else:
                times.append(float(train_flops[j - 1]) / budget_flops)
        before = params
    return tuple(times)


@dataclass(frozen=True)
class GrowthRow:
    """When one controller grew on one budget's episodes.

    Attributes:
        controller, budget: the arm, and the episodes' budget in FLOPs (None: no budget).
        episodes: how many episodes it played there.
        grew: episodes that grew 0, 1 and 2 or more times.
        first, second: mean share of the budget at the first and the second growth, over the
            episodes that made one (None where none did).
    """

    controller: str
    budget: float | None
    episodes: int
    grew: tuple[int, int, int]
    first: float | None
    second: float | None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def growth_rows(records: Iterable[EpisodeRecord]) -> list[GrowthRow]:
    """`GrowthRow` per budget (smallest first) and controller (in playing order); empty when
    the episodes recorded no seed parameters per epoch (tables written before they were)."""
    records = list(records)
    if not records or not all(r[SEEDS] for r in records):
        return []
    rows = []
    for budget, episodes in group_by_budget(records).items():
        for name, own in group_by_controller(episodes).items():
            times = [growth_times(r[SEEDS], r[FLOPS], r[BUDGET]) for r in own]
            counts = [len(t) for t in times]
            grew = (counts.count(0), counts.count(1), sum(c >= 2 for c in counts))
            rows.append(GrowthRow(name, budget, len(own), grew,  # type: ignore[arg-type]
                                  _mean([t[0] for t in times if t]),
                                  _mean([t[1] for t in times if len(t) > 1])))
    return rows


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(rows: Sequence[GrowthRow]) -> list[str]:
    """A Markdown section of the growth times (nothing without rows, or where no arm grew)."""
    if not rows or all(r.grew[0] == r.episodes for r in rows):
        return []
    lines = ["", "## When each arm grew", "",
             "Per budget: the episodes that grew no, one and two or more times (a growth: the "
             "seed parameters rose after a decision), and the mean share of the budget spent "
             "at the first and the second growth over the episodes that made one.", "",
             "| budget (FLOPs) | controller | episodes | grew 0 / 1 / 2+ | first growth | "
             "second growth |", "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        budget = "—" if r.budget is None else f"{r.budget:.3g}"
        lines.append(f"| {budget} | {r.controller.replace('|', chr(92) + '|')} | {r.episodes} "
                     f"| {' / '.join(map(str, r.grew))} | {_share(r.first)} | "
                     f"{_share(r.second)} |")
    return lines


def as_json(rows: Sequence[GrowthRow]) -> list[dict[str, Any]]:
    """The growth times as plain data (``summary.json``'s ``growth``)."""
    return [{"controller": r.controller, "budget": r.budget, "episodes": r.episodes,
             "grew": list(r.grew), "first": r.first, "second": r.second} for r in rows]


__all__ = ["GrowthRow", "as_json", "growth_rows", "growth_times", "markdown"]
