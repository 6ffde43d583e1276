"""Which live seeds went non-finite in a training step, and whether they spoiled the host's.

`MorphogenesisEngine.prune_nonfinite` asks these after backward and before the optimizer steps:
`read_flags` reads every live seed's flags back from the device in one transfer, `blamed_seeds`
decides which seeds caused them (never one that was handed inf or NaN by the host, nor an
incubating seed whose gradients are NaN because the host's are: a diverging host is the
governor's), and `gradients_nonfinite` says whether the rest of the model's gradients are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from esper_lightning.core.lifecycle import SeedStage

#: Sums a flag tensor over the data-parallel ranks (None: one process).
Reduce = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass(frozen=True)
class SeedFlags:
    """What one live seed did in the step: a non-finite output from a finite input, a
    non-finite input, non-finite gradients (every rank's, summed)."""

    output: bool
    given: bool
    gradients: bool


def nonfinite(grads: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Whether any of ``grads`` holds an inf or NaN (a bool tensor on their device, no sync;
    None without gradients). Their largest magnitudes are compared, which never overflow as a
    sum of squares might in half precision."""
    if not grads:
        return None
    peaks = torch._foreach_norm(list(grads), float("inf"))
    return ~torch.isfinite(torch.stack([p.float() for p in peaks])).all()


def read_flags(live: Sequence[nn.Module], reduce: Reduce) -> list[SeedFlags] | None:
    """Every live seed's flags (`SeedSlot.take_nonfinite`, its gradients) in one read from the
    device; None when no seed ran in a training forward."""
    pairs = []
    for slot in live:
        grads = [p.grad for p in slot.seed_parameters() if p.grad is not None]
        pairs.append((slot.take_nonfinite(), nonfinite(grads)))
    present = [f for pair in pairs for f in pair if f is not None]
    if not present:  # no seed ran in a training forward (GERMINATED only)
        return None
    device = present[0].device
    parts = []
    for forward, grads in pairs:  # [output, input, gradients] per slot
        parts.append(torch.zeros(2, dtype=torch.bool, device=device) if forward is None
                     else forward.to(device))
        parts.append((torch.zeros((), dtype=torch.bool, device=device) if grads is None
                      else grads.to(device)).view(1))
    vector = torch.cat(parts)
    read = (vector if reduce is None else reduce(vector.float())).tolist()  # the one sync
    return [SeedFlags(bool(read[i]), bool(read[i + 1]), bool(read[i + 2]))
            for i in range(0, len(read), 3)]


def gradients_nonfinite(model: nn.Module, live: Sequence[nn.Module], reduce: Reduce) -> bool:
    """Whether the gradients of the model outside the live seeds hold an inf or NaN on any
    rank."""
    seeds = {id(p) for slot in live for p in slot.seed_parameters()}
    flag = nonfinite([p.grad for p in model.parameters()
                      if id(p) not in seeds and p.grad is not None])
    if flag is None:
        return False
    flag = flag.float()
    return bool(flag if reduce is None else reduce(flag))


def blamed_seeds(live: Sequence[nn.Module], flags: Sequence[SeedFlags], scaled: bool,
                 host_nonfinite: Callable[[], bool]) -> list[nn.Module]:
    """The seeds that spoiled the step: a non-finite output from a finite input, or
    non-finite gradients when the host's are finite or the seed is in the host's forward
    (BLENDING, HOLDING) and no loss scaler owns the gradients (under one, gradients non-finite
    everywhere may be its overflow). ``host_nonfinite`` is asked at most when needed."""
    blamed = []
    for slot, flag in zip(live, flags, strict=True):
        if flag.given:  # the host handed it inf or NaN
            continue
        in_forward = slot.stage != SeedStage.TRAINING
        if flag.output or (flag.gradients and (not host_nonfinite()
                                               or (in_forward and not scaled))):
            blamed.append(slot)
    return blamed
