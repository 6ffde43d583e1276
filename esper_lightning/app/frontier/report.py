"""A frontier study's tables and figures, generated from its rows alone.

`write_report` writes ``report.md`` (the fixed sizes' losses by budget, the frontier, every
growing arm's speed-up against it, time to target and wall-clock) and two figures
(``loss_vs_flops.png``, ``speedup.png``) into the study's folder, and, given a document with the
markers ``<!-- frontier:NAME:begin -->`` and ``<!-- frontier:NAME:end -->``, replaces what is
between them with the same tables: no figure in the docs is typed by hand. A ``final`` study
reads the test split; a ``tuning`` study the validation split (`select_lrs` chooses each arm's
rate per budget there).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from esper_lightning.app.frontier.arms import parse_arm
from esper_lightning.app.frontier.fit import (
    Curve,
    Speedup,
    Summary,
    curves_by_episode,
    frontier,
    geometric_summary,
    speedup,
    time_to_target,
    token_ceiling,
    token_value,
)
from esper_lightning.app.frontier.plan import Plan, Rate, rate_order, rate_text, row_rate

__all__ = ["loss_key", "select_lrs", "speedups", "write_report"]

BITS = 1.0 / math.log(2.0)  # nats -> bits


def loss_key(plan: Plan) -> str:
    """The loss a study's tables read: test for a final study, validation for tuning."""
    return "test_nats" if plan.purpose == "final" else "validation_nats"


@dataclass(frozen=True)
class ArmResult:
    """A growing arm at one budget over the episodes: speed-up against the frontier (FLOPs and
    wall-clock) and time to target."""

    arm: str
    budget: float
    flops: Summary
    wall: Summary
    target: Summary


def _mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % t interval (the mean twice for one value)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1)
                 / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def _with_ci(mean: float, low: float, high: float, n: int, spec: str = ".2f",
             unit: str = "") -> str:
    """``mean [low, high]``; the mean alone for one episode, which has no interval."""
    text = f"{mean:{spec}}{unit}"
    return text if n < 2 else f"{text} [{low:{spec}}, {high:{spec}}]"


def _t_ci(low: float, high: float, n: int) -> str:
    """A t interval's cell: ``[low, high]``, a dash for one episode."""
    return "—" if n < 2 else f"[{low:.2f}, {high:.2f}]"


def sizes_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The fixed sizes among the rows' arms (``S<k>``), by depth."""
    return sorted({r["arm"] for r in rows if r["arm"].startswith("S")},
                  key=lambda a: int(a[1:]))


