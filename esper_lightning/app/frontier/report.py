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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from esper_lightning.app.frontier.along import Along, along_runs
from esper_lightning.app.frontier.arms import parse_arm
from esper_lightning.app.frontier.estimators import (
    EnvelopePoint,
    Estimate,
    Literature,
    Pool,
    Pooled,
    complete_episodes,
    cross_envelope,
    estimates,
    final_size,
    frontier_rows,
    literature,
    long_rows,
    minimum_bias,
    short_sizes,
    sizes_of,
    too_few_budgets,
)
from esper_lightning.app.frontier.fit import (
    POWER_POINTS,
    Curve,
    Speedup,
    Summary,
    curves_by_episode,
    frontier,
    geometric_summary,
    mean_t,
    speedup,
    time_to_target,
    token_ceiling,
    token_value,
)
from esper_lightning.app.frontier.plan import Plan, Rate, rate_order, rate_text, row_rate
from esper_lightning.errors import ConfigError

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


def _with_ci(mean: float, low: float, high: float, n: int, spec: str = ".2f",
             unit: str = "") -> str:
    """``mean [low, high]``; the mean alone for one episode, which has no interval."""
    text = f"{mean:{spec}}{unit}"
    return text if n < 2 else f"{text} [{low:{spec}}, {high:{spec}}]"


def _t_ci(low: float, high: float, n: int) -> str:
    """A t interval's cell: ``[low, high]``, a dash for one episode."""
    return "—" if n < 2 else f"[{low:.2f}, {high:.2f}]"


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
    with the curve of its final size (`estimators.stage_size`: ``S<depth>[w<width>]``, which
    the rows must hold)."""
    sizes = set(sizes_of(rows))
    results = []
    for arm in sorted({r["arm"] for r in rows} - sizes):
        spec = parse_arm(arm)
        final = final_size(rows, arm)
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
                                       float(np.mean(ceilings)), mean_t(values),
                                       sum(s.censored is not None for s in final_up)))
    return results


def _wall_reach(row: Mapping[str, Any], loss: str, front: Curve) -> float:
    reach = front.flops_to_reach(row[loss])
    return float(front.flops[-1]) if reach is None else reach


def select_lrs(rows: Sequence[Mapping[str, Any]], arm: str, long: bool = False
               ) -> dict[float, tuple[Rate, bool]]:
    """For each budget of ``arm``: the rate of its tuning grid (one rate or a phase rate,
    `plan.row_rate`) with the lowest mean validation loss over the episodes, and whether it
    sits at an end of the grid (the grid should then be widened): a rate at an end of the
    single rates tried, a phase rate with a phase's rate at an end of those tried for it.
    Among the frontier's rows, or with ``long`` among the long runs' (`estimators.long_rows`)."""
    chosen = {}
    mine = [r for r in (long_rows(rows) if long else frontier_rows(rows)) if r["arm"] == arm]
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
            mean, low, high = mean_t(values)
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
            mean, low, high = mean_t([r[loss] * BITS for r in at])
            lrs = ", ".join(rate_text(rate) for rate in sorted({row_rate(r) for r in at},
                                                               key=rate_order))
            lines.append(f"| {arm} | {budget:g} | {len(at)} | "
                         f"{_with_ci(mean, low, high, len(at), '.4f')} | {lrs} |")
    return lines


def _bound(censored: str | None) -> str:
    """The sign a bound's cell starts with (``≥`` at least, ``≤`` at most), empty for a value."""
    return {"above": "≥ ", "below": "≤ "}.get(censored or "", "")


def pooled_cell(estimate: Pooled, unit: str = "×") -> str:
    """A pooled estimate's cell: ``1.05× [0.96, 1.14]``, a bound without interval, or the
    value alone where there is no interval (one episode)."""
    text = f"{_bound(estimate.censored)}{estimate.value:.2f}{unit}"
    return text if math.isnan(estimate.low) else f"{text} [{estimate.low:.2f}, {estimate.high:.2f}]"


def episode_cell(summary: Summary) -> str:
    """A per-episode geometric mean with its t interval; ``≥`` / ``≤`` where some episode's
    value is only a bound that way (``≷`` both ways)."""
    bound = {(True, False): "≥ ", (False, True): "≤ ", (True, True): "≷ "}.get(
        (summary.above > 0, summary.below > 0), "")
    text = f"{bound}{summary.mean:.2f}×"
    return text if summary.n < 2 else f"{text} [{summary.t_low:.2f}, {summary.t_high:.2f}]"


