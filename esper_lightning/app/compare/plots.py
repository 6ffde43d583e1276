"""Figures of a controller comparison: paired differences first, then each plotted metric of
`records.METRICS`.

- `differences_figure` (``<name>_differences.png``, the figure to look at first): a forest plot
  of the paired differences of a metric, one row per comparison, with its interval, a zero
  line, the band of differences too small to detect (± the minimum detectable effect) and,
  for the judged metric, the verdict and the Holm-adjusted p-value. Intervals of two means can
  overlap widely while their paired difference is clearly away from zero (the episodes' shared
  variation cancels in the difference), so the judgement is read here.
- `vs_params_figure` (``<name>_vs_params.png``): one point per controller at its mean total
  parameters and mean value, with both intervals as error bars; every controller has its own
  marker, and labels that would print over each other are moved apart.
- `curves_figure` (``<name>s.png``): the mean curve per epoch per controller with its band;
  every controller has its own line style and marker and is shifted sideways by a hair, so
  close curves stay apart; controllers whose curves are equal in every episode share one line
  named by all of them; epochs are whole numbers. With ``x=`` another curve gives the
  horizontal axis: ``loss_vs_flops.png`` draws the validation loss against the mean cumulative
  training FLOPs at each epoch, the comparison at equal compute.

- `regret_figure` (``regret.png``, written by `esper_lightning.app.compare.runner` when a grid of
  growth times was played): each controller's regret to the per-budget best growth time, over
  all episodes and per budget.
- `growth_figure` (``growth_times.png``, written by the runner when an arm grew under a budget):
  when each controller grew against the episode's budget (`app.compare.growth`): whether a
  policy's growth times follow the budget, and where they part from a lookup's.

`save_figures` writes every metric with ``plot=True`` (a paired one also as a forest plot), and
the loss against FLOPs when the episodes recorded both.

Figures are built on `matplotlib.figure.Figure` with an Agg canvas attached directly, never
through ``pyplot``: nothing here selects or changes matplotlib's global backend, so a user's
interactive session (or a notebook) is left as it was, and no GUI window can open.

Example::

    summaries, comparisons = summarize(records), paired_differences(records)
    save_figure(differences_figure(comparisons, "outcome"), "compare/outcome_differences.png")
    save_figure(vs_params_figure(summaries, "outcome"), "compare/outcome_vs_params.png")
    save_figure(curves_figure(records, "accuracy_curve"), "compare/accuracy_curves.png")
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import EngFormatter, MaxNLocator, NullLocator, StrMethodFormatter

from esper_lightning.app.compare.growth import GrowthRow
from esper_lightning.app.compare.records import METRICS, EpisodeRecord, Metric
from esper_lightning.app.compare.regret import Regret
from esper_lightning.app.compare.report import (
    EVERYTHING,
    ControllerSummary,
    PairedComparison,
    Scope,
)
from esper_lightning.app.compare.stats import CONFIDENCE, Estimate, estimate
from esper_lightning.app.compare.table import records_by_controller

#: The size a scalar metric is drawn against.
SIZE = "total_params"
#: Per controller, in order: a marker and a line style (with the colour cycle, no two of the
#: first twelve controllers look alike even in grey).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", "h", ">", "*", "p")
LINESTYLES = ("-", "--", ":", "-.")
#: Colours of the verdicts in the forest plot.
VERDICT_COLOURS = {"better": "tab:green", "worse": "tab:red"}
NO_VERDICT_COLOUR = "0.35"


def _new_axes(height: float = 4.5, width: float = 7.5) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # Agg on this figure only; the global backend is untouched
    return fig, fig.add_subplot()


def _axis_label(metric: Metric, param_cost: float | None, difference: bool = False,
                width: int = 70, short: bool = False) -> str:
    """The metric's axis label, wrapped; a priced metric names the ``param_cost`` it used.
    ``short``: the label and unit only (the report's section says what it is)."""
    label = metric.axis_label()
    if short:
        label = metric.label + (f" ({metric.unit})" if metric.unit else "")
    if difference:
        unit = "pp" if metric.unit == "%" else metric.unit
        label = f"Δ {metric.label}" + (f" ({unit})" if unit else "")
        label += ": controller minus reference, paired by episode"
    if metric.priced and param_cost is not None:
        label += f"; param_cost = {param_cost:g}"
    return "\n".join(textwrap.wrap(label, width))


def _error_bar(value: Estimate) -> list[list[float]] | None:
    """Matplotlib's ``[[below], [above]]`` of an interval, None without one; a constant
    sample's interval ``(x, x)`` can sit a rounding error off its float mean, so never below
    0."""
    if value.ci is None:
        return None
    return [[max(0.0, value.mean - value.ci[0])], [max(0.0, value.ci[1] - value.mean)]]


# --- paired differences -----------------------------------------------------------------------
def differences_figure(comparisons: Sequence[PairedComparison], name: str = "outcome", *,
                       param_cost: float | None = None) -> Figure:
    """A forest plot of the paired differences of metric ``name``: one row per comparison
    (``controller − reference``, top to bottom in table order) with its mean and interval, a
    line at zero and a grey band of ± the minimum detectable effect (rows judged by the outcome);
    the verdict, coloured, and the Holm-adjusted p-value are written at the right of each row
    when ``name`` is the judged metric. Comparisons without the metric are left out.

    Raises:
        ValueError: no comparison has the metric.

    Example::

        fig = differences_figure(paired_differences(records), "outcome")
    """
    metric = METRICS[name]
    shown = [c for c in comparisons if c.differences.get(name) is not None]
    if not shown:
        raise ValueError(f"differences_figure needs at least one comparison with {name}")
    fig, ax = _new_axes(height=1.8 + 0.5 * len(shown), width=9.0)
    rows = np.arange(len(shown))[::-1]  # the first comparison on top
    for y, c in zip(rows, shown, strict=True):
        d = c.differences[name]
        assert d is not None
        judged = name == c.outcome
        colour = VERDICT_COLOURS.get(c.verdict, NO_VERDICT_COLOUR) if judged else "tab:blue"
        if judged and c.mde is not None:
            ax.fill_betweenx([y - 0.3, y + 0.3], -c.mde, c.mde, color="0.85", linewidth=0)
        xerr = _error_bar(d)
        ax.errorbar([d.mean], [y], xerr=xerr, fmt="o", color=colour, capsize=4, markersize=6,
                    markerfacecolor=colour if xerr else "none")  # hollow: no interval
        if judged:
            words = c.verdict if c.verdict in VERDICT_COLOURS else "no detectable difference"
            ax.annotate(f"{words}\nHolm p = {c.p_holm:.2g}", (1.0, y),
                        xycoords=("axes fraction", "data"), xytext=(8, 0),
                        textcoords="offset points", va="center", color=colour,
                        fontsize="small")
    ax.axvline(0.0, color="black", linewidth=1.0)
    ax.set_yticks(rows, [f"{c.controller} − {c.reference}\n(n = {c.n_pairs}"
                         f"{'' if c.differences[name].ci else ', no interval'})"  # type: ignore
                         for c in shown])
    ax.set_ylim(-0.7, len(shown) - 0.3)
    ax.set_xlabel(_axis_label(metric, param_cost, difference=True, width=90))
    band = ("; grey: ± minimum detectable effect"
            if any(name == c.outcome and c.mde is not None for c in shown) else "")
    ax.set_title(f"Paired differences in {metric.label} "
                 f"(means, {shown[0].confidence:.0%} t intervals{band})", fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    return fig


# --- regret to the growth-time oracle ---------------------------------------------------------
def regret_figure(rows: Sequence[Regret], judged: str) -> Figure:
    """A forest plot of the regret to the per-budget best growth time (`regret.regrets`): one
    row per controller (``controller vs oracle`` when there are several oracles), its mean
    regret over all episodes in black and, below it, one dodged marker per budget in that
    budget's colour, each with its interval. A TAU arm sits at 0 on the budgets the oracle chose
    it for, so the figure shows at a glance which growth time wins at which budget, and what
    the other controllers lose to it.

    Raises:
        ValueError: no rows.

    Example::

        oracles, rows = regrets(records, "final_bits")
        save_figure(regret_figure(rows, "final_bits"), "compare/regret.png")
    """
    if not rows:
        raise ValueError("regret_figure needs at least one controller's regret")
    metric = METRICS[judged]
    several = len({r.oracle for r in rows}) > 1
    budgets = list(dict.fromkeys(b for r in rows for b in r.per_budget))
    per_row = 1 + (len(budgets) if len(budgets) > 1 else 0)
    fig, ax = _new_axes(height=1.6 + 0.22 * per_row * len(rows), width=9.0)
    colours = [f"C{i}" for i in range(len(budgets))]
    centres = np.arange(len(rows))[::-1] * (per_row + 1) * 0.25  # the first controller on top
    for y, row in zip(centres, rows, strict=True):
        ax.errorbar([row.overall.mean], [y], xerr=_error_bar(row.overall), fmt="o",
                    color="black", capsize=3, markersize=6,
                    label="all budgets" if y == centres[0] else None)
        if len(budgets) < 2:
            continue
        for k, (budget, colour) in enumerate(zip(budgets, colours, strict=True)):
            if budget not in row.per_budget:
                continue
            value = row.per_budget[budget][1]
            ax.errorbar([value.mean], [y - 0.25 * (k + 1)], xerr=_error_bar(value), fmt="s",
                        color=colour, capsize=2, markersize=4,
                        label=f"budget {budget:.3g} FLOPs" if y == centres[0] else None)
    ax.axvline(0.0, color="black", linewidth=1.0)
    ax.set_yticks(centres - 0.125 * (per_row - 1),
                  [f"{r.controller} vs {r.oracle}" if several else r.controller for r in rows])
    unit = f" ({metric.unit})" if metric.unit else ""
    ax.set_xlabel(f"regret{unit}: {metric.label} lost to the oracle's growth time in the same "
                  "episode (positive is worse)")
    oracle = "" if several else f" {rows[0].oracle}"
    ax.set_title(f"Regret to the per-budget best growth time{oracle} (means, "
                 f"{rows[0].confidence:.0%} t intervals)", fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def growth_figure(rows: Sequence[GrowthRow]) -> Figure:
    """When each controller grew, against the budget (`growth.growth_rows`, log budget axis):
    per controller its own marker and colour, the mean share of the budget at the first growth
    filled and joined by a solid line, at the second hollow and joined by a dashed one, over
    the episodes that made it; a controller that never grew is left out of the plot and named
    in the title's note.

    Raises:
        ValueError: no row under a budget, or no controller grew.

    Example::

        save_figure(growth_figure(growth_rows(records)), "compare/growth_times.png")
    """
    budgeted = [r for r in rows if r.budget is not None]
    controllers = list(dict.fromkeys(r.controller for r in budgeted))
    grew = [c for c in controllers if any(r.first is not None for r in budgeted
                                          if r.controller == c)]
    if not grew:
        raise ValueError("growth_figure needs a controller that grew under a budget")
    fig, ax = _new_axes(width=9.0)
    for k, name in enumerate(grew):
        own = sorted((r for r in budgeted if r.controller == name), key=lambda r: r.budget)
        colour, marker = f"C{k % 10}", MARKERS[k % len(MARKERS)]
        for attr, style, face in (("first", "-", colour), ("second", "--", "white")):
            points = [(r.budget, getattr(r, attr)) for r in own if getattr(r, attr) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, linestyle=style, marker=marker, color=colour,
                        markerfacecolor=face, label=f"{name}, {attr} growth")
    ax.set_xscale("log")
    budgets = sorted({r.budget for r in budgeted})  # type: ignore[type-var]
    ax.xaxis.set_minor_locator(NullLocator())  # ticks at the budgets played, no others
    ax.set_xticks(budgets, [f"{b:.3g}" for b in budgets])  # type: ignore[union-attr]
    ax.set_xlabel("the episode's compute budget (training FLOPs)")
    ax.set_ylabel("share of the budget spent at the growth")
    ax.set_ylim(-0.02, 1.02)
    never = [c for c in controllers if c not in grew]
    note = f"; never grew: {', '.join(never)}" if never else ""
    ax.set_title("\n".join(textwrap.wrap(
        f"When each controller grew (mean over the episodes that grew){note}", 90)),
        fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


# --- a scalar against size --------------------------------------------------------------------
def vs_params_figure(summaries: Sequence[ControllerSummary], name: str = "outcome", *,
                     param_cost: float | None = None) -> Figure:
    """One labelled point per controller at (mean total parameters, mean of metric ``name``),
    with the confidence intervals of both as error bars (none for a single episode).
    Controllers without the metric are left out. ``param_cost`` is named in the axis label of
    a metric that is ``priced``.

    Raises:
        ValueError: no summary has the metric.

    Example::

        fig = vs_params_figure(summarize(records), "outcome", param_cost=1.0)
    """
    metric, size = METRICS[name], METRICS[SIZE]
    shown = [s for s in summaries if s.metrics.get(name) is not None]
    if not shown:
        raise ValueError(f"vs_params_figure needs at least one controller summary with {name}")
    fig, ax = _new_axes()
    points: dict[tuple[Estimate, Estimate], list[str]] = {}  # controllers at one point
    for s in shown:
        x, y = s.metrics[SIZE], s.metrics[name]
        assert x is not None and y is not None
        points.setdefault((x, y), []).append(s.controller)
    for k, ((x, y), names) in enumerate(points.items()):
        ax.errorbar([x.mean], [y.mean], xerr=_error_bar(x), yerr=_error_bar(y),
                    fmt=MARKERS[k % len(MARKERS)], capsize=4, label=" = ".join(names),
                    markerfacecolor="none", markersize=8)
    _label_points(ax, [(x.mean, y.mean) for x, y in points],
                  [" = ".join(names) for names in points.values()])
    ax.set_xlabel(size.axis_label())
    ax.set_ylabel(_axis_label(metric, param_cost, width=45, short=True))
    ax.set_title(f"{metric.label.capitalize()} against size (means, {shown[0].confidence:.0%} "
                 "t intervals)\nOverlapping intervals of means do not mean no difference: "
                 "see the paired differences", fontsize="medium")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _label_points(ax: Axes, points: Sequence[tuple[float, float]], labels: Sequence[str]) -> None:
    """Write each label beside its point; a label that would overlap one already written moves
    down a line at a time, with a leader line back to its point."""
    fig = ax.figure
    fig.draw_without_rendering()  # final limits and layout, so display positions are right
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    placed: list = []
    for xy, label in zip(points, labels, strict=True):
        offset, leader = 6.0, None
        tries = 4 * len(labels) + 1
        for attempt in range(tries):
            text = ax.annotate(label, xy, xytext=(8, offset), textcoords="offset points",
                               fontsize="small", arrowprops=leader)
            # The text's own box: an annotation's extent includes its leader line, which
            # reaches back to the point and would grow the step with every move.
            box = Text.get_window_extent(text, renderer)
            if attempt == tries - 1 or not any(box.overlaps(other) for other in placed):
                break
            text.remove()
            offset -= 1.2 * box.height * 72 / fig.dpi
            leader = {"arrowstyle": "-", "color": "0.6", "linewidth": 0.6, "shrinkB": 4}
        placed.append(box)


# --- curves per epoch -------------------------------------------------------------------------
def _curves(controller: str, name: str, episodes: list[EpisodeRecord]) -> np.ndarray:
    lengths = sorted({len(r[name]) for r in episodes})
    if len(lengths) != 1 or lengths[0] == 0:
        raise ValueError(
            f"controller {controller!r} has {name}s of lengths {lengths}; "
            "its episodes must all have the same, non-zero number of epochs"
        )
    return np.array([r[name] for r in episodes], dtype=np.float64)  # [E, T]


def dodge(k: int, n_controllers: int, n_epochs: int) -> float:
    """Sideways shift of the ``k``-th controller's curve, in epochs: 0.5 % of the epoch axis
    between neighbours, centred, so identical curves show side by side instead of hiding each
    other; small enough never to be read as another epoch."""
    return 0.005 * max(n_epochs - 1, 1) * (k - (n_controllers - 1) / 2)


def _merge_coinciding(
    groups: dict[str, list[EpisodeRecord]], name: str, x: str | None
) -> list[tuple[np.ndarray, np.ndarray | None, list[str]]]:
    """Each controller's curves ``[E, T]`` (and its ``x`` curves), controllers whose curves are
    equal in every episode merged into one entry named by all of them: a reader sees that they
    coincide rather than hunting for a hidden line."""
    drawn: list[tuple[np.ndarray, np.ndarray | None, list[str]]] = []
    for controller, episodes in groups.items():
        curves = _curves(controller, name, episodes)  # [E, T]
        xs = None if x is None else _curves(controller, x, episodes)  # [E, T]
        twin = next((d for d in drawn if np.array_equal(d[0], curves)
                     and (xs is None or np.array_equal(d[1], xs))), None)
        if twin is None:
            drawn.append((curves, xs, [f"{controller} (n={len(episodes)})"]))
        else:
            twin[2].append(controller)
    return drawn


def curves_figure(
    records: Iterable[EpisodeRecord],
    name: str = "accuracy_curve",
    *,
    x: str | None = None,
    confidence: float = CONFIDENCE,
) -> Figure:
    """The mean per epoch of curve metric ``name`` per controller, with a shaded band.
    Controllers whose episodes lack the curve are left out.

    The band at each epoch is the interval of the mean over that controller's episodes
    (`stats.estimate`, as in the report's tables); a controller with a single episode has no
    band. Epochs are numbered from 1; each curve is shifted by `dodge`; controllers whose
    curves are equal in every episode share one line, labelled ``a (n=...) = b, identical in
    every episode``. With ``x`` (another curve metric, e.g. ``train_flops_curve``) a
    controller's points sit at the mean of that curve over its episodes, not at the epochs.

    Raises:
        ValueError: no record has the curve, or one controller's curves differ in length.

    Example::

        fig = curves_figure(records, "accuracy_curve")
        fig = curves_figure(records, "loss_curve", x="train_flops_curve")
    """
    metric = METRICS[name]
    groups = {c: eps for c, eps in records_by_controller(records).items()
              if any(r[name] for r in eps) and (x is None or any(r[x] for r in eps))}
    if not groups:
        raise ValueError(f"curves_figure needs at least one episode with {name}")
    fig, ax = _new_axes()
    drawn = _merge_coinciding(groups, name, x)
    for k, (curves, xs, names) in enumerate(drawn):
        epochs = np.arange(1, curves.shape[1] + 1) + dodge(k, len(drawn), curves.shape[1])
        if xs is not None:
            epochs = xs.mean(axis=0)  # [T]
        label = " = ".join(names) + (", identical in every episode" if len(names) > 1 else "")
        (line,) = ax.plot(epochs, curves.mean(axis=0), label=label,
                          linestyle=LINESTYLES[k % len(LINESTYLES)],
                          marker=MARKERS[k % len(MARKERS)], markersize=4,
                          markerfacecolor="none")
        bands = [estimate(curves[:, t], confidence=confidence).ci for t in range(curves.shape[1])]
        if all(band is not None for band in bands):
            low, high = np.array(bands).T  # [T] each
            ax.fill_between(epochs, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    if x is None:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
    else:
        # Engineering prefixes on the ticks (2 GFLOP) instead of an offset text ("1e9") that a
        # long label runs into.
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set_xlabel(f"{METRICS[x].label} (mean over episodes)")
    ax.set_ylabel(metric.axis_label())
    against = "" if x is None else f" against {METRICS[x].label}"
    ax.set_title(f"{metric.label.capitalize()}{against} (mean over episodes, "
                 f"{confidence:.0%} t band)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


# --- files ------------------------------------------------------------------------------------
def save_figures(records: Sequence[EpisodeRecord], summaries: Sequence[ControllerSummary],
                 comparisons: Sequence[PairedComparison], out: str | os.PathLike[str], *,
                 param_cost: float | None = None, scope: Scope = EVERYTHING) -> list[Path]:
    """Draw every metric with ``plot=True`` that ``scope`` shows and some controller has into
    ``out``: a paired scalar's differences as ``<name>_differences.png`` (first), a scalar as
    ``<name>_vs_params.png``, a curve as ``<name>s.png``, and the validation loss against
    training FLOPs when the scope shows compute; returns the paths written.

    Example::

        save_figures(records, summarize(records), paired_differences(records), "compare")
    """
    figures: list[tuple[int, Figure, str]] = []
    for m in METRICS.values():
        if not m.plot or not scope.shows(m):
            continue
        if m.kind == "curve" and any(r[m.name] for r in records):
            figures.append((2, curves_figure(records, m.name), f"{m.name}s.png"))
            continue
        if m.kind != "scalar":
            continue
        if m.paired and any(c.differences.get(m.name) for c in comparisons):
            figures.append((0, differences_figure(comparisons, m.name, param_cost=param_cost),
                            f"{m.name}_differences.png"))
        if any(s.metrics.get(m.name) for s in summaries):
            figures.append((1, vs_params_figure(summaries, m.name, param_cost=param_cost),
                            f"{m.name}_vs_params.png"))
    if scope.shows(METRICS["train_flops_curve"]) and any(
            r["loss_curve"] and any(r["train_flops_curve"]) for r in records):
        figures.append((2, curves_figure(records, "loss_curve", x="train_flops_curve"),
                        "loss_vs_flops.png"))
    figures.sort(key=lambda item: item[0])  # stable: differences, then sizes, then curves
    return [save_figure(fig, Path(out) / file) for _, fig, file in figures]


def save_figure(fig: Figure, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Write ``fig`` as a PNG at ``path`` (parent folders created).

    Raises:
        ValueError: ``path`` does not end in ``.png``.

    Example::

        save_figure(fig, "compare/accuracy_curves.png")
    """
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"figure path must end in .png, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path
