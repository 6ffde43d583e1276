"""A frontier study's figures (matplotlib's object API, no pyplot): loss against compute with
every fixed size, the frontier and the growing arms; speed-up against budget."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from esper_lightning.app.frontier.estimators import sizes_of
from esper_lightning.app.frontier.fit import curves_by_episode, frontier

__all__ = ["along_figure", "literature_figure", "loss_figure", "speedup_figure", "width_figure"]

BITS = 1.0 / math.log(2.0)


def _points(rows: Sequence[Mapping[str, Any]], arm: str, loss: str
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Budgets, mean loss (bits) and the 95 % normal half-interval of one arm's rows."""
    budgets = sorted({r["budget_flops"] for r in rows if r["arm"] == arm})
    means, halves = [], []
    for budget in budgets:
        values = np.array([r[loss] * BITS for r in rows
                           if r["arm"] == arm and r["budget_flops"] == budget])
        means.append(values.mean())
        halves.append(1.96 * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1
                      else 0.0)
    return np.array(budgets), np.array(means), np.array(halves)


def loss_figure(rows: Sequence[Mapping[str, Any]], loss: str, path: Path) -> None:
    """Loss against training FLOPs (log x): each fixed size's mean curve, the mean of the
    episodes' frontiers, each growing arm's points with 95 % intervals; below, every arm's
    loss above its own episode's frontier (paired), where the gaps that decide are visible."""
    figure = Figure(figsize=(8.0, 7.5), layout="constrained")
    axes, gaps = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    sizes = sizes_of(rows)
    complete = {s: {r["budget"] for r in rows if r["arm"] == s} for s in sizes}
    episodes = [e for e in sorted({int(r["episode"]) for r in rows}) if all(
        complete[s] <= {r["budget"] for r in rows if r["arm"] == s and r["episode"] == e}
        for s in sizes)]
    fronts = {e: frontier([curves_by_episode(rows, s, loss)[e] for s in sizes])
              for e in episodes}
    grid = fronts[episodes[0]].flops
    mean_front = np.mean([[f.at(c) for c in grid] for f in fronts.values()], axis=0) * BITS
    axes.plot(grid, mean_front, color="black", linestyle="--", linewidth=2,
              label="frontier (lower envelope)")
    gaps.axhline(0.0, color="black", linestyle="--", linewidth=2)
    for k, arm in enumerate([*sizes, *sorted({r["arm"] for r in rows} - set(sizes))]):
        fixed = arm in sizes
        style = dict(marker="o" if fixed else "s", markersize=3 if fixed else 5, capsize=2,
                     linewidth=1 if fixed else 1.5, color=f"C{k}",
                     label=f"{arm} (fixed)" if fixed else arm)
        x, y, half = _points(rows, arm, loss)
        axes.errorbar(x, y, yerr=half, linestyle="-" if fixed else "none", **style)
        above = [{**r, loss: r[loss] - fronts[r["episode"]].at(r["budget_flops"])}
                 for r in rows if r["arm"] == arm and r["episode"] in fronts]
        x, y, half = _points(above, arm, loss)
        gaps.errorbar(x, y, yerr=half, linestyle=":" if fixed else "-", **style)
    for ax in (axes, gaps):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: no overlapping labels
        ax.grid(True, which="both", alpha=0.3)
    axes.set_ylabel(f"{loss.split('_')[0]} loss (bits per byte)")
    axes.set_title("Loss against compute: fixed sizes, their frontier, growing arms")
    axes.legend(fontsize=7)
    gaps.set_ylim(-0.06, 0.2)  # the region where arms are close to the frontier
    gaps.set_xlabel("training compute (FLOPs)")
    gaps.set_ylabel("above the frontier (bits, paired)")
    figure.savefig(path, dpi=120)


