"""Pictures of a growing model, drawn with Pillow (no matplotlib, no window).

    from esper_lightning.viz import save_timeline
    save_timeline(callback.engine.timeline, "timeline.png")
"""

from esper_lightning.viz.timeline import (
    STAGE_COLORS,
    TimelineLayout,
    log_timeline,
    render_timeline,
    save_timeline,
    timeline_array,
    timeline_image,
    timeline_layout,
)

__all__ = [
    "STAGE_COLORS",
    "TimelineLayout",
    "log_timeline",
    "render_timeline",
    "save_timeline",
    "timeline_array",
    "timeline_image",
    "timeline_layout",
]
