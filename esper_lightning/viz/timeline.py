"""The seed timeline: one row per slot, coloured by stage over epochs, with the alpha curve
drawn in the row and each seed's blueprint written on its span.

Drawn from `MorphogenesisEngine.timeline` (each slot's stage and alpha after every decision).
Figures are `matplotlib.figure.Figure` objects with an Agg canvas of their own, never pyplot,
so a user's interactive backend is left alone and no window can open.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import groupby
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from esper_lightning.core.engine import TimelineEntry

#: Fill colour of each stage (light for "no seed", blue while it learns behind the host,
#: orange while it blends in, green once kept, red shades for the way out).
STAGE_COLORS = {
    "DORMANT": "#f4f4f4",
    "GERMINATED": "#c6dbef",
    "TRAINING": "#6baed6",
    "BLENDING": "#fd8d3c",
    "HOLDING": "#fdd0a2",
    "FOSSILIZED": "#74c476",
    "PRUNED": "#de2d26",
    "EMBARGOED": "#fcbba1",
    "RESETTING": "#d9d9d9",
    "UNKNOWN": "#ffffff",
}
ROW_HEIGHT = 0.8  # of the 1.0 between rows
#: Stages in which the slot holds no seed module (no alpha curve there).
_NO_SEED = frozenset({"DORMANT", "PRUNED", "EMBARGOED", "RESETTING"})


def timeline_figure(
    entries: Sequence[TimelineEntry],
    slot_ids: Sequence[str] | None = None,
    title: str | None = "seed timeline",
) -> Figure:
    """The timeline of ``entries`` (slots in ``slot_ids`` order, else in order of appearance).

    Raises:
        ValueError: no entries.

    Example:
        >>> entries = [TimelineEntry(e, "r0c1", "TRAINING", 0.0, "norm", "r0c1:seed0")
        ...            for e in range(3)]
        >>> timeline_figure(entries).axes[0].get_yticklabels()[0].get_text()
        'r0c1'
    """
    if not entries:
        raise ValueError("timeline_figure needs at least one timeline entry")
    slots = list(slot_ids) if slot_ids is not None else list(dict.fromkeys(e.slot_id
                                                                            for e in entries))
    fig = Figure(figsize=(8.0, 1.2 + 0.55 * len(slots)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)  # Agg on this figure only
    ax = fig.add_subplot()
    for row, slot_id in enumerate(slots):
        rows = sorted((e for e in entries if e.slot_id == slot_id), key=lambda e: e.epoch)
        _draw_row(ax, rows, len(slots) - 1 - row)  # first slot on top
    epochs = [e.epoch for e in entries]
    ax.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
    ax.set_ylim(-0.6, len(slots) - 0.4)
    ax.set_yticks(range(len(slots)), list(reversed(slots)))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch (state after its decision); line: alpha from 0 (row bottom) to 1 (top)",
                  fontsize=8)
    ax.spines[["top", "right", "left"]].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    seen = list(dict.fromkeys(e.stage for e in entries))
    handles = [Patch(facecolor=STAGE_COLORS.get(s, "#ffffff"), edgecolor="#999999",
                     label=s.lower()) for s in seen]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5),
               fontsize=8, frameon=False)
    return fig


def _draw_row(ax: Any, rows: list[TimelineEntry], y: float) -> None:
    bottom = y - ROW_HEIGHT / 2
    for stage, run in groupby(rows, key=lambda e: e.stage):
        span = list(run)
        ax.broken_barh([(span[0].epoch - 0.5, span[-1].epoch - span[0].epoch + 1)],
                       (bottom, ROW_HEIGHT), facecolors=STAGE_COLORS.get(stage, "#ffffff"),
                       edgecolor="none")
    # The alpha curve inside the row (0 at the row's bottom, 1 at its top), broken where the
    # slot holds no seed.
    xs = [e.epoch for e in rows]
    ys = [np.nan if e.stage in _NO_SEED else bottom + ROW_HEIGHT * e.alpha for e in rows]
    ax.plot(xs, ys, color="#252525", linewidth=1.2, marker=".", markersize=3)
    for seed_id, run in groupby(rows, key=lambda e: e.seed_id):
        span = list(run)
        if seed_id is None or span[0].blueprint is None:
            continue
        # At the start of the span, where alpha is still 0 and the curve runs along the bottom.
        ax.text(span[0].epoch - 0.4, y + ROW_HEIGHT * 0.12, span[0].blueprint, ha="left",
                va="center", fontsize=7, color="#111111",
                bbox={"facecolor": "white", "alpha": 0.6, "edgecolor": "none", "pad": 1.0})


def figure_to_array(fig: Figure) -> np.ndarray:
    """The rendered figure as an RGB ``uint8`` array ``[H, W, 3]`` (for ``add_image``)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_timeline(
    entries: Sequence[TimelineEntry], path: str | os.PathLike[str], **kwargs: Any
) -> None:
    """Draw the timeline of ``entries`` and write it to ``path`` (format from the suffix)."""
    fig = timeline_figure(entries, **kwargs)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)


def log_timeline(
    writer: Any,
    entries: Sequence[TimelineEntry],
    step: int,
    tag: str = "morpho/timeline",
    **kwargs: Any,
) -> None:
    """Log the timeline of ``entries`` as an image to a TensorBoard ``SummaryWriter`` (a
    Lightning ``TensorBoardLogger.experiment``); nothing is logged for no entries."""
    if not entries:
        return
    image = figure_to_array(timeline_figure(entries, **kwargs))  # [H, W, 3]
    writer.add_image(tag, image, global_step=step, dataformats="HWC")
