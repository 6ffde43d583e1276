"""The ``morpho/*`` metrics: one definition for both adapters.

The Trainer callback logs them per epoch for one model; the PPO trainer logs them per round,
summed (events) or averaged (parameters) over the pool's episodes. Both call `morpho_metrics`, so
the tags and their meaning cannot drift apart. Every tag is documented in docs/rl.md and the
README.
"""

from __future__ import annotations

from collections.abc import Mapping

from esper_lightning.core.slots import SeedSlot

#: Lifecycle event kinds counted in ``morpho/seeds_<kind>`` (see `engine.LifecycleEvent`).
EVENT_KINDS = ("germinated", "fossilized", "pruned")
#: Tag of the governor's rollback count.
ROLLBACKS_TAG = "governor/rollbacks"


def morpho_metrics(
    seed_params: float,
    events: Mapping[str, int],
    slots: Mapping[str, SeedSlot] | None = None,
    contributions: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Metrics of a growing model.

    Args:
        seed_params: parameters of the seeds present (live and fossilized).
        events: lifecycle event counts by kind (``germinated``, ``fossilized``, ``pruned``).
        slots: when given, per-slot ``morpho/<slot>/alpha`` and ``morpho/<slot>/stage``.
        contributions: per-slot ``morpho/<slot>/contribution`` (accuracy points) when measured.

    Example:
        >>> morpho_metrics(120, {"germinated": 2, "pruned": 1})["morpho/seeds_pruned"]
        1.0
    """
    metrics = {"morpho/seed_params": float(seed_params)}
    for kind in EVENT_KINDS:
        metrics[f"morpho/seeds_{kind}"] = float(events.get(kind, 0))
    for slot_id, slot in (slots or {}).items():
        metrics[f"morpho/{slot_id}/alpha"] = slot.alpha
        metrics[f"morpho/{slot_id}/stage"] = float(slot.stage)
    for slot_id, contribution in (contributions or {}).items():
        metrics[f"morpho/{slot_id}/contribution"] = contribution
    return metrics
