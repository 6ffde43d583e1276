"""The ``morpho/*`` metrics: one definition for both adapters.

The Trainer callback logs them per epoch for one model; the PPO trainer logs them per round,
summed (events) or averaged (parameters) over the pool's episodes. Both call `morpho_metrics`, so
the tags and their meaning cannot drift apart. Every tag is documented in docs/rl.md and
docs/tutorials/drop-in-callback.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from esper_lightning.core.lifecycle import SeedStage
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
    *,
    train_flops: float | None = None,
    budget_flops: float | None = None,
) -> dict[str, float]:
    """Metrics of a growing model.

    Args:
        seed_params: parameters of the seeds present (live and fossilized).
        events: lifecycle event counts by kind (``germinated``, ``fossilized``, ``pruned``).
        slots: when given, per-slot ``morpho/<slot>/alpha`` and ``morpho/<slot>/stage``.
        contributions: per-slot ``morpho/<slot>/contribution`` (accuracy points) when measured.
        train_flops: when given, ``morpho/train_flops``: training FLOPs spent so far.
        budget_flops: when given with ``train_flops``, ``morpho/budget_fraction``: the share of
            the compute budget spent.

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
    if train_flops is not None:
        metrics["morpho/train_flops"] = float(train_flops)
        if budget_flops is not None:
            metrics["morpho/budget_fraction"] = float(train_flops) / budget_flops
    return metrics


#: Per-slot tags, in the order the custom-scalars layout shows them.
SLOT_TAGS = ("alpha", "stage", "contribution")
#: What each value of ``morpho/<slot>/stage`` means (the stage chart's title says it too).
STAGE_LEGEND = ", ".join(f"{s.value} {s.name.lower()}" for s in SeedStage if s.value)


def slot_layout(slot_ids: Sequence[str]) -> dict[str, dict[str, list[Any]]]:
    """A TensorBoard custom-scalars layout that groups ``morpho/<slot>/*`` per slot: one
    category per slot with one chart per tag, the stage chart titled with what each value
    means (``SummaryWriter.add_custom_scalars`` format; the tags are regular expressions, so a
    slot id's dots are escaped).

    Example:
        >>> slot_layout(["r0c1"])["morpho r0c1"]["alpha"]
        ['Multiline', ['morpho/r0c1/alpha']]
        >>> [title for title in slot_layout(["r0c1"])["morpho r0c1"]][1][:35]
        'stage (1 dormant, 2 germinated, 3 t'
    """
    titles = {"stage": f"stage ({STAGE_LEGEND})"}
    return {
        f"morpho {slot_id}": {
            titles.get(tag, tag): ["Multiline", [f"morpho/{re.escape(slot_id)}/{tag}"]]
            for tag in SLOT_TAGS
        }
        for slot_id in slot_ids
    }


def stage_changes(before: Mapping[str, SeedStage], slots: Mapping[str, SeedSlot],
                  when: str) -> list[str]:
    """One line per slot whose stage changed at the decision ``when`` names (``step 120``,
    ``epoch 4``), by name (``step 120: blocks.0+1 dormant -> blending (block_identity)``):
    what the callback writes as TensorBoard text, so a blend's start is an event a reader
    sees.

    Example:
        >>> slot = SeedSlot("s", channels=4)
        >>> _ = slot.germinate("norm")
        >>> stage_changes({"s": SeedStage.DORMANT}, {"s": slot}, "step 120")
        ['step 120: s dormant -> germinated (norm)']
    """
    lines = []
    for slot_id, slot in slots.items():
        if slot.stage != before[slot_id]:
            blueprint = f" ({slot.state.blueprint})" if slot.state is not None else ""
            lines.append(f"{when}: {slot_id} {before[slot_id].name.lower()} -> "
                         f"{slot.stage.name.lower()}{blueprint}")
    return lines