def estimator_table(results: Sequence[Estimate]) -> list[str]:
    """Every growing arm at every budget by the four estimators, and the chord effect."""
    lines = ["| arm | budget (× base) | episodes | pooled power law [jackknife t] | pooled "
             "piecewise [jackknife t] | per-episode power law [t] | per-episode piecewise [t] "
             "| chord effect |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        chord = "—" if math.isnan(r.chord) else f"{r.chord:+.1%}"
        lines.append(f"| {r.arm} | {r.budget:g} | {r.power.n} | {pooled_cell(r.power)} | "
                     f"{pooled_cell(r.piecewise)} | {episode_cell(r.episode_power)} | "
                     f"{episode_cell(r.episode_piecewise)} | {chord} |")
    return lines


def minimum_table(points: Sequence[EnvelopePoint]) -> list[str]:
    """The frontier at each budget as the envelope of the means and as the mean of the
    episodes' minima (bits), and their difference."""
    lines = ["| budget (× base) | TFLOP | envelope of the means | held by | mean of the episodes' "
             "minima | minimum effect (bits) |", "|---:|---:|---:|---|---:|---:|"]
    for p in points:
        lines.append(f"| {p.budget:g} | {p.flops / 1e12:.3g} | {p.envelope * BITS:.4f} | "
                     f"{p.holder} | {p.episodes * BITS:.4f} | "
                     f"{(p.episodes - p.envelope) * BITS:+.4f} |")
    return lines


def at_chosen_rates(rows: Sequence[Mapping[str, Any]], long: bool = False
                    ) -> list[Mapping[str, Any]]:
    """The frontier's rows (or with ``long`` the long runs') of each arm's chosen rate at each
    budget (`select_lrs`): a tuning study's best (on the validation split), a final study's
    one."""
    rows = long_rows(rows) if long else frontier_rows(rows)
    kept = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        rates = {row_rate(r) for r in rows if r["arm"] == arm}
        chosen = select_lrs(rows, arm, long) if len(rates) > 1 else None
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
    """Every growing arm's speed-ups (`speedups`), None for a study of fixed sizes alone.

    Raises:
        ConfigError: A study of growing arms alone: nothing to read them against.
    """
    sizes = set(sizes_of(chosen))
    if not sizes:
        raise ConfigError(f"study {plan.name!r} has growing arms and no fixed size to read them "
                          "against; join a study of the same episodes that has them "
                          "(frontier report --with STUDY, or frontier(..., also=[STUDY]))")
    if sizes == {r["arm"] for r in chosen}:
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
             "Fixed sizes (each fully decayed at its own budget):", "", *size_table(rows, loss),
             "", "The frontier two ways at each budget: the envelope of the sizes' mean losses, "
             "and the mean over episodes of each episode's lowest loss over sizes (the "
             "per-episode frontier); the per-episode frontier is lower where sizes are close, "
             "because each episode's minimum picks its luckiest size:", "",
             *minimum_table(minimum_bias(rows, loss))]
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
        lines += ["", *_estimator_lines(rows, loss)]
    return lines


def _estimator_lines(rows: Sequence[Mapping[str, Any]], loss: str) -> list[str]:
    """The estimators' table (`estimators.estimates`), or the one line saying why there is
    none (a fixed size with fewer budgets than a power law with an offset needs)."""
    try:
        table = estimator_table(estimates(rows, loss))
    except ValueError as err:
        return [f"No speed-up by estimator: {err}."]
    return ["Speed-up by estimator (`estimators`): the headline is the pooled power law "
            "(each fixed size's episode-mean curve fitted by L = E + A·C^−α, the arm's mean "
            "loss read against their envelope; jackknife t interval over episodes); beside it "
            "the same with chords linear in log C, and each episode's own frontier (power law; "
            "piecewise, the table above) with the t interval over episodes. The chord effect is "
            "the pooled speed-up against chords through the fitted laws' own points over the "
            "speed-up against the laws: what chords alone add. ≤ / ≥: only a bound (beyond "
            "the frontier's measured budgets), no interval.", "", *table,
            *_short_sizes_lines(rows)]


