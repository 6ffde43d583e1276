"""The seed timeline: one row per slot, coloured by stage over decisions, with the alpha curve
drawn in the row and each seed's blueprint written on its span.

Drawn from `MorphogenesisEngine.timeline` (each slot's stage and alpha after every decision) in
two steps: `timeline_layout` says what goes where (rows, stage bars, alpha curves, labels, in
decision units: plain data a test can read), `render_timeline` paints it with Pillow, which
TensorBoard already installs. Not matplotlib: importing it and laying out one figure cost about
half a second at the end of every fit (docs/benchmarks.md, "Fit tax"), and the picture is a few
rectangles, lines and words.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

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
#: Pixels: image width, one row's pitch, the margins, the font sizes.
WIDTH, ROW_PX, PAD, FONT_PX, SMALL_PX = 800, 40, 10, 13, 11
_INK, _AXIS, _FRAME = "#111111", "#555555", "#999999"


@dataclass(frozen=True)
class TimelineLayout:
    """What the picture shows, in decision units (x) and rows (0 on top).

    Attributes:
        slots: slot ids, top row first.
        span: the first and last decision drawn.
        bars: ``(row, first, last, stage)`` for each run of decisions in one stage.
        curves: per row, ``(decision, alpha)`` after each decision; alpha None where the slot
            holds no seed (the curve breaks there).
        labels: ``(row, decision, blueprint)`` at the start of each seed's span.
        stages: the stages that occur, in order of first appearance (the legend).
        title: drawn above the rows, or None.
    """

    slots: tuple[str, ...]
    span: tuple[int, int]
    bars: tuple[tuple[int, int, int, str], ...]
    curves: tuple[tuple[tuple[int, float | None], ...], ...]
    labels: tuple[tuple[int, int, str], ...]
    stages: tuple[str, ...]
    title: str | None


def timeline_layout(
    entries: Sequence[TimelineEntry],
    slot_ids: Sequence[str] | None = None,
    title: str | None = "seed timeline",
) -> TimelineLayout:
    """The layout of ``entries`` (slots in ``slot_ids`` order, else in order of appearance).

    Raises:
        ValueError: no entries.

    Example:
        >>> entries = [TimelineEntry(e, "r0c1", "TRAINING", 0.0, "norm", "r0c1:seed0")
        ...            for e in range(3)]
        >>> layout = timeline_layout(entries)
        >>> layout.slots, layout.bars, layout.labels
        (('r0c1',), ((0, 0, 2, 'TRAINING'),), ((0, 0, 'norm'),))
    """
    if not entries:
        raise ValueError("the seed timeline needs at least one timeline entry")
    slots = tuple(slot_ids) if slot_ids is not None else tuple(dict.fromkeys(
        e.slot_id for e in entries))
    bars, curves, labels = [], [], []
    for row, slot_id in enumerate(slots):
        rows = sorted((e for e in entries if e.slot_id == slot_id), key=lambda e: e.epoch)
        for stage, run in groupby(rows, key=lambda e: e.stage):
            span = list(run)
            bars.append((row, span[0].epoch, span[-1].epoch, stage))
        curves.append(tuple((e.epoch, None if e.stage in _NO_SEED else e.alpha) for e in rows))
        for seed_id, run in groupby(rows, key=lambda e: e.seed_id):
            first = next(run)
            if seed_id is not None and first.blueprint is not None:
                labels.append((row, first.epoch, first.blueprint))
    epochs = [e.epoch for e in entries]
    return TimelineLayout(slots, (min(epochs), max(epochs)), tuple(bars), tuple(curves),
                          tuple(labels), tuple(dict.fromkeys(e.stage for e in entries)), title)


class _Canvas:
    """Pixel geometry of a layout: decision ``x`` and row ``y`` (0 at the bar's bottom, 1 at
    its top) to pixels."""

    def __init__(self, layout: TimelineLayout, font: Any) -> None:
        self.layout = layout
        label_px = max(font.getlength(s) for s in layout.slots)
        self.left = PAD + math.ceil(label_px) + PAD
        self.top = PAD + (FONT_PX + PAD if layout.title else 0)
        self.right = WIDTH - PAD
        first, last = layout.span
        self.x0, self.decisions = first - 0.5, last - first + 1

    def x(self, decision: float) -> float:
        return self.left + (decision - self.x0) / self.decisions * (self.right - self.left)

    def y(self, row: int, level: float) -> float:
        """Pixel height of ``level`` (0: bar bottom, 1: bar top) in ``row``."""
        centre = self.top + (row + 0.5) * ROW_PX
        return centre + ROW_PX * ROW_HEIGHT * (0.5 - level)

    @property
    def bottom(self) -> int:
        return self.top + ROW_PX * len(self.layout.slots)


def render_timeline(layout: TimelineLayout) -> Image.Image:
    """Paint ``layout`` (an RGB image, white background)."""
    font, small = ImageFont.load_default(FONT_PX), ImageFont.load_default(SMALL_PX)
    canvas = _Canvas(layout, font)
    legend_rows = math.ceil(len(layout.stages) / 5)
    height = canvas.bottom + 2 * (SMALL_PX + PAD) + legend_rows * (SMALL_PX + PAD) + PAD
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    if layout.title:
        draw.text((WIDTH / 2, PAD), layout.title, fill=_INK, font=font, anchor="mt")
    for row, first, last, stage in layout.bars:
        draw.rectangle((canvas.x(first - 0.5), canvas.y(row, 1), canvas.x(last + 0.5),
                        canvas.y(row, 0)), fill=STAGE_COLORS.get(stage, "#ffffff"))
    for row, slot_id in enumerate(layout.slots):
        draw.text((canvas.left - PAD, canvas.y(row, 0.5)), slot_id, fill=_INK, font=font,
                  anchor="rm")
        _draw_curve(draw, canvas, row, layout.curves[row])
    image = _draw_labels(image, canvas, layout.labels, small)
    draw = ImageDraw.Draw(image)
    _draw_axis(draw, canvas, small)
    _draw_legend(draw, canvas.bottom + 2 * (SMALL_PX + PAD), layout.stages, small)
    return image


def _draw_curve(draw: Any, canvas: _Canvas, row: int,
                curve: Sequence[tuple[int, float | None]]) -> None:
    """Alpha inside the row (0 at its bottom, 1 at its top), broken where there is no seed."""
    points = [(canvas.x(d), canvas.y(row, a)) if a is not None else None for d, a in curve]
    for a, b in pairwise(points):
        if a is not None and b is not None:
            draw.line((a, b), fill="#252525", width=2)
    for p in points:
        if p is not None:
            draw.ellipse((p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2), fill="#252525")


def _draw_labels(image: Image.Image, canvas: _Canvas,
                 labels: Sequence[tuple[int, int, str]], font: Any) -> Image.Image:
    """Each blueprint at the start of its span, above the curve's alpha-0 line, on a
    translucent white box so the bar's colour still shows."""
    overlay = Image.new("RGBA", image.size, (255, 255, 255, 0))
    draw = ImageDraw.Draw(overlay)
    for row, decision, text in labels:
        xy = (canvas.x(decision - 0.4), canvas.y(row, 0.62))
        box = draw.textbbox(xy, text, font=font, anchor="lm")
        draw.rectangle((box[0] - 1, box[1] - 1, box[2] + 1, box[3] + 1),
                       fill=(255, 255, 255, 153))
        draw.text(xy, text, fill=_INK, font=font, anchor="lm")
    return Image.alpha_composite(image.convert("RGBA"), overlay).convert("RGB")


