"""How the Trainer callbacks meter a training step: one function and one message for both.

The callback that owns the fit's `core.compute.ComputeLedger` charges every training step to it:
`ComputeBudget` when the fit has a budget, else `MorphogenesisCallback`. Both read a batch and
compute logits the growth callback's way when there is one (its ``batch_to_xy`` and
``logits_fn``: `MetersSteps`), so a step costs the same whoever charges it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor

from esper_lightning.core.compute import ComputeLedger, StepCost

__all__ = ["GrowsSteps", "MetersSteps", "metering_errors", "step_cost"]


@runtime_checkable
class MetersSteps(Protocol):
    """A callback that says how to read a training batch and compute logits."""

    batch_to_xy: Callable[[Any], tuple[Tensor, Any]]
    logits_fn: Callable[[L.LightningModule, Tensor], Tensor] | None


@runtime_checkable
class GrowsSteps(Protocol):
    """A callback that makes later training steps dearer (it grows the model)."""

    def step_cost_bound(self) -> float:
        """How many times this step's cost a later step of the fit can cost at most (``inf``:
        no bound known)."""
        ...


def step_cost(ledger: ComputeLedger, trainer: L.Trainer, pl_module: L.LightningModule,
              x: Tensor, logits_fn: Any, owner: str, remedy: str,
              param_groups: Iterable[dict[str, Any]] = ()) -> StepCost:
    """Training FLOPs of one step on inputs like ``x`` over every rank, the host's and its
    live seeds' (the ledger's meter, once per architecture; `ComputeLedger.begin_step`, which
    also sets the schedule's rate in ``param_groups``), or one line saying why ``pl_module``
    cannot be metered and ``remedy``."""
    key = (trainer.current_epoch, pl_module.training)
    with metering_errors(owner, pl_module, remedy):
        return ledger.begin_step(pl_module, x, logits_fn, key=key, param_groups=param_groups,
                                 ranks=trainer.world_size)



def check_metering_functions(batch_to_xy: Any, logits_fn: Any) -> None:
    """Refuse, in one line at construction, a ``batch_to_xy`` or ``logits_fn`` that is not a
    function (it failed at the first step's metering)."""
    for name, value in (("batch_to_xy", batch_to_xy), ("logits_fn", logits_fn)):
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be a function or None, got {value!r}")

@contextmanager
def metering_errors(owner: str, pl_module: L.LightningModule, remedy: str) -> Iterator[None]:
    """Whatever the meter raises inside, as the one line a user reads: ``owner`` cannot meter
    ``pl_module`` on meta tensors, the cause's first line, and ``remedy``."""
    try:
        yield
    except Exception as err:
        cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise MisconfigurationException(
            f"{owner} cannot meter the FLOPs of {type(pl_module).__name__} on meta tensors "
            f"({type(err).__name__}: {cause}); {remedy}") from err
