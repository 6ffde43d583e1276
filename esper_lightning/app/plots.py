"""Figures of a controller comparison: outcome against size, and accuracy curves.

Figures are built on `matplotlib.figure.Figure` with an Agg canvas attached directly, never
through ``pyplot``: nothing here selects or changes matplotlib's global backend, so a user's
interactive session (or a notebook) is left as it was, and no GUI window can open.

Example::

    summaries = summarize(records)
    save_figure(outcome_vs_params_figure(summaries), "compare/outcome_vs_params.png")
    save_figure(accuracy_curves_figure(records), "compare/accuracy_curves.png")
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

from esper_lightning.app.stats import (
    ControllerSummary,
    EpisodeRecord,
    bootstrap_ci,
    group_by_controller,
)


def _new_axes() -> tuple[Figure, Axes]:
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # Agg on this figure only; the global backend is untouched
    return fig, fig.add_subplot()


def outcome_vs_params_figure(summaries: Sequence[ControllerSummary]) -> Figure:
    """One labelled point per controller at (mean total parameters, mean outcome), with the
    confidence intervals of both as error bars.

    Raises:
        ValueError: no summaries.

    Example::

        fig = outcome_vs_params_figure(summarize(records))
    """
    if not summaries:
        raise ValueError("outcome_vs_params_figure needs at least one controller summary")
    fig, ax = _new_axes()
    for s in summaries:
        x, y = s.total_params_mean, s.outcome_mean
        ax.errorbar(
            [x],
            [y],
            xerr=[[x - s.total_params_ci[0]], [s.total_params_ci[1] - x]],
            yerr=[[y - s.outcome_ci[0]], [s.outcome_ci[1] - y]],
            fmt="o",
            capsize=4,
            label=s.controller,
        )
        ax.annotate(s.controller, (x, y), xytext=(6, 6), textcoords="offset points")
    level = f"{summaries[0].confidence:.0%}"
    ax.set_xlabel("total parameters (host + seeds)")
    ax.set_ylabel("outcome: mean validation accuracy of the last epochs (%)")
    ax.set_title(f"Outcome against size (means, {level} bootstrap intervals)")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _curves(name: str, episodes: list[EpisodeRecord]) -> np.ndarray:
    lengths = sorted({len(r.accuracy_curve) for r in episodes})
    if len(lengths) != 1 or lengths[0] == 0:
        raise ValueError(
            f"controller {name!r} has accuracy curves of lengths {lengths}; "
            "its episodes must all have the same, non-zero number of epochs"
        )
    return np.array([r.accuracy_curve for r in episodes], dtype=np.float64)  # [E, T]


def accuracy_curves_figure(
    records: Iterable[EpisodeRecord],
    *,
    n_resamples: int = 2_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> Figure:
    """Mean validation accuracy per epoch per controller, with a shaded bootstrap band.

    The band at each epoch is `bootstrap_ci` of the mean over that controller's episodes (the
    same percentile bootstrap as the report's tables); a controller with a single episode has a
    band of zero width. Epochs are numbered from 1.

    Raises:
        ValueError: no records, or one controller's curves differ in length.

    Example::

        fig = accuracy_curves_figure(records)
    """
    fig, ax = _new_axes()
    for name, episodes in group_by_controller(records).items():
        curves = _curves(name, episodes)  # [E, T]
        epochs = np.arange(1, curves.shape[1] + 1)
        bands = [
            bootstrap_ci(curves[:, t], n_resamples=n_resamples, confidence=confidence,
                         rng_seed=rng_seed)
            for t in range(curves.shape[1])
        ]
        low, high = np.array(bands).T  # [T] each
        (line,) = ax.plot(epochs, curves.mean(axis=0), label=f"{name} (n={len(episodes)})")
        ax.fill_between(epochs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"Validation accuracy (mean over episodes, {confidence:.0%} bootstrap band)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


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
