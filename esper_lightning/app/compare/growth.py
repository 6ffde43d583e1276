"""When each arm grew: the share of its budget spent at each germination, per budget.

An episode's report after epoch ``j`` says which seeds the slots hold; ``germinated_curve[j]``
counts the distinct seeds seen up to it (`records.germinated_curve`: each germination is a new
seed id). A rise at ``j >= 1`` is a germination at the decision that ended epoch ``j - 1``, so
it happened when ``train_flops_curve[j - 1]`` of the budget was spent (`growth_times`: that over
the episode's budget; without a budget the share of the episode's epochs, ``j / len``). Seeds
already there at the first report were implanted before any decision (``matched:``): they are
no growth. What moves seed parameters without germinating (a gated blend's gate, a prune in
another slot in the same decision) does not move the count; a germination that a governor's
rollback undid before the next report is not seen. A growth is a germination of a growth
operator's blueprint (`blueprints.growth.operator_of`): ``germinated_seeds`` names the seeds the
curve counts, in its order, so a LoRA germinated in a growth slot is no growth. An episode
written before that column counts every germination (a row of the table says so).

Why it is here: a timing arm's loss says whether it beat another, not why; its growth times say
whether it grew earlier, later or not at all where the other did (the learned controller's
"measured reason" where a target fails). Per controller and budget (`growth_rows`): how many
episodes grew 0, 1 or 2+ times, and the mean share of the budget at the first and the second
growth over the episodes that made one.

Example::

    rows = growth_rows(records)  # None: a table written before the curve was recorded
    print("\\n".join(markdown(rows)))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esper_lightning.app.compare.records import BUDGET, EpisodeRecord
from esper_lightning.app.compare.table import (
    Records,
    by_budget,
    episode_table,
    records_by_controller,
)
from esper_lightning.blueprints.growth.registry import operator_of

GERMINATED, FLOPS, SEEDS = "germinated_curve", "train_flops_curve", "germinated_seeds"


def growth_times(germinated: Sequence[float], train_flops: Sequence[float],
                 budget_flops: float | None) -> tuple[float, ...]:
    """The share of the episode spent at each germination (module docstring): of the budget
    under one, else of the epochs (``train_flops`` is then not read); a rise by two is two
    germinations at one decision.

    Raises:
        ValueError: under a budget, curves that differ in length or a budget that is not
            positive.

    Example::

        growth_times([0, 0, 1, 1, 2], [1, 2, 3, 4, 5], 5.0)  # (0.4, 0.8)
    """
    if budget_flops is not None:
        if len(germinated) != len(train_flops):
            raise ValueError(f"{len(germinated)} germination points against "
                             f"{len(train_flops)} FLOP points")
        if budget_flops <= 0:
            raise ValueError(f"budget_flops must be positive, got {budget_flops}")
    times: list[float] = []
    for j in range(1, len(germinated)):
        new = round(germinated[j] - germinated[j - 1])
        if new > 0:
            share = (j / len(germinated) if budget_flops is None
                     else float(train_flops[j - 1]) / budget_flops)
            times += [share] * new
    return tuple(times)


def germinated_blueprints(record: EpisodeRecord) -> tuple[str, ...] | None:
    """The blueprint of each germination of one episode, in order (None: written before
    ``germinated_seeds``); the seeds of the first report were implanted, not germinated."""
    seeds = record[SEEDS]
    if seeds is None or not record[GERMINATED]:
        return None
    return tuple(blueprint for _, blueprint in seeds[round(record[GERMINATED][0]):])


def episode_growth_times(record: EpisodeRecord) -> tuple[float, ...]:
    """The share of the budget at each growth of one episode (`growth_times`), keeping the
    germinations of growth blueprints where ``germinated_seeds`` names them; every germination
    where the episode was written before it.

    Raises:
        ValueError: seeds that do not match the curve's count (a programming error).
    """
    times = growth_times(record[GERMINATED], record[FLOPS], record[BUDGET])
    blueprints = germinated_blueprints(record)
    if blueprints is None:
        return times
    if len(blueprints) != len(times):
        raise ValueError(f"{record.controller!r} episode {record.episode_index}: "
                         f"{len(blueprints)} germinated seeds against {len(times)} germinations")
    return tuple(t for t, blueprint in zip(times, blueprints, strict=True)
                 if operator_of(blueprint) is not None)


@dataclass(frozen=True)
class GrowthRow:
    """When one controller grew on one budget's episodes.

    Attributes:
        controller, budget: the arm, and the episodes' budget in FLOPs (None: no budget).
        episodes: how many episodes it played there.
        grew: episodes that grew 0, 1 and 2 or more times.
        first, second: mean share of the budget at the first and the second growth, over the
            episodes that made one (None where none did).
        blueprints: whether every episode named its germinations' blueprints (``False``:
            some were written before, and there every germination counts as a growth).
    """

    controller: str
    budget: float | None
    episodes: int
    grew: tuple[int, int, int]
    first: float | None
    second: float | None
    blueprints: bool


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def growth_rows(records: Records) -> list[GrowthRow] | None:
    """`GrowthRow` per budget (smallest first) and controller (in playing order); None when
    some episode recorded no germinations per epoch (a table, or the rows of one, written
    before they were)."""
    table = episode_table(records)
    if table.empty or not all(table[GERMINATED]):
        return None
    rows = []
    for budget, episodes in by_budget(table).items():
        for name, own in records_by_controller(episodes).items():
            times = [episode_growth_times(r) for r in own]
            counts = [len(t) for t in times]
            grew = (counts.count(0), counts.count(1), sum(c >= 2 for c in counts))
            rows.append(GrowthRow(name, budget, len(own), grew,  # type: ignore[arg-type]
                                  _mean([t[0] for t in times if t]),
                                  _mean([t[1] for t in times if len(t) > 1]),
                                  all(r[SEEDS] is not None for r in own)))
    return rows


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(rows: Sequence[GrowthRow] | None) -> list[str]:
    """A Markdown section of the growth times; one line saying why where there is no table
    (not recorded, or no arm grew)."""
    lines = ["", "## When each arm grew", ""]
    if rows is None:
        return [*lines, f"Not recorded: some episodes have no `{GERMINATED}` (their rows were "
                        "written before it was)."]
    if all(r.grew[0] == r.episodes for r in rows):
        return [*lines, "No arm germinated a growth blueprint's seed in any episode."]
    lines += ["Per budget: the episodes that grew no, one and two or more times (a growth: a "
              "seed of a growth operator's blueprint germinated at a decision; seeds implanted "
              "before the first are none), and the mean share of the budget spent at the first "
              "and the second growth over the episodes that made one."
              + ("" if all(r.blueprints for r in rows) else
                 f" Rows marked † hold episodes written before `{SEEDS}` named the blueprints: "
                 "there every germination counts."), "",
              "| budget (FLOPs) | controller | episodes | grew 0 / 1 / 2+ | first growth | "
              "second growth |", "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        budget = "—" if r.budget is None else f"{r.budget:.3g}"
        name = r.controller.replace("|", chr(92) + "|") + ("" if r.blueprints else " †")
        lines.append(f"| {budget} | {name} | {r.episodes} "
                     f"| {' / '.join(map(str, r.grew))} | {_share(r.first)} | "
                     f"{_share(r.second)} |")
    return lines


def as_json(rows: Sequence[GrowthRow] | None) -> list[dict[str, Any]] | None:
    """The growth times as plain data (``summary.json``'s ``growth``; None: not recorded)."""
    if rows is None:
        return None
    return [{"controller": r.controller, "budget": r.budget, "episodes": r.episodes,
             "grew": list(r.grew), "first": r.first, "second": r.second,
             "blueprints": r.blueprints} for r in rows]


__all__ = ["GrowthRow", "as_json", "episode_growth_times", "germinated_blueprints", "growth_rows",
           "growth_times", "markdown"]