def _short_sizes_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The line saying which fixed sizes a fitted envelope reads as measured (`estimators.
    smooth_sizes`), after a blank line; none where every size was fitted."""
    frontier = frontier_rows(rows)  # a long run's row is no budget of its size
    short = short_sizes(frontier)
    if not short:
        return []
    named = ", ".join(f"{s} ({len({r['budget'] for r in frontier if r['arm'] == s})} budgets)"
                      for s in short)
    return ["", f"Fewer budgets than a power law with an offset needs ({POWER_POINTS}): {named}, "
            "in the fitted envelopes as measured: linear in log C between its budgets, which "
            "lies above a convex curve, so where such a size holds the frontier a speed-up read "
            "there is, if anything, too large."]


def write_report(folder: str | Path, plan: Plan, rows: Sequence[Mapping[str, Any]],
                 docs: str | Path | None = None, also: Sequence[str] = ()) -> Path:
    """Write ``report.md`` and the figures into ``folder``; with ``docs``, replace the study's
    marked section there and copy the figures beside it (``images/frontier-<name>-<figure>``);
    a document that also marks a ``<name>-literature`` or ``<name>-along`` section gets that
    section's table there (`_Section`; studies at several widths take the literature's from
    `write_widths`). ``also``: the studies whose rows joined (`report_lines`). Returns the
    report's path."""
    from esper_lightning.app.frontier.plots import loss_figure, speedup_figure

    folder = Path(folder)
    chosen = at_chosen_rates(rows)
    results = _growing_speedups(chosen, plan)  # bootstrapped once, for tables and figure
    lines = _lines(plan, chosen, results, also)
    figures = {"loss_vs_flops.png": "loss against compute"}
    loss_figure(chosen, loss_key(plan), folder / "loss_vs_flops.png")
    sections: list[_Section] = []
    if results is not None:
        figures["speedup.png"] = "speed-up against the frontier"
        speedup_figure(results, folder / "speedup.png")
        sections = [_literature_section(plan, rows, folder),
                    _along_section(plan, rows, chosen, folder)]
    body = [line for section in sections
            for line in ("", f"## {section.title}", "", *section.lines)]
    pictures = [line for name, alt in [*figures.items(), *((x.figure, x.alt) for x in sections
                                                          if x.figure)]
                for line in ("", f"![{alt}]({name})")]
    path = folder / "report.md"
    path.write_text("\n".join([f"# Frontier study `{plan.name}`", "", *lines, *body,
                               *pictures, ""]))
    if docs is not None:
        replace_section(Path(docs), plan.name, lines)
        for section in sections:  # the docs' only where they mark a section for it
            if f"<!-- frontier:{plan.name}-{section.name}:begin -->" in Path(docs).read_text():
                replace_section(Path(docs), f"{plan.name}-{section.name}", section.lines)
                if section.figure:  # drawn just now, beside the others
                    figures[section.figure] = ""
        images = Path(docs).parent / "images"  # where the document's pictures live
        images.mkdir(exist_ok=True)
        for figure in figures:  # drawn just now: never an older run's picture
            shutil.copyfile(folder / figure, images / f"frontier-{plan.name}-{figure}")
    return path


@dataclass(frozen=True)
class _Section:
    """A section of a growing study's report past its tables: its marker's suffix in a
    document (``<!-- frontier:<study>-<name>:begin -->``), title, lines, and its figure's file
    in the study's folder (None: not drawn) with the figure's alt text."""

    name: str
    title: str
    lines: list[str]
    figure: str | None
    alt: str


def _literature_section(plan: Plan, rows: Sequence[Mapping[str, Any]], folder: Path
                        ) -> _Section:
    table, drawn = _literature_report(plan, rows, folder / "literature.png")
    return _Section("literature", "As the growth literature measures it", table,
                    "literature.png" if drawn else None,
                    "the frontier's speed-ups and the literature's")


def _along_section(plan: Plan, rows: Sequence[Mapping[str, Any]],
                   chosen: Sequence[Mapping[str, Any]], folder: Path) -> _Section:
    lines, drawn = _along_report(plan, rows, chosen, folder / "along.png")
    return _Section("along", "The token value along the run", lines,
                    "along.png" if drawn else None,
                    "the token value along each growing arm's run")


