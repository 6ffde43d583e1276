"""The seed timeline: its layout (rows, stage bars, alpha curves, blueprint labels) and the
picture Pillow paints from it (colours read back from the pixels)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageColor

from esper_lightning.core.engine import TimelineEntry
from esper_lightning.viz import (
    STAGE_COLORS,
    render_timeline,
    save_timeline,
    timeline_array,
    timeline_layout,
)
from esper_lightning.viz.timeline import ROW_HEIGHT, ROW_PX, _Canvas


def _entries() -> list[TimelineEntry]:
    """r0c1: a seed that blends in over decisions 3-4 and is kept; r0c2: one pruned at 4."""
    one = ["DORMANT", "GERMINATED", "TRAINING", "BLENDING", "BLENDING", "FOSSILIZED"]
    alphas = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    two = ["DORMANT", "DORMANT", "GERMINATED", "TRAINING", "PRUNED", "EMBARGOED"]
    entries = []
    for decision in range(6):
        seeded = one[decision] != "DORMANT"
        entries.append(TimelineEntry(decision, "r0c1", one[decision], alphas[decision],
                                     "conv_light" if seeded else None, "a" if seeded else None))
        seeded = two[decision] != "DORMANT"
        entries.append(TimelineEntry(decision, "r0c2", two[decision], 0.0,
                                     "attention" if seeded else None, "b" if seeded else None))
    return entries


def test_layout_rows_bars_curves_and_labels():
    layout = timeline_layout(_entries(), slot_ids=["r0c1", "r0c2"])
    assert layout.slots == ("r0c1", "r0c2") and layout.span == (0, 5)
    assert [b for b in layout.bars if b[0] == 0] == [
        (0, 0, 0, "DORMANT"), (0, 1, 1, "GERMINATED"), (0, 2, 2, "TRAINING"),
        (0, 3, 4, "BLENDING"), (0, 5, 5, "FOSSILIZED")]
    assert layout.curves[0] == ((0, None), (1, 0.0), (2, 0.0), (3, 0.5), (4, 1.0), (5, 1.0))
    assert [a for _, a in layout.curves[1]][4:] == [None, None]  # the seed is gone
    assert layout.labels == ((0, 1, "conv_light"), (1, 2, "attention"))
    assert "FOSSILIZED" in layout.stages and "PRUNED" in layout.stages
    # Slots default to their order of appearance; another order is followed.
    assert timeline_layout(_entries(), slot_ids=["r0c2", "r0c1"]).slots == ("r0c2", "r0c1")


def test_picture_paints_each_stage_where_the_layout_puts_it():
    layout = timeline_layout(_entries(), slot_ids=["r0c1", "r0c2"])
    image = render_timeline(layout)
    from PIL import ImageFont

    canvas = _Canvas(layout, ImageFont.load_default(13))

    def colour(row: int, decision: float, level: float) -> tuple[int, ...]:
        return image.getpixel((round(canvas.x(decision)), round(canvas.y(row, level))))

    # Away from the alpha curve and the labels: the bar's own colour.
    assert colour(0, 5.3, 0.3) == ImageColor.getrgb(STAGE_COLORS["FOSSILIZED"])
    assert colour(1, 4.0, 0.8) == ImageColor.getrgb(STAGE_COLORS["PRUNED"])
    assert colour(0, 3.7, 0.1) == ImageColor.getrgb(STAGE_COLORS["BLENDING"])
    # The alpha curve: dark at alpha 1 (the bar's top) after decision 4 of r0c1.
    assert max(colour(0, 4.5, 1.0)) < 80
    # Rows are ROW_PX apart and the bar fills ROW_HEIGHT of the row.
    assert canvas.y(1, 0) - canvas.y(0, 0) == ROW_PX
    assert canvas.y(0, 0) - canvas.y(0, 1) == pytest.approx(ROW_PX * ROW_HEIGHT)


def test_array_and_file(tmp_path):
    array = timeline_array(_entries())
    assert array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3
    assert array.min() < 100 < array.max()  # something is drawn on white
    path = tmp_path / "out" / "timeline.png"
    save_timeline(_entries(), path, title="a title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Image.open(path).size[0] == array.shape[1]


def test_drawing_imports_no_matplotlib():
    code = ("import sys; from esper_lightning.viz import timeline_array; "
            "from esper_lightning.core.engine import TimelineEntry; "
            "timeline_array([TimelineEntry(0, 's', 'TRAINING', 0.0, 'norm', 'x')]); "
            "print('matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_no_entries_is_an_error():
    with pytest.raises(ValueError, match="needs at least one timeline entry"):
        timeline_layout([])