def speedup_figure(results: Sequence[Any], path: Path) -> None:
    """Each growing arm's speed-up against the frontier by budget (geometric mean, 95 %
    bootstrap interval), with 1× (the frontier) and 1.5× marked; a value some episode only
    bounds is drawn as a triangle pointing where the truth lies (▼ at most, ▲ at least)."""
    figure = Figure(figsize=(8.0, 4.5), layout="constrained")
    axes = figure.add_subplot()
    arms = sorted({r.arm for r in results})
    for k, arm in enumerate(arms):
        mine = [r for r in results if r.arm == arm]
        # A small horizontal offset per arm so intervals at one budget do not hide each other.
        x = np.array([r.budget for r in mine]) * 1.04 ** (k - (len(arms) - 1) / 2)
        y = np.array([r.flops.mean for r in mine])
        low = y - np.array([r.flops.low for r in mine])
        high = np.array([r.flops.high for r in mine]) - y
        line = axes.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=arm)
        for xi, r in zip(x, mine, strict=True):
            if r.flops.below or r.flops.above:
                axes.plot([xi], [r.flops.mean], marker="v" if r.flops.below else "^",
                          markersize=11, color=line[0].get_color(), linestyle="none")
    _finish_speedup(figure, axes, "budget (× base)",
                    "Compute the best fixed size needs for the growing arm's loss, over the arm's",
                    path, {r.budget for r in results})


def _finish_speedup(figure: Figure, axes: Any, xlabel: str, title: str, path: Path,
                    budgets: Sequence[float]) -> None:
    """A speed-up figure's frame: 1× (the frontier) and 1.5× (the goal) marked, log budgets,
    each ``budgets`` labelled."""
    axes.axhline(1.0, color="black", linewidth=1)
    axes.axhline(1.5, color="grey", linewidth=1, linestyle=":")
    axes.set_xscale("log")
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xticks(sorted(budgets), [f"{b:g}×" for b in sorted(budgets)])
    axes.set_xlabel(xlabel)
    axes.set_ylabel("speed-up against the frontier (×)")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    figure.savefig(path, dpi=120)


def width_figure(results: Sequence[Any], path: Path) -> None:
    """Each growing arm's speed-up against the frontier by budget at every width (one colour
    per arm, one line style per width; geometric means with 95 % bootstrap intervals)."""
    figure = Figure(figsize=(8.0, 4.5), layout="constrained")
    axes = figure.add_subplot()
    arms = sorted({r.frontier.arm for r in results})
    widths = sorted({r.width for r in results})
    styles = ["-", "--", ":", "-."]
    colours = [f"C{k}" for k in range(len(arms))]
    for k, arm in enumerate(arms):
        for j, width in enumerate(widths):
            mine = [r for r in results if r.frontier.arm == arm and r.width == width]
            if not mine:
                continue
            shift = 1.03 ** (k * len(widths) + j - (len(arms) * len(widths) - 1) / 2)
            x = np.array([r.frontier.budget for r in mine]) * shift
            y = np.array([r.frontier.flops.mean for r in mine])
            low = y - np.array([r.frontier.flops.low for r in mine])
            high = np.array([r.frontier.flops.high for r in mine]) - y
            axes.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, color=colours[k],
                          linestyle=styles[j % len(styles)], label=f"{arm}, width {width}")
    _finish_speedup(figure, axes, "budget (× the width's base)",
                    "Speed-up of growth against the compute-optimal frontier, by width", path,
                    {r.frontier.budget for r in results})


#: The speed-ups the literature figure labels on its log axis (`HIGH_TICKS` too, up to the
#: largest value drawn: a mid-run reading may pass 3×).
SPEEDUP_TICKS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
HIGH_TICKS = (4.0, 6.0, 8.0, 12.0)
#: The literature figure's measures: (label, attribute of `estimators.Literature`, marker).
MEASURES = (("frontier of its width (pooled power law)", "frontier", "o"),
            ("the same, per episode piecewise", "today", "s"),
            ("frontier of every width", "cross", "D"),
            ("its final size, both decayed", "final", "^"),
            ("time to its final size's loss", "target", "v"),
            ("its final size, one long schedule, mid-run", "long", "<"),
            ("its final size's WSD stable phase", "stable", ">"),
            ("to its final size's loss, mid-run", "reach", "P"))


