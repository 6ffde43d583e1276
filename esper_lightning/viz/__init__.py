"""Pictures of a growing model (matplotlib object API only: no pyplot, no global backend).

    from esper_lightning.viz import save_timeline
    save_timeline(callback.engine.timeline, "timeline.png")
"""

from esper_lightning.viz.timeline import (
    STAGE_COLORS,
    figure_to_array,
    log_timeline,
    save_timeline,
    timeline_figure,
)

__all__ = ["STAGE_COLORS", "figure_to_array", "log_timeline", "save_timeline", "timeline_figure"]