def complete_episodes(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """The episodes in which every fixed size has every one of its budgets (a frontier of an
    episode needs them all; an interrupted study's last episode may not have them yet)."""
    sizes = sizes_of(rows)
    wanted = {s: {r["budget"] for r in rows if r["arm"] == s} for s in sizes}
    episodes = sorted({int(r["episode"]) for r in rows})
    return [e for e in episodes if all(
        wanted[s] <= {r["budget"] for r in rows if r["arm"] == s and r["episode"] == e}
        for s in sizes)]


def speedups(rows: Sequence[Mapping[str, Any]], loss: str) -> list[ArmResult]:
    """Every growing arm's speed-ups at every budget it trained, paired by episode (the
    episodes with a whole frontier)."""
    sizes = sizes_of(rows)
    episodes = complete_episodes(rows)
    rows = [r for r in rows if r["episode"] in episodes]
    flops_front = {e: frontier([curves_by_episode(rows, s, loss)[e] for s in sizes])
                   for e in episodes}
    wall_front = {e: frontier([curves_by_episode(rows, s, loss, x="wall_s")[e] for s in sizes])
                  for e in episodes}
    results = []
    for arm in sorted({r["arm"] for r in rows} - set(sizes)):
        mine = [r for r in rows if r["arm"] == arm]
        own = curves_by_episode(rows, arm, loss)
        for budget in sorted({r["budget"] for r in mine}):
            at = [r for r in mine if r["budget"] == budget]
            flops = [speedup(r[loss], r["budget_flops"], flops_front[r["episode"]]) for r in at]
            wall = [Speedup(_wall_reach(r, loss, wall_front[r["episode"]]) / r["wall_s"])
                    for r in at]
            target = [time_to_target(own[r["episode"]], r["budget_flops"],
                                     flops_front[r["episode"]]) for r in at]
            results.append(ArmResult(arm, budget, geometric_summary(flops),
                                     geometric_summary(wall), geometric_summary(target)))
    return results


@dataclass(frozen=True)
class TokenResult:
    """A growing arm at one budget against its final size alone: the speed-up, the token
    ceiling (`fit.token_ceiling`, mean over episodes) and the token value (`fit.token_value`,
    mean and 95 % t interval; ``bounded``: episodes whose speed-up is only a bound)."""

    arm: str
    budget: float
    final: Summary
    ceiling: float
    value: tuple[float, float, float]
    bounded: int


def token_results(rows: Sequence[Mapping[str, Any]], loss: str) -> list[TokenResult]:
    """Where every growing arm's speed-up comes from (`fit.token_value`), paired by episode
    with the curve of its final size (``S<final depth>``, which the rows must hold)."""
    sizes = set(sizes_of(rows))
    results = []
    for arm in sorted({r["arm"] for r in rows} - sizes):
        spec = parse_arm(arm)
        final = f"S{spec.final_depth}"
        curves = curves_by_episode(rows, final, loss)
        at_final = [r for r in rows if r["arm"] == final]
        cost = float(np.mean([r["spent_flops"] / r["tokens"] for r in at_final]))
        mine = [r for r in rows if r["arm"] == arm and r["episode"] in curves]
        for budget in sorted({r["budget"] for r in mine}):
            at = [r for r in mine if r["budget"] == budget]
            final_up = [speedup(r[loss], r["budget_flops"], curves[r["episode"]]) for r in at]
            ceilings = [token_ceiling(r["tokens"], cost, r["budget_flops"]) for r in at]
            values = [token_value(s.value, c, spec.taus[-1])
                      for s, c in zip(final_up, ceilings, strict=True)]
            results.append(TokenResult(arm, budget, geometric_summary(final_up),
                                       float(np.mean(ceilings)), _mean_ci(values),
                                       sum(s.censored is not None for s in final_up)))
    return results


def _wall_reach(row: Mapping[str, Any], loss: str, front: Curve) -> float:
    reach = front.flops_to_reach(row[loss])
    return float(front.flops[-1]) if reach is None else reach


def select_lrs(rows: Sequence[Mapping[str, Any]], arm: str) -> dict[float, tuple[Rate, bool]]:
    """For each budget of ``arm``: the rate of its tuning grid (one rate or a phase rate,
    `plan.row_rate`) with the lowest mean validation loss over the episodes, and whether it
    sits at an end of the grid (the grid should then be widened): a rate at an end of the
    single rates tried, a phase rate with a phase's rate at an end of those tried for it."""
    chosen = {}
    mine = [r for r in rows if r["arm"] == arm]
    for budget in sorted({r["budget"] for r in mine}):
        by_rate: dict[Rate, list[float]] = {}
        for r in mine:
            if r["budget"] == budget:
                by_rate.setdefault(row_rate(r), []).append(r["validation_nats"])
        best = min(sorted(by_rate, key=rate_order), key=lambda rate: float(np.mean(by_rate[rate])))
        chosen[budget] = (best, _at_edge(best, list(by_rate)))
    return chosen


def _at_edge(best: Rate, grid: Sequence[Rate]) -> bool:
    """Whether ``best`` is at an end of the rates of its kind in ``grid`` (module `select_lrs`)."""
    if not isinstance(best, tuple):
        singles = sorted(r for r in grid if not isinstance(r, tuple))
        return len(singles) > 1 and best in (singles[0], singles[-1])
    phased = [r for r in grid if isinstance(r, tuple) and len(r) == len(best)]
    for phase, rate in enumerate(best):
        tried = sorted({r[phase] for r in phased})
        if len(tried) > 1 and rate in (tried[0], tried[-1]):
            return True
    return False


# --- tables -------------------------------------------------------------------------------------
def size_table(rows: Sequence[Mapping[str, Any]], loss: str) -> list[str]:
    """Every fixed size's mean loss (bits per byte, 95 % t interval) at every budget, and the
    best size at each budget."""
    sizes = sizes_of(rows)
    budgets = sorted({r["budget"] for r in rows if r["arm"] in sizes})
    head = ["| budget (× base) | TFLOP | " + " | ".join(sizes) + " | best |",
            "|---:|---:|" + "---:|" * len(sizes) + "---|"]
    lines = []
    for budget in budgets:
        cells, means = [], {}
        flops = next(r["budget_flops"] for r in rows if r["budget"] == budget)
        for size in sizes:
            values = [r[loss] * BITS for r in rows if r["arm"] == size and r["budget"] == budget]
            if not values:
                cells.append("—")
                continue
            mean, low, high = _mean_ci(values)
            means[size] = mean
            cells.append(_with_ci(mean, low, high, len(values), ".4f"))
        best = min(means, key=means.__getitem__) if means else "—"
        lines.append(f"| {budget:g} | {flops / 1e12:.3g} | " + " | ".join(cells) + f" | {best} |")
    return head + lines


def speedup_table(results: Sequence[ArmResult]) -> list[str]:
    """Every growing arm's speed-ups: against the frontier in FLOPs (95 % bootstrap interval over
    episodes, and the t interval of the mean log), in wall-clock, and its time to the
    frontier's loss (geometric means with bootstrap intervals); how many episodes' values are
    only bounds (censored), for the speed-up and the time to target."""
    head = ["| arm | budget (× base) | episodes | speed-up (FLOPs) [bootstrap] | t interval "
            "| wall-clock | time to target | censored |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    lines = []
    for r in results:
        s, w, t = r.flops, r.wall, r.target
        censored = ", ".join(f"{n} {kind}" for n, kind in (
            (s.above, "above"), (s.below, "below"), (t.above, "above (time to target)"),
            (t.below, "below (time to target)")) if n) or "—"
        lines.append(f"| {r.arm} | {r.budget:g} | {s.n} | "
                     f"{_with_ci(s.mean, s.low, s.high, s.n, unit='×')} | "
                     f"{_t_ci(s.t_low, s.t_high, s.n)} | "
                     f"{_with_ci(w.mean, w.low, w.high, w.n, unit='×')} | "
                     f"{_with_ci(t.mean, t.low, t.high, t.n, unit='×')} | {censored} |")
    return head + lines


def token_table(results: Sequence[TokenResult]) -> list[str]:
    """Every growing arm against its final size alone: speed-up, token ceiling, token value."""
    lines = ["| arm | budget (× base) | episodes | speed-up against its final size "
             "[bootstrap] | token ceiling | token value [t interval] | bounded |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        value, low, high = r.value
        f, n = r.final, r.final.n
        lines.append(f"| {r.arm} | {r.budget:g} | {n} | "
                     f"{_with_ci(f.mean, f.low, f.high, n, unit='×')} | {r.ceiling:.2f}× | "
                     f"{_with_ci(value, low, high, n)} | {r.bounded or '—'} |")
    return lines


def arm_table(rows: Sequence[Mapping[str, Any]], loss: str) -> list[str]:
    """Every growing arm's mean loss at every budget (bits per byte, 95 % t interval)."""
    sizes = set(sizes_of(rows))
    arms = sorted({r["arm"] for r in rows} - sizes)
    lines = ["| arm | budget (× base) | episodes | loss (bits/byte) | lr |",
             "|---|---:|---:|---:|---:|"]
    for arm in arms:
        for budget in sorted({r["budget"] for r in rows if r["arm"] == arm}):
            at = [r for r in rows if r["arm"] == arm and r["budget"] == budget]
            mean, low, high = _mean_ci([r[loss] * BITS for r in at])
            lrs = ", ".join(rate_text(rate) for rate in sorted({row_rate(r) for r in at},
                                                               key=rate_order))
            lines.append(f"| {arm} | {budget:g} | {len(at)} | "
                         f"{_with_ci(mean, low, high, len(at), '.4f')} | {lrs} |")
    return lines


def at_chosen_rates(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of each arm's chosen rate at each budget (`select_lrs`): a tuning study's best
    (on the validation split), a final study's one."""
    kept = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        rates = {row_rate(r) for r in rows if r["arm"] == arm}
        chosen = select_lrs(rows, arm) if len(rates) > 1 else None
        kept += [r for r in rows if r["arm"] == arm
                 and (chosen is None or row_rate(r) == chosen[r["budget"]][0])]
    return kept


def report_lines(plan: Plan, rows: Sequence[Mapping[str, Any]],
                 also: Sequence[str] = ()) -> list[str]:
    """The report's Markdown (module docstring), at each arm's chosen rate per budget; ``also``
    names the studies of the same episodes whose rows joined."""
    chosen = at_chosen_rates(rows)
    return _lines(plan, chosen, _growing_speedups(chosen, plan), also)


def _growing_speedups(chosen: Sequence[Mapping[str, Any]], plan: Plan) -> list[ArmResult] | None:
    """Every growing arm's speed-ups (`speedups`), None for a study of fixed sizes alone."""
    if set(sizes_of(chosen)) == {r["arm"] for r in chosen}:
        return None
    return speedups(chosen, loss_key(plan))


def _lines(plan: Plan, rows: Sequence[Mapping[str, Any]], results: list[ArmResult] | None,
           also: Sequence[str]) -> list[str]:
    loss = loss_key(plan)
    split = "test" if loss == "test_nats" else "validation"
    episodes = len({r["episode"] for r in rows})
    joined = "".join(f" with `{name}`" for name in also)
    plural = "s" * (episodes != 1)
    lines = [f"Study `{plan.name}`{joined} ({plan.purpose}): {episodes} episode{plural} (root rng "
             f"seed {plan.rng_seed}), base budget {plan.base_flops / 1e12:.3g} TFLOP, loss on the "
             f"{split} split in bits per byte, rows in each study's `rows.csv`.", "",
             "Fixed sizes (each fully decayed at its own budget):", "", *size_table(rows, loss)]
    if results is not None:
        lines += ["", "Growing arms:", "", *arm_table(rows, loss), "",
                  "Speed-up against the compute-optimal frontier (the frontier's compute to "
                  "reach the arm's loss, over the arm's; wall-clock the same in seconds; time "
                  "to target: the arm's budget over the compute it needs to reach the "
                  "frontier's loss at its budget):", "", *speedup_table(results)]
        lines += ["", "Where the speed-up comes from: each growing arm against its final size "
                  "alone; the token ceiling is the speed-up it would have if every token seen "
                  "before its last growth were worth one of the final size's, the token value "
                  "how much of that it realises (1: all, 0: as if the early phase had not been "
                  "trained, below 0: it did harm):", "",
                  *token_table(token_results(rows, loss))]
    return lines


def write_report(folder: str | Path, plan: Plan, rows: Sequence[Mapping[str, Any]],
                 docs: str | Path | None = None, also: Sequence[str] = ()) -> Path:
    """Write ``report.md`` and the figures into ``folder``; with ``docs``, replace the study's
    marked section there and copy the figures beside it (``images/frontier-<name>-<figure>``).
    ``also``: the studies whose rows joined (`report_lines`). Returns the report's path."""
    from esper_lightning.app.frontier.plots import loss_figure, speedup_figure

    folder = Path(folder)
    chosen = at_chosen_rates(rows)
    results = _growing_speedups(chosen, plan)  # bootstrapped once, for tables and figure
    lines = _lines(plan, chosen, results, also)
    figures = {"loss_vs_flops.png": "loss against compute"}
    loss_figure(chosen, loss_key(plan), folder / "loss_vs_flops.png")
    if results is not None:
        figures["speedup.png"] = "speed-up against the frontier"
        speedup_figure(results, folder / "speedup.png")
    path = folder / "report.md"
    pictures = [line for name, alt in figures.items() for line in ("", f"![{alt}]({name})")]
    path.write_text("\n".join([f"# Frontier study `{plan.name}`", "", *lines, *pictures, ""]))
    if docs is not None:
        replace_section(Path(docs), plan.name, lines)
        images = Path(docs).parent / "images"  # where the document's pictures live
        images.mkdir(exist_ok=True)
        for figure in figures:  # drawn just now: never an older run's picture
            shutil.copyfile(folder / figure, images / f"frontier-{plan.name}-{figure}")
    return path


@dataclass(frozen=True)
class WidthResult:
    """A growing arm at one budget of one width: against the frontier, against its final size
    alone (`TokenResult`)."""

    width: int
    frontier: ArmResult
    final: TokenResult


def width_results(studies: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]]
                  ) -> list[WidthResult]:
    """Every growing arm's speed-ups in each study (a plan and its rows, joined studies'
    included), by width: the same protocol at several widths side by side."""
    results = []
    for plan, rows in studies:
        chosen = at_chosen_rates(rows)
        loss = loss_key(plan)
        tokens = {(t.arm, t.budget): t for t in token_results(chosen, loss)}
        results += [WidthResult(plan.shape.width, r, tokens[(r.arm, r.budget)])
                    for r in speedups(chosen, loss)]
    return sorted(results, key=lambda r: (r.frontier.arm, r.width, r.frontier.budget))


def width_table(results: Sequence[WidthResult]) -> list[str]:
    """The by-width table: speed-up against the frontier (bootstrap and t intervals), against
    the arm's final size alone, and its token ceiling."""
    lines = ["| arm | width | budget (× base) | episodes | speed-up [bootstrap] | t interval | "
             "against its final size | token ceiling |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s, f = r.frontier.flops, r.final.final
        bound = "≥ " if s.above else ("≤ " if s.below else "")
        lines.append(f"| {r.frontier.arm} | {r.width} | {r.frontier.budget:g} | {s.n} | {bound}"
                     f"{_with_ci(s.mean, s.low, s.high, s.n, unit='×')} | "
                     f"{_t_ci(s.t_low, s.t_high, s.n)} | "
                     f"{_with_ci(f.mean, f.low, f.high, f.n, unit='×')} | "
                     f"{r.final.ceiling:.2f}× |")
    return lines


def write_widths(studies: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]], figure: Path,
                 docs: str | Path | None = None) -> list[str]:
    """The by-width table (returned; with ``docs``, written into its ``frontier:by-width``
    section) and its figure at ``figure``."""
    from esper_lightning.app.frontier.plots import width_figure

    results = width_results(studies)
    splits = {"test" if loss_key(plan) == "test_nats" else "validation" for plan, _ in studies}
    names = ", ".join(f"`{plan.name}` (width {plan.shape.width}, {plan.episodes} episodes, root "
                      f"{plan.rng_seed})" for plan, _ in studies)
    lines = [f"The same protocol at several widths: {names}; loss on the "
             f"{' and '.join(sorted(splits))} split. A bound (≥, ≤) marks a speed-up some "
             "episode only bounds (beyond the frontier's measured budgets).", "",
             *width_table(results)]
    width_figure(results, figure)
    if docs is not None:
        replace_section(Path(docs), "by-width", lines)
    return lines


def replace_section(document: Path, name: str, lines: Sequence[str], owner: str = "frontier"
                    ) -> None:
    """Replace what is between a document's markers ``<!-- OWNER:NAME:begin -->`` and
    ``<!-- OWNER:NAME:end -->`` by ``lines`` (``owner``: the study kind writing them).

    Raises:
        ValueError: The document lacks the markers (one line naming them).
    """
    begin, end = f"<!-- {owner}:{name}:begin -->", f"<!-- {owner}:{name}:end -->"
    text = document.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{document} has no {begin} ... {end} section to write into")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    document.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
