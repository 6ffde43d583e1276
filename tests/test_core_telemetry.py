"""The morpho/* tags and the per-slot custom-scalars layout."""

from __future__ import annotations

import re

from esper_lightning.core.telemetry import SLOT_TAGS, STAGE_LEGEND, morpho_metrics, slot_layout


def test_layout_groups_each_slots_tags_and_escapes_its_name():
    layout = slot_layout(["r0c1", "net.3"])
    assert list(layout) == ["morpho r0c1", "morpho net.3"]
    charts = layout["morpho net.3"]
    assert [title.split(" (")[0] for title in charts] == list(SLOT_TAGS)
    assert list(charts)[1] == f"stage ({STAGE_LEGEND})"  # what each stage value means
    (pattern,) = charts["alpha"][1]
    assert charts["alpha"][0] == "Multiline"
    assert re.fullmatch(pattern, "morpho/net.3/alpha") and not re.fullmatch(pattern,
                                                                            "morpho/netx3/alpha")
    # Every per-slot tag the callback logs is covered by a chart of its slot.
    logged = {k for k in morpho_metrics(0, {}, contributions={"r0c1": 1.0}) if "r0c1" in k}
    patterns = [p for chart in layout["morpho r0c1"].values() for p in chart[1]]
    assert all(any(re.fullmatch(p, tag) for p in patterns) for tag in logged)