def _draw_axis(draw: Any, canvas: _Canvas, font: Any) -> None:
    """Integer decision ticks (at most about a dozen) and the axis's caption."""
    first, last = canvas.layout.span
    every = max(1, math.ceil((last - first + 1) / 12))
    y = canvas.bottom + 2
    draw.line((canvas.left, y, canvas.right, y), fill=_AXIS)
    for tick in range(first + (-first) % every, last + 1, every):
        x = canvas.x(tick)
        draw.line((x, y, x, y + 4), fill=_AXIS)
        draw.text((x, y + 5), str(tick), fill=_AXIS, font=font, anchor="mt")
    caption = "decision (state after it); line: alpha from 0 (row bottom) to 1 (top)"
    draw.text(((canvas.left + canvas.right) / 2, y + SMALL_PX + PAD), caption, fill=_AXIS,
              font=font, anchor="mt")


def _draw_legend(draw: Any, top: int, stages: Sequence[str], font: Any) -> None:
    """A swatch and the name of each stage that occurs, five to a line."""
    for i, stage in enumerate(stages):
        x, y = PAD + (i % 5) * 150, top + (i // 5) * (SMALL_PX + PAD)
        draw.rectangle((x, y, x + SMALL_PX, y + SMALL_PX),
                       fill=STAGE_COLORS.get(stage, "#ffffff"), outline=_FRAME)
        draw.text((x + SMALL_PX + 4, y + SMALL_PX / 2), stage.lower(), fill=_INK, font=font,
                  anchor="lm")


def timeline_image(entries: Sequence[TimelineEntry], **kwargs: Any) -> Image.Image:
    """The timeline of ``entries`` as an RGB image (``kwargs``: `timeline_layout`'s)."""
    return render_timeline(timeline_layout(entries, **kwargs))


def timeline_array(entries: Sequence[TimelineEntry], **kwargs: Any) -> np.ndarray:
    """The timeline as an RGB ``uint8`` array ``[H, W, 3]`` (for ``add_image``)."""
    return np.asarray(timeline_image(entries, **kwargs))


def save_timeline(
    entries: Sequence[TimelineEntry], path: str | os.PathLike[str], **kwargs: Any
) -> None:
    """Draw the timeline of ``entries`` and write it to ``path`` (format from the suffix)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    timeline_image(entries, **kwargs).save(path)


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
    writer.add_image(tag, timeline_array(entries, **kwargs), global_step=step,
                     dataformats="HWC")