def _literature_report(plan: Plan, rows: Sequence[Mapping[str, Any]], figure: Path
                       ) -> tuple[list[str], bool]:
    """The literature's table of one study (`literature_lines`, its long runs' rows with it)
    and its figure at ``figure``; or the one line saying why there is none (no final size in
    the rows, or too few budgets for a power law). Whether the figure was drawn."""
    from esper_lightning.app.frontier.plots import literature_figure

    try:
        measured = literature([(plan.shape.width, [*at_chosen_rates(rows),
                                                   *at_chosen_rates(rows, long=True)])],
                              loss_key(plan), [plan.decay_fraction])
    except ValueError as err:
        return [f"No literature table: {err}."], False
    frontier = frontier_rows(rows)
    short = [f"{arm} ({len({r['budget'] for r in frontier if r['arm'] == arm})})"
             for arm in too_few_budgets(frontier)]
    note = [f"No time to the final size's loss (—) for an arm trained at fewer budgets than a "
            f"power law of its own needs ({POWER_POINTS}): {', '.join(short)}; the same "
            "reading mid-run, from its curves, needs none."] if short else []
    if not measured:
        return ["No literature table: the rows hold no growing arm."], False
    literature_figure(measured, figure)
    return [*literature_lines(measured), *(["", *note] if note else []),
            *_short_sizes_lines(frontier)], True


def _along_report(plan: Plan, rows: Sequence[Mapping[str, Any]],
                  chosen: Sequence[Mapping[str, Any]], figure: Path) -> tuple[list[str], bool]:
    """The token value along each growing arm's run (`along_lines`) and its figure at
    ``figure`` where some arm was read. Whether the figure was drawn."""
    from esper_lightning.app.frontier.plots import along_figure

    along = along_runs(rows, plan.decay_fraction, arms=chosen)
    if along.runs:
        along_figure(along.runs, figure)
    return along_lines(along), bool(along.runs)


def along_lines(along: Along) -> list[str]:
    """`along.along_runs`'s readings, a row per point read; the arms and budgets not read, and
    why, in one line."""
    skipped = "; ".join(along.skipped)
    if not along.runs and all(why.endswith(": no curve") for why in along.skipped):
        return ["No token value along the run: no growing arm's row has a curve (a plan's "
                "`curve_points`)."]
    if not along.runs:
        return [f"No token value along the run: {skipped}."]
    lines = ["What is left of the early phase's worth along the run: the token value (1: each "
             "token seen before the last growth worth one of the final size's; 0: none) at each "
             "curve point between the arm's last growth and its decay, against its final "
             "size's WSD stable phase at the arm's peak rate, episode by episode (mean, t "
             "interval over episodes; `along`). The token table above reads the same value at "
             "the end of the run, both fully decayed.", "",
             "| arm | budget (× base) | lr | share of the budget | episodes | token value |",
             "|---|---:|---:|---:|---:|---:|"]
    for run in along.runs:
        for share, (mean, low, high), n in zip(run.fractions, run.values, run.episodes,
                                               strict=True):
            lines.append(f"| {run.arm} | {run.budget:g} | {run.rate:g} | {share:.3f} | {n} | "
                         f"{_with_ci(mean, low, high, n)} |")
    beyond, before = (sum(run.beyond for run in along.runs),
                      sum(run.before for run in along.runs))
    if beyond or before:
        lines += ["", f"Readings left out: {beyond} of a loss the stable phase never reaches "
                  f"(worth more than its last point reads), {before} of one it reaches before its "
                  "first point (worth less); each mean is over the episodes read at its point."]
    return lines + (["", f"Not read: {skipped}."] if skipped else [])


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
                 docs: str | Path | None = None,
                 tuning: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]] = ()) -> list[str]:
    """The by-width table, the cross-width frontier (`cross_width_lines`) and the literature's
    measures (`literature_lines`), returned; with ``docs``, written into its
    ``frontier:by-width``, ``frontier:cross-width`` and ``frontier:literature`` sections. The
    by-width figure goes to ``figure``, the literature's beside it
    (``frontier-literature.png``); ``tuning``: the tuning studies whose grids chose the rates
    (by width), so each rate is said to be inside its grid or at an edge."""
    from esper_lightning.app.frontier.plots import literature_figure, width_figure

    results = width_results(studies)
    splits = {"test" if loss_key(plan) == "test_nats" else "validation" for plan, _ in studies}
    names = ", ".join(f"`{plan.name}` (width {plan.shape.width}, {plan.episodes} episodes, root "
                      f"{plan.rng_seed})" for plan, _ in studies)
    lines = [f"The same protocol at several widths: {names}; loss on the "
             f"{' and '.join(sorted(splits))} split. A bound (≥, ≤) marks a speed-up some "
             "episode only bounds (beyond the frontier's measured budgets).", "",
             *width_table(results)]
    width_figure(results, figure)
    if len(splits) > 1:
        sections = {name: [f"No {name.replace('-', ' ')} table: the studies read different "
                           f"splits ({' and '.join(sorted(splits))}); their losses do not mix."]
                    for name in ("cross-width", "literature")}
    else:
        chosen = [(plan, at_chosen_rates(rows)) for plan, rows in studies]
        measured = literature([(plan.shape.width, [*at_chosen_rates(rows),
                                                   *at_chosen_rates(rows, long=True)])
                               for plan, rows in studies], loss_key(studies[0][0]),
                              [plan.decay_fraction for plan, _ in studies])
        literature_figure(measured, figure.with_name("frontier-literature.png"))
        sections = {"cross-width": cross_width_lines(chosen, tuning),
                    "literature": literature_lines(measured)}
    if docs is not None:
        replace_section(Path(docs), "by-width", lines)
        for name, section in sections.items():
            replace_section(Path(docs), name, section)
    return [*lines, "", *sections["cross-width"], "", *sections["literature"]]


