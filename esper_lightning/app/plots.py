"""Figures of a controller comparison: each plotted metric of `records.METRICS`.

A scalar metric is drawn against size (`vs_params_figure`: one point per controller at its mean
total parameters and mean value, with both intervals as error bars); a curve per epoch
(`curves_figure`: the mean curve per controller with a bootstrap band). `save_figures` writes
every metric with ``plot=True``: ``<name>_vs_params.png`` or ``<name>s.png``.

Figures are built on `matplotlib.figure.Figure` with an Agg canvas attached directly, never
through ``pyplot``: nothing here selects or changes matplotlib's global backend, so a user's
interactive session (or a notebook) is left as it was, and no GUI window can open.

Example::

    summaries = summarize(records)
    save_figure(vs_params_figure(summaries, "outcome"), "compare/outcome_vs_params.png")
    save_figure(curves_figure(records, "accuracy_curve"), "compare/accuracy_curves.png")
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from esper_lightning.app.records import METRICS, EpisodeRecord, group_by_controller
from esper_lightning.app.report import ControllerSummary
from esper_lightning.app.stats import estimate

#: The size a scalar metric is drawn against.
SIZE = "total_params"


def _new_axes() -> tuple[Figure, Axes]:
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # Agg on this figure only; the global backend is untouched
    return fig, fig.add_subplot()


def vs_params_figure(summaries: Sequence[ControllerSummary], name: str = "outcome") -> Figure:
    """One labelled point per controller at (mean total parameters, mean of metric ``name``),
    with the confidence intervals of both as error bars. Controllers without the metric are
    left out.

    Raises:
        ValueError: no summary has the metric.

    Example::

        fig = vs_params_figure(summarize(records), "outcome")
    """
    metric, size = METRICS[name], METRICS[SIZE]
    shown = [s for s in summaries if s.metrics.get(name) is not None]
    if not shown:
        raise ValueError(f"vs_params_figure needs at least one controller summary with {name}")
    fig, ax = _new_axes()
    for s in shown:
        x, y = s.metrics[SIZE], s.metrics[name]
        assert x is not None and y is not None and x.ci is not None
        yerr = None if y.ci is None else [[y.mean - y.ci[0]], [y.ci[1] - y.mean]]
        ax.errorbar([x.mean], [y.mean], xerr=[[x.mean - x.ci[0]], [x.ci[1] - x.mean]],
                    yerr=yerr, fmt="o", capsize=4, label=s.controller)
        ax.annotate(s.controller, (x.mean, y.mean), xytext=(6, 6), textcoords="offset points")
    ax.set_xlabel(size.axis_label())
    ax.set_ylabel(metric.axis_label())
    ax.set_title(f"{metric.label.capitalize()} against size "
                 f"(means, {shown[0].confidence:.0%} bootstrap intervals)")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _curves(controller: str, name: str, episodes: list[EpisodeRecord]) -> np.ndarray:
    lengths = sorted({len(r[name]) for r in episodes})
    if len(lengths) != 1 or lengths[0] == 0:
        raise ValueError(
            f"controller {controller!r} has {name}s of lengths {lengths}; "
            "its episodes must all have the same, non-zero number of epochs"
        )
    return np.array([r[name] for r in episodes], dtype=np.float64)  # [E, T]


def curves_figure(
    records: Iterable[EpisodeRecord],
    name: str = "accuracy_curve",
    *,
    n_resamples: int = 2_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> Figure:
    """The mean per epoch of curve metric ``name`` per controller, with a shaded bootstrap
    band. Controllers whose episodes lack the curve are left out.

    The band at each epoch is the interval of the mean over that controller's episodes
    (`stats.estimate`, as in the report's tables); a controller with a single episode has a
    band of zero width. Epochs are numbered from 1.

    Raises:
        ValueError: no record has the curve, or one controller's curves differ in length.

    Example::

        fig = curves_figure(records, "accuracy_curve")
    """
    metric = METRICS[name]
    groups = {c: eps for c, eps in group_by_controller(records).items()
              if any(r[name] for r in eps)}
    if not groups:
        raise ValueError(f"curves_figure needs at least one episode with {name}")
    fig, ax = _new_axes()
    for controller, episodes in groups.items():
        curves = _curves(controller, name, episodes)  # [E, T]
        epochs = np.arange(1, curves.shape[1] + 1)
        bands = [
            estimate(curves[:, t], n_resamples=n_resamples, confidence=confidence,
                     rng_seed=rng_seed).ci
            for t in range(curves.shape[1])
        ]
        low, high = np.array(bands).T  # [T] each
        (line,) = ax.plot(epochs, curves.mean(axis=0), label=f"{controller} (n={len(episodes)})")
        ax.fill_between(epochs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric.axis_label())
    ax.set_title(f"{metric.label.capitalize()} (mean over episodes, "
                 f"{confidence:.0%} bootstrap band)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def save_figures(records: Sequence[EpisodeRecord], summaries: Sequence[ControllerSummary],
                 out: str | os.PathLike[str]) -> list[Path]:
    """Draw every metric with ``plot=True`` that some controller has into ``out``: a scalar
    as ``<name>_vs_params.png``, a curve as ``<name>s.png``; returns the paths written.

    Example::

        save_figures(records, summarize(records), "compare")
    """
    paths = []
    for m in METRICS.values():
        if not m.plot:
            continue
        if m.kind == "curve" and any(r[m.name] for r in records):
            fig, file = curves_figure(records, m.name), f"{m.name}s.png"
        elif m.kind == "scalar" and any(s.metrics.get(m.name) for s in summaries):
            fig, file = vs_params_figure(summaries, m.name), f"{m.name}_vs_params.png"
        else:
            continue
        paths.append(save_figure(fig, Path(out) / file))
    return paths


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
