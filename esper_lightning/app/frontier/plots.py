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

from esper_lightning.app.frontier.fit import curves_by_episode, frontier

__all__ = ["loss_figure", "speedup_figure", "width_figure"]

BITS = 1.0 / math.log(2.0)


def _sizes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({r["arm"] for r in rows if r["arm"].startswith("S")}, key=lambda a: int(a[1:]))


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
    episodes' frontiers, each growing arm's points with 95 % intervals."""
    figure = Figure(figsize=(8.0, 5.0), layout="constrained")
    axes = figure.add_subplot()
    sizes = _sizes(rows)
    for size in sizes:
        x, y, half = _points(rows, size, loss)
        axes.errorbar(x, y, yerr=half, marker="o", markersize=3, linewidth=1, capsize=2,
                      label=f"{size} (fixed)")
    complete = {s: {r["budget"] for r in rows if r["arm"] == s} for s in sizes}
    episodes = [e for e in sorted({int(r["episode"]) for r in rows}) if all(
        complete[s] <= {r["budget"] for r in rows if r["arm"] == s and r["episode"] == e}
        for s in sizes)]
    fronts = [frontier([curves_by_episode(rows, s, loss)[e] for s in sizes]) for e in episodes]
    grid = fronts[0].flops
    mean_front = np.mean([[f.at(c) for c in grid] for f in fronts], axis=0) * BITS
    axes.plot(grid, mean_front, color="black", linestyle="--", linewidth=2,
              label="frontier (lower envelope)")
    for arm in sorted({r["arm"] for r in rows} - set(sizes)):
        x, y, half = _points(rows, arm, loss)
        axes.errorbar(x, y, yerr=half, marker="s", markersize=5, linestyle="none", capsize=3,
                      label=arm)
    axes.set_xscale("log")
    axes.xaxis.set_minor_formatter(NullFormatter())  # decades only: no overlapping labels
    axes.set_xlabel("training compute (FLOPs)")
    axes.set_ylabel(f"{loss.split('_')[0]} loss (bits per byte)")
    axes.set_title("Loss against compute: fixed sizes, their frontier, growing arms")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    figure.savefig(path, dpi=120)


def speedup_figure(results: Sequence[Any], path: Path) -> None:
    """Each growing arm's speed-up against the frontier by budget (geometric mean, 95 %
    bootstrap interval), with 1× (the frontier) and 1.5× marked."""
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
        axes.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=arm)
    _finish_speedup(figure, axes, "budget (× base)",
                    "Compute the best fixed size needs for the growing arm's loss, over the arm's",
                    path)


def _finish_speedup(figure: Figure, axes: Any, xlabel: str, title: str, path: Path) -> None:
    """A speed-up figure's frame: 1× (the frontier) and 1.5× (the goal) marked, log budgets."""
    axes.axhline(1.0, color="black", linewidth=1)
    axes.axhline(1.5, color="grey", linewidth=1, linestyle=":")
    axes.set_xscale("log")
    axes.xaxis.set_minor_formatter(NullFormatter())
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
                    "Speed-up of growth against the compute-optimal frontier, by width", path)
