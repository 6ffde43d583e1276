"""The governor's rollback, carried out in place: the one routine both adapters call.

`GovernorCallback` (in a Trainer) and `MorphogenesisEnv` (in PPO and `compare`) decide
*when* to roll back with the same `Governor`; `roll_back` is *how*, in this order:

1. prune every live seed: through the lifecycle's owner when there is one (its engine's
   ``prune_live``, which records the prunes as lifecycle events, starts the embargo and drops
   the pruned seeds' optimizer param groups and their state); without one (a Trainer with a
   governor but no `MorphogenesisCallback`) the slots are pruned directly. Slot manifests are
   never loaded back from the snapshot: that would resurrect the pruned seeds;
2. restore the snapshot in place (`restore_snapshot`): host and fossilized-seed weights into the
   same Parameter objects, the optimizer state exactly as captured (every other parameter's
   state cleared), the grad scaler's state; param-group hyperparameters are left alone, because
   an LR scheduler is not part of the snapshot;
3. drop the accumulated gradients (``set_to_none``): they belong to the diverged weights;
4. count the rollback on the governor (its loss history is kept, `Governor.record_rollback`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from esper_lightning.core.divergence import Governor
from esper_lightning.core.slots import find_slots, prune_live
from esper_lightning.core.snapshot import Snapshot, restore_snapshot


def roll_back(
    snapshot: Snapshot | None,
    model: nn.Module,
    governor: Governor,
    reason: str,
    *,
    prune: Callable[[str], list[str]] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any | None = None,
) -> list[str]:
    """Roll ``model`` back to ``snapshot`` in place (module docstring); returns the ids of the
    slots whose seeds were pruned.

    Args:
        snapshot: from `take_snapshot` with the same optimizer and scaler (or neither).
        model: the host holding the slots (the engine's host when there is an engine).
        governor: counts the rollback.
        reason: why (the governor's reason), recorded on every pruned seed.
        prune: how the owner of the slots' lifecycle prunes every live seed (an engine's
            ``prune_live``), if there is one.
        optimizer: the bare optimizer the snapshot captured (not a Lightning or Fabric wrapper).
        scaler: the grad scaler the snapshot captured.

    Raises:
        RuntimeError: there is no snapshot yet (a panic before the first one was taken).

    Example:
        >>> from esper_lightning.core.snapshot import take_snapshot
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> governor, snapshot = Governor(), take_snapshot(model)
        >>> with torch.no_grad():
        ...     _ = model[0].weight.add_(1.0)
        >>> roll_back(snapshot, model, governor, "governor_nan")
        []
        >>> governor.rollbacks, torch.equal(model[0].weight, snapshot.tensors["0.weight"])
        (1, True)
    """
    if snapshot is None:
        raise RuntimeError(f"governor panic ({reason}) before any snapshot was taken")
    slots = find_slots(model).values()
    pruned = prune(reason) if prune is not None else prune_live(slots, reason)
    restore_snapshot(snapshot, model, optimizer, scaler)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    governor.record_rollback()
    return pruned