def literature_figure(results: Sequence[Any], path: Path) -> None:
    """The speed-up of each growing arm (a row of panels) at each width (a column) by
    budget, measured the frontier's ways and the literature's (`estimators.Literature`; a
    mid-run reading where the rows hold its curves); intervals where a measure has one
    (jackknife t, or t over episodes), hollow markers where the value is only a bound."""
    arms = sorted({r.arm for r in results})
    widths = sorted({r.width for r in results})
    # One study's figure is one column: wide enough for its title and legend.
    figure = Figure(figsize=(max(4.2 * len(widths), 6.4), 3.4 * len(arms)), layout="constrained")
    panels = figure.subplots(len(arms), len(widths), sharex=True, sharey=True, squeeze=False)
    drawn = [getattr(r, name) for r in results for _, name, _ in MEASURES]
    top = max((getattr(v, "value", getattr(v, "mean", 0.0)) for v in drawn if v is not None),
              default=0.0)
    ticks = [*SPEEDUP_TICKS, *(t for t in HIGH_TICKS if t <= top)]
    # The measures some result has (rows without curves have no mid-run reading), spread
    # apart around each budget; each keeps its colour.
    shown = [k for k, (_, name, _) in enumerate(MEASURES)
             if any(getattr(r, name) is not None for r in results)]
    for i, arm in enumerate(arms):
        for j, width in enumerate(widths):
            axes = panels[i][j]
            mine = [r for r in results if r.arm == arm and r.width == width]
            for place, k in enumerate(shown):
                label, name, marker = MEASURES[k]
                _measure(axes, mine, name, marker, f"C{k}", label, place - (len(shown) - 1) / 2)
            axes.axhline(1.0, color="black", linewidth=1)
            axes.set_xscale("log")
            axes.set_yscale("log")
            axes.xaxis.set_minor_formatter(NullFormatter())
            axes.yaxis.set_minor_formatter(NullFormatter())
            axes.set_yticks(ticks, [f"{t:g}×" for t in ticks])
            budgets = sorted({r.budget for r in mine})
            axes.set_xticks(budgets, [f"{b:g}×" for b in budgets])
            axes.set_title(f"{arm}, width {width}", fontsize=9)
            axes.grid(True, which="both", alpha=0.3)
    for axes in panels[-1]:
        axes.set_xlabel("budget (× the width's base)")
    for row in panels:
        row[0].set_ylabel("speed-up (×)")
    panels[0][0].legend(fontsize=6)
    figure.suptitle("The same runs, the frontier's speed-ups and the literature's")
    figure.savefig(path, dpi=120)


def _measure(axes: Any, results: Sequence[Any], name: str, marker: str, colour: str,
             label: str, offset: float) -> None:
    """One measure's points in a literature panel, a little apart from the others' (none
    where no result has it: a mid-run reading without curves)."""
    x, y, low, high, bound = [], [], [], [], []
    for r in results:
        value = getattr(r, name)
        if value is None:
            continue
        if hasattr(value, "censored"):  # a pooled estimate
            mean, lo, hi, censored = value.value, value.low, value.high, value.censored
        else:  # a per-episode summary: its t interval
            mean, lo, hi = value.mean, value.t_low, value.t_high
            censored = value.above or value.below
        x.append(r.budget * 1.05 ** offset)
        y.append(mean)
        # A zero-width interval may sit an ulp inside its value: never a negative bar.
        low.append(0.0 if math.isnan(lo) else max(mean - lo, 0.0))
        high.append(0.0 if math.isnan(hi) else max(hi - mean, 0.0))
        bound.append(bool(censored))
    if not x:
        return
    x, y = np.array(x), np.array(y)
    axes.errorbar(x, y, yerr=[low, high], marker=marker, color=colour, capsize=2, linewidth=1,
                  label=label)
    hollow = np.array(bound, dtype=bool)
    if hollow.any():
        axes.plot(x[hollow], y[hollow], marker=marker, markersize=9, color="white",
                  markeredgecolor=colour, linestyle="none")


def along_figure(runs: Sequence[Any], path: Path) -> None:
    """The token value along each growing arm's run (`along.AlongRun`): its mean over episodes
    at each share of the budget read, with the t interval as a band; 1 and 0 marked."""
    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axes = figure.subplots()
    for k, run in enumerate(runs):
        values = np.array(run.values)
        label = f"{run.arm} at {run.budget:g}× (lr {run.rate:g})"
        axes.plot(run.fractions, values[:, 0], marker="o", color=f"C{k}", label=label)
        axes.fill_between(run.fractions, values[:, 1], values[:, 2], color=f"C{k}", alpha=0.2)
    for level, text in ((1.0, "every early token worth one of the final size's"),
                        (0.0, "worth nothing")):
        axes.axhline(level, color="black", linewidth=1, linestyle="--" if level else "-")
        axes.annotate(text, (0.0, level), xycoords=("axes fraction", "data"), fontsize=7,
                      xytext=(4, 3), textcoords="offset points")
    axes.set_xlabel("share of the arm's budget (after its last growth, before its decay)")
    axes.set_ylabel("token value")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7)
    figure.suptitle("The early phase's worth along the run")
    figure.savefig(path, dpi=120)