def cross_width_lines(studies: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]],
                      tuning: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]] = ()
                      ) -> list[str]:
    """The envelope of every width's fixed sizes at every measured budget (`cross_envelope`),
    what it lacks, and each arm's rate per budget against its tuning grid."""
    loss = loss_key(studies[0][0])
    widths = [plan.shape.width for plan, _ in studies]
    pool = Pool([rows for _, rows in studies], loss, [f"w{w} " for w in widths])
    points = cross_envelope(pool)
    names = [f"{pool.labels[g]}{s}" for g, s in pool.sizes()]
    lines = ["The frontier across widths: every fixed size of every study, in absolute FLOPs "
             "(each size's mean loss in bits per byte over its study's episodes, linear in "
             "log C between its measured budgets, — outside them); the envelope read that way "
             "and by each size's fitted power law, and the size holding it. The studies' "
             "episodes differ, so nothing here is paired across widths.", "",
             "| TFLOP | " + " | ".join(names) + " | envelope (piecewise) | held by | envelope "
             "(power law) | held by |", "|---:|" + "---:|" * len(names) + "---:|---|---:|---|"]
    for p in points:
        cells = ["—" if math.isnan(p.losses[n]) else f"{p.losses[n] * BITS:.4f}" for n in names]
        lines.append(f"| {p.flops / 1e12:.3g} | " + " | ".join(cells) + f" | "
                     f"{p.piecewise * BITS:.4f} | {p.piecewise_holder} | {p.power * BITS:.4f} "
                     f"| {p.power_holder} |")
    lines += ["", "What this frontier lacks (read from the rows):", "",
              *_lacks(studies, pool, points), "", *rate_table(studies, tuning)]
    return lines


def _lacks(studies: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]], pool: Pool,
           points: Sequence[Any]) -> list[str]:
    """Budgets a size of a study did not measure, each width's range of compute, and the
    budgets where the envelope sits at an edge of the sizes measured (the deepest size of a
    width; the narrowest or widest width), where a size outside the grid may be better."""
    lines = []
    for (plan, _), rows in zip(studies, pool.rows, strict=True):
        budgets = sorted({r["budget"] for r in rows if r["arm"] in sizes_of(rows)})
        for size in sizes_of(rows):
            missing = [b for b in budgets if b not in {r["budget"] for r in rows
                                                       if r["arm"] == size}]
            if missing:
                tflop = ", ".join(f"{b * plan.base_flops / 1e12:.3g}" for b in missing)
                lines.append(f"- `{plan.name}`: {size} was not measured at "
                             f"{', '.join(f'{b:g}' for b in missing)}× ({tflop} TFLOP).")
        low, high = (b * plan.base_flops / 1e12 for b in (budgets[0], budgets[-1]))
        lines.append(f"- Width {plan.shape.width}: sizes {', '.join(sizes_of(rows))} measured "
                     f"from {low:.3g} to {high:.3g} TFLOP, none outside.")
    widths = sorted(plan.shape.width for plan, _ in studies)
    edges = {}
    for p in points:
        width, size = p.piecewise_holder.split()
        depths = [_depth(s) for s in sizes_of(pool.rows[pool.labels.index(f"{width} ")])]
        if _depth(size) == max(depths):
            edges.setdefault(f"the deepest {width} size measured ({size})", []).append(p.flops)
        rivals = {name.split()[0] for name, loss in p.losses.items() if not math.isnan(loss)}
        if len(rivals) > 1 and int(width[1:]) in (widths[0], widths[-1]):  # widths compete
            side = "narrowest" if int(width[1:]) == widths[0] else "widest"
            edges.setdefault(f"the {side} width measured ({width[1:]})", []).append(p.flops)
    for what, at in edges.items():
        lines.append(f"- The envelope is held by {what} at "
                     f"{', '.join(f'{c / 1e12:.3g}' for c in at)} TFLOP: a size beyond it was "
                     "not measured there.")
    return lines


