"""The seed-timeline figure: rows, colours, alpha curve and blueprint labels."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_hex

from esper_lightning.core.engine import TimelineEntry
from esper_lightning.viz import STAGE_COLORS, figure_to_array, save_timeline, timeline_figure


def _entries() -> list[TimelineEntry]:
    """r0c1: a seed that blends in over epochs 3-4 and is kept; r0c2: one pruned at epoch 4."""
    one = ["DORMANT", "GERMINATED", "TRAINING", "BLENDING", "BLENDING", "FOSSILIZED"]
    alphas = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    two = ["DORMANT", "DORMANT", "GERMINATED", "TRAINING", "PRUNED", "EMBARGOED"]
    entries = []
    for epoch in range(6):
        seeded = one[epoch] != "DORMANT"
        entries.append(TimelineEntry(epoch, "r0c1", one[epoch], alphas[epoch],
                                     "conv_light" if seeded else None, "a" if seeded else None))
        seeded = two[epoch] != "DORMANT"
        entries.append(TimelineEntry(epoch, "r0c2", two[epoch], 0.0,
                                     "attention" if seeded else None, "b" if seeded else None))
    return entries


def test_one_row_per_slot_coloured_by_stage_with_alpha_and_blueprints():
    fig = timeline_figure(_entries(), slot_ids=["r0c1", "r0c2"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["r0c2", "r0c1"]  # r0c1 on top
    assert sorted(t.get_text() for t in ax.texts) == ["attention", "conv_light"]
    bars = [c for c in ax.collections if hasattr(c, "get_facecolor")]
    colours = {to_hex(c.get_facecolor()[0]) for c in bars}
    assert {STAGE_COLORS["BLENDING"], STAGE_COLORS["FOSSILIZED"], STAGE_COLORS["PRUNED"]} <= {
        c.lower() for c in colours}
    top, bottom = ax.lines  # the alpha curves, r0c1's first
    ys = np.asarray(top.get_ydata(), dtype=float)
    # Row r0c1 is centred at y = 1 and 0.8 high: alpha 0 at 0.6, alpha 1 at 1.4.
    assert np.isnan(ys[0]) and ys[1:].tolist() == pytest.approx([0.6, 0.6, 1.0, 1.4, 1.4])
    assert np.isnan(np.asarray(bottom.get_ydata(), dtype=float)[4:]).all()  # seed gone
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "fossilized" in legend and "pruned" in legend


def test_rendering_and_saving_without_pyplot(tmp_path):
    backend = matplotlib.get_backend()
    image = figure_to_array(timeline_figure(_entries()))
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.min() < 100 < image.max()  # something is drawn on white
    path = tmp_path / "out" / "timeline.png"
    save_timeline(_entries(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend() == backend


def test_no_entries_is_an_error():
    with pytest.raises(ValueError, match="needs at least one timeline entry"):
        timeline_figure([])
