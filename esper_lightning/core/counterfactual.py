"""Fused counterfactual evaluation: how much does each seed contribute right now?

One forward pass of the batch repeated K times, each copy with its own per-sample alphas:

* ``main``: every slot at its current alpha;
* ``off:<slot>``: that slot at alpha 0, the others unchanged (one per measured slot);
* ``all_off``: every measured slot at 0 (only when more than one slot is measured).

``contribution(slot) = acc(main) − acc(off:slot)`` in percentage points. A slot is measured when
its seed runs with alpha > 0 (BLENDING after the first tick, HOLDING, FOSSILIZED).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from esper_lightning.core.lifecycle import ACTIVE_STAGES
from esper_lightning.core.slots import SeedSlot

MAIN = "main"
ALL_OFF = "all_off"


@dataclass(frozen=True)
class CounterfactualPlan:
    """Which configurations to evaluate and each measured slot's alpha in each of them."""

    slot_ids: tuple[str, ...]
    configs: tuple[str, ...]
    alphas: Mapping[str, Tensor]  # slot id -> [K] alpha per configuration
    _per_sample: dict[tuple[int, str], dict[str, Tensor]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def size(self) -> int:
        return len(self.configs)

    def per_sample(self, batch: int, device: torch.device) -> dict[str, Tensor]:
        """Per-sample alphas ``[K*batch]`` per slot, built once per batch size and device (no
        host-to-device copy on every validation batch)."""
        key = (batch, str(device))
        if key not in self._per_sample:
            self._per_sample[key] = {
                sid: alphas.to(device).repeat_interleave(batch)
                for sid, alphas in self.alphas.items()
            }
        return self._per_sample[key]


def make_plan(slots: Mapping[str, SeedSlot]) -> CounterfactualPlan:
    """A plan over the slots whose seeds currently blend in (just ``main`` if there are none)."""
    measured = tuple(
        sid
        for sid, s in slots.items()
        if s.seed is not None and s.stage in ACTIVE_STAGES and s.alpha > 0.0
    )
    configs = [MAIN, *(f"off:{sid}" for sid in measured)]
    if len(measured) > 1:
        configs.append(ALL_OFF)
    alphas = {}
    for sid in measured:
        current = slots[sid].alpha
        alphas[sid] = torch.tensor(
            [0.0 if c in (f"off:{sid}", ALL_OFF) else current for c in configs]
        )
    return CounterfactualPlan(measured, tuple(configs), alphas)


def fused_forward(
    forward: Callable[[Tensor], Tensor],
    x: Tensor,
    slots: Mapping[str, SeedSlot],
    plan: CounterfactualPlan,
) -> Tensor:
    """Run ``forward`` once with every configuration; returns ``[K, B, ...]``.

    The batch is not repeated up front: the first measured slot the forward reaches sees
    per-sample alphas for ``K*B`` rows and fans the batch out there (configuration-major), so
    the host layers before it run once.
    """
    k, b = plan.size, x.shape[0]
    with ExitStack() as stack:
        for sid, per_sample in plan.per_sample(b, x.device).items():  # [K*B] each
            stack.enter_context(slots[sid].alpha_override(per_sample))
        out = forward(x)
    if out.shape[0] != k * b:
        raise RuntimeError(
            f"fused counterfactual: the forward returned {out.shape[0]} rows, expected {k}x{b}; "
            f"are the measured slots {list(plan.slot_ids)} in this forward's path?"
        )
    return out.view(k, b, *out.shape[1:])


class CounterfactualAccumulator:
    """Accumulates correct counts per configuration (and the main configuration's summed
    cross-entropy) over the validation batches of an epoch. Sums stay on the device of the
    logits: nothing is copied to the host until `read` (or `accuracies`) is called."""

    def __init__(self, plan: CounterfactualPlan) -> None:
        self.plan = plan
        self.correct: Tensor | None = None  # [K]
        self.loss_sum: Tensor | None = None  # scalar
        self.total = 0

    @torch.no_grad()
    def update(
        self,
        forward: Callable[[Tensor], Tensor],
        x: Tensor,
        y: Tensor,
        slots: Mapping[str, SeedSlot],
    ) -> None:
        logits = fused_forward(forward, x, slots, self.plan).float()  # [K, B, classes]
        hits = (logits.argmax(dim=-1) == y.unsqueeze(0)).sum(dim=1)  # [K]
        loss = F.cross_entropy(logits[0], y, reduction="sum")
        if self.correct is None or self.loss_sum is None:
            self.correct, self.loss_sum = hits, loss
        else:
            self.correct, self.loss_sum = self.correct + hits, self.loss_sum + loss
        self.total += int(y.shape[0])

    def read(self, extra: Tensor | None = None) -> tuple[dict[str, float], float, Tensor | None]:
        """Accuracy (percent) per configuration, mean main-configuration loss, and ``extra``
        (device values the caller wants back), all in one device-to-host transfer."""
        if self.correct is None or self.loss_sum is None:
            raise RuntimeError("no validation batch was accumulated")
        parts = [self.correct.double(), self.loss_sum.double().view(1)]
        if extra is not None:
            parts.append(extra.double().flatten())
        values = torch.cat(parts).cpu()
        k = self.plan.size
        accuracies = dict(zip(self.plan.configs, (100.0 * values[:k] / self.total).tolist(),
                              strict=True))
        rest = values[k + 1:] if extra is not None else None
        return accuracies, float(values[k]) / self.total, rest

    def accuracies(self) -> dict[str, float]:
        """Accuracy (percent) per configuration."""
        return {} if self.correct is None else self.read()[0]

    def contributions(self, accuracies: Mapping[str, float] | None = None) -> dict[str, float]:
        """acc(main) − acc(slot off), percentage points, per measured slot."""
        acc = self.accuracies() if accuracies is None else accuracies
        if not acc:
            return {}
        return {sid: acc[MAIN] - acc[f"off:{sid}"] for sid in self.plan.slot_ids}