def _depth(size: str) -> int:
    """A fixed size's depth (``S4`` and ``S4w64``: 4)."""
    return int(size[1:].split("w")[0])


def rate_table(studies: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]],
               tuning: Sequence[tuple[Plan, Sequence[Mapping[str, Any]]]]) -> list[str]:
    """Each arm's rate per budget in each study, marked ✱ where its tuning study (matched by
    width) chose it at an edge of its grid, and with the tuned rate where the two differ."""
    tuned = {plan.shape.width: rows for plan, rows in tuning}
    budgets = sorted({r["budget"] for _, rows in studies for r in rows})
    lines = ["Each arm's rate per budget (✱: at an edge of the rates its tuning study tried, "
             "so a rate outside the grid may be better; — not trained there):", "",
             "| width | arm | " + " | ".join(f"{b:g}×" for b in budgets) + " |",
             "|---:|---|" + "---:|" * len(budgets)]
    for plan, rows in studies:
        grid = tuned.get(plan.shape.width)
        for arm in dict.fromkeys(r["arm"] for r in rows):
            rates = {r["budget"]: row_rate(r) for r in rows if r["arm"] == arm}
            chosen = select_lrs(grid, arm) if grid and any(r["arm"] == arm for r in grid) else {}
            cells = [_rate_cell(rates.get(b), chosen.get(b)) for b in budgets]
            lines.append(f"| {plan.shape.width} | {arm} | " + " | ".join(cells) + " |")
    for plan, _ in studies:
        if plan.shape.width not in tuned:
            lines += ["", f"Width {plan.shape.width}: no tuning study given (`--tuning`), so "
                      "whether its rates sit at an edge of their grid is not read."]
    return lines


def _rate_cell(rate: Rate | None, tuned: tuple[Rate, bool] | None) -> str:
    """A rate table's cell (`rate_table`)."""
    if rate is None:
        return "—"
    text = rate_text(rate)
    if tuned is None:
        return text
    choice, edge = tuned
    if choice == rate:
        return text + " ✱" * edge
    return f"{text} (tuned {rate_text(choice)}{' ✱' * edge})"  # the mark is the tuned rate's


#: What each column of the literature's table measures (`literature_lines`).
LITERATURE_READINGS = (
    "The speed-up of each growing arm measured on the same runs the frontier's ways and the "
    "growth literature's (geometric means; pooled, with a jackknife t interval over episodes, "
    "unless said). At the end of each run, fully decayed: **frontier** — the compute the envelope"
    " of every fixed size of its width needs to reach the arm's loss, over the arm's (and the "
    "same per episode, piecewise: the study's own table); **every width** — the same against the "
    "envelope of every width's sizes; **final size** — the compute its own final size (born that "
    "size, fully decayed at each budget, at its tuned rate) needs to reach the arm's loss, over "
    "the arm's: the literature's same-size comparison, but against a decayed, per-budget tuned "
    "baseline; **time to the final size's loss** — the arm's budget over the compute the arm "
    "needs (on its fitted curve of end-of-run losses) to reach the loss its final size reaches "
    "with that budget. Mid-run, from the runs' curves (a plan's `curve_points`: the loss on one "
    "fixed set of blocks of the split the table reads — test in a final, validation in tuning — "
    "at equal FLOP intervals of each run), the way the literature reads growth: **long "
    "schedule** — the arm and its final size each trained once "
    "to the study's largest budget on one decay (a plan's `long_schedule`), the compute the final"
    " size's run needs to reach the loss the arm's run has at this budget, over the budget, "
    "neither fully decayed there (one schedule for both); **WSD stable phase** — the compute the "
    "final size's run to its largest budget needs before its decay to reach the loss the arm ends"
    " its own fully decayed run of this budget at, over the budget: a decayed arm against an "
    "undecayed baseline; **to the final size's loss** — the budget over the compute the arm's own"
    " run of this budget needs, read on its curve, to reach the loss its final size ends a run of"
    " the same budget at (and the final size's tokens over the arm's at that point). The frontier"
    " divides by the best fixed size, tuned and decayed at each budget; the mid-run readings by "
    "one size, the arm's final, whatever size is best at the budget, read where it is not fully "
    "decayed (the long schedule: both, on one decay; the stable phase: the baseline alone, which "
    "flatters the arm) or where the arm is not (to its loss: this does not), so none of them is a"
    " speed-up a user choosing the best size per budget would see. ≥ / ≤: a bound (beyond the "
    "measured budgets or points), no interval; no curve: the rows lack the curves a reading needs"
    " (a study run before curves, or without a long schedule).")


def _curve_cell(estimate: Pooled | None) -> str:
    """A mid-run reading's cell (`pooled_cell`), ``no curve`` where the rows have none."""
    return "no curve" if estimate is None else pooled_cell(estimate)


def _target_cell(estimate: Pooled | None) -> str:
    """The time to the final size's loss (`pooled_cell`), ``—`` for an arm without a fitted
    curve of its own (`estimators.too_few_budgets`)."""
    return "—" if estimate is None else pooled_cell(estimate)


def literature_lines(results: Sequence[Literature]) -> list[str]:
    """The literature's measures beside the frontier's (one table), and where the speed-up
    against the final size comes from (a second), with what each measures."""
    lines = [LITERATURE_READINGS, "",
             "| arm | width | budget (× base) | episodes | frontier | frontier, per episode "
             "piecewise [t] | every width | final size | time to the final size's loss | long "
             "schedule, mid-run | WSD stable phase | to the final size's loss, mid-run | the "
             "same in tokens |", "|---|" + "---:|" * 12]
    for r in results:
        lines.append(f"| {r.arm} | {r.width} | {r.budget:g} | {r.frontier.n} | "
                     f"{pooled_cell(r.frontier)} | {episode_cell(r.today)} | "
                     f"{pooled_cell(r.cross)} | {pooled_cell(r.final)} | "
                     f"{_target_cell(r.target)} | {_curve_cell(r.long)} | "
                     f"{_curve_cell(r.stable)} | {_curve_cell(r.reach)} | "
                     f"{_curve_cell(r.reach_tokens)} |")
    lines += ["", "Where the speed-up against the final size s comes from: s = 1 − τ + v·(c − 1 "
              "+ τ), an identity, not a bound (c the token ceiling, the arm's tokens at the "
              "final size's FLOPs per token over its budget; c − 1 + τ = τ·r for one growth, r "
              "the final size's FLOPs per token over the first size's; τ the budget's share "
              "before the last growth; v what a token seen before it is worth in final-size "
              "tokens). v > 1 where s > c: an early token worth more than a final-size one.",
              "", "| arm | width | budget (× base) | r | τ | c | s (pooled power law) | v | "
              "s (per episode piecewise) | v (per episode piecewise) [t] |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        value, low, high = r.today_value
        today = f"{value:.2f}" if math.isnan(low) else f"{value:.2f} [{low:.2f}, {high:.2f}]"
        ratio = "—" if math.isnan(r.ratio) else f"{r.ratio:.2f}"  # no born size in the rows
        lines.append(f"| {r.arm} | {r.width} | {r.budget:g} | {ratio} | {r.tau:g} | "
                     f"{r.ceiling:.2f}× | {pooled_cell(r.final)} | {pooled_cell(r.value, '')} | "
                     f"{episode_cell(r.today_final)} | {today} |")
    return lines


def replace_section(document: Path, name: str, lines: Sequence[str], owner: str = "frontier"
                    ) -> None:
    """Replace what is between a document's markers ``<!-- OWNER:NAME:begin -->`` and
    ``<!-- OWNER:NAME:end -->`` by ``lines`` (``owner``: the study kind writing them).

    Raises:
        ConfigError: The document lacks the markers (one line naming them).
    """
    begin, end = f"<!-- {owner}:{name}:begin -->", f"<!-- {owner}:{name}:end -->"
    text = document.read_text()
    if begin not in text or end not in text:
        raise ConfigError(f"{document} has no {begin} ... {end} section to write into")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    document.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
