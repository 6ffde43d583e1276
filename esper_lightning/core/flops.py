"""FLOPs of training and validation, measured by PyTorch's own counter, once per architecture.

`FlopMeter` counts what a step costs with `torch.utils.flop_counter.FlopCounterMode` (matrix
products, convolutions, attention; elementwise work is not counted, as in every FLOP budget of
the literature), never with a hand-written formula, so a new host or blueprint needs no code
here. The measurement runs **on meta tensors**: the module's parameters and buffers are swapped
for meta copies of the same shapes (`torch.func.functional_call`), the input becomes a meta
tensor, and a forward and its backward run without touching a byte of real data. So metering
cannot change training: no real weight, buffer (BatchNorm statistics) or gradient is read or
written, no kernel runs and no random number is drawn; and it costs one meta forward/backward
per *architecture signature* (`signature`: every parameter's shape and ``requires_grad``, what
each slot's seed runs (`slot_signature`), the train/eval mode and the batch's shape),
cached for the rest of the run; a step then costs one dictionary lookup. A deep copy would cost
a copy of every weight, and a copy of a LightningModule drags its Trainer along.

Attention is counted under the math SDPA backend (`SDPBackend.MATH`): the counter has no
formula for the CPU's fused attention kernel and would count it as 0, while the math backend
spells attention as the two batched matrix products it is (``Q Kᵀ`` and ``A V``, 4·B·T²·D per
layer forward; causal attention is counted over the full T×T square, the usual convention).
The backend only applies to the meta pass: training keeps whatever kernel it uses.

A training step's backward is counted as the gradient of the summed output with respect to
every parameter that requires one (what ``loss.backward()`` computes: the loss's own
elementwise gradient holds no matrix product), so the count does not depend on the loss.

`FlopMeter.host_step` counts the same step with every *live* seed off (`live_slots`: germinated,
running, not yet fossilized): the step of the model as if those seeds had never germinated, so
its signature (`host_structure`) is the one that model had, and a host measured before a
germination is not measured again while the seed is judged. A step's cost minus that is what
its live seeds add (`core.compute.StepCost`, the ledger's ``growth``).

Example:
    >>> from torch import nn
    >>> meter = FlopMeter()
    >>> layer = nn.Linear(64, 32)
    >>> meter.training_step(layer, torch.zeros(8, 64))  # forward 2·8·64·32, the weight grad as much
    65536
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from esper_lightning.core.counterfactual import CounterfactualPlan, evaluate
from esper_lightning.core.lifecycle import ACTIVE_STAGES, LIVE_STAGES, SeedStage
from esper_lightning.core.slots import SeedSlot

Forward = Callable[[nn.Module, Tensor], Tensor]


def _call(module: nn.Module, x: Tensor) -> Tensor:
    return module(x)  # type: ignore[no-any-return]


class _Apply(nn.Module):
    """``forward(module, x)`` as a module, so `functional_call` can swap the module's tensors
    while any callable (a ``logits_fn``) runs it."""

    def __init__(self, module: nn.Module, forward: Forward) -> None:
        super().__init__()
        self.inner = module
        self.fn = forward

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self.inner, x)


def slot_signature(slot: SeedSlot) -> tuple[Any, ...]:
    """What of a slot shapes the counted graph of a step: whether its seed runs (an active
    stage), whether it runs as an incubator (TRAINING) or blends, whether its input is
    detached, its blend algorithm and whether a gate runs. Not the stage itself: BLENDING,
    HOLDING and FOSSILIZED seeds run the same matrix products (`SeedSlot.forward` differs
    between them in elementwise work only, which is not counted), so a seed's stage changes
    cost no new meta pass; nor alpha's value."""
    blend, stage = slot.blend, slot.stage
    runs = slot.seed is not None and stage in ACTIVE_STAGES
    role = "off" if not runs else "incubate" if stage == SeedStage.TRAINING else "blend"
    return (slot.slot_id, role, runs and slot._isolated(stage),
            None if blend is None else int(blend.algorithm), slot.gate is not None)


def _empty_signature(slot: SeedSlot) -> tuple[Any, ...]:
    """`slot_signature` of ``slot`` before its first germination: no seed runs, no blend is
    set, no gate is built."""
    return (slot.slot_id, "off", False, None, False)


def structure(module: nn.Module, off: Sequence[SeedSlot] = ()) -> tuple[Any, ...]:
    """What of a module's architecture shapes a step's graph: every parameter's shape and
    ``requires_grad``, every `SeedSlot`'s `slot_signature` and the train/eval mode. Reading it
    costs tens of microseconds, so a caller that knows the architecture cannot have changed
    (an env within an epoch) reads it once and passes it on. The slots ``off`` are read as if
    they had never germinated (`host_structure`): signed as empty, their seeds' and gates'
    parameters left out."""
    grown = {id(p) for slot in off for part in (slot.seed, slot.gate) if part is not None
             for p in part.parameters()}
    empty = {id(slot) for slot in off}
    params = tuple((tuple(p.shape), p.requires_grad) for p in module.parameters()
                   if id(p) not in grown)
    slots = tuple(_empty_signature(m) if id(m) in empty else slot_signature(m)
                  for m in module.modules() if isinstance(m, SeedSlot))
    return (module.training, params, slots)


#: Stages of a seed that runs in a step and is still judged: its cost is growth (`live_slots`).
_RUNS_LIVE = ACTIVE_STAGES & LIVE_STAGES


def live_slots(module: nn.Module) -> list[SeedSlot]:
    """The slots of ``module`` whose seed runs in a step and is not yet fossilized (TRAINING,
    BLENDING, HOLDING): the seeds a user pays for while they are judged. A germinated seed
    does not run yet; a fossilized one is the host's."""
    return [m for m in module.modules() if isinstance(m, SeedSlot) and m.seed is not None
            and m.stage in _RUNS_LIVE]


def host_structure(module: nn.Module, arch: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """The `structure` of ``module`` with every live seed off (`live_slots`): without the live
    seeds' and their gates' parameters, each such slot signed as an empty one (what it was
    before its germination), so the host measured before a germination is found in the cache.
    ``arch`` (the module's `structure`, when the caller read it) is returned itself when no
    seed is live: the host is the whole model."""
    live = live_slots(module)
    if not live:
        return structure(module) if arch is None else arch
    return structure(module, off=live)


def signature(module: nn.Module, x: Tensor, kind: str, extra: Hashable = None,
              arch: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """The architecture signature of one measurement (see the module docstring): the module's
    `structure` (``arch`` when the caller read it already), the batch's shape and dtype, what
    is measured (``kind``) and how (``extra``)."""
    return (kind, structure(module) if arch is None else arch, tuple(x.shape), x.dtype, extra)


class FlopMeter:
    """Measures the FLOPs of a module's training step, forward or counterfactual validation on
    meta tensors, once per `signature`, and caches them (module docstring).

    ``forward(module, x)`` is how logits are computed (default ``module(x)``); a module that
    cannot run on meta tensors (data-dependent Python control flow, ``.item()``) raises here.

    Attributes:
        measurements: meta passes run so far (each new signature costs one).
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], int] = {}
        self.measurements = 0

    def training_step(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                      arch: tuple[Any, ...] | None = None) -> int:
        """Forward and backward FLOPs of one training step on a batch shaped like ``x``
        (``arch``: the module's `structure`, when the caller read it already)."""
        key = signature(module, x, "train", arch=arch)
        if key not in self._cache:
            self._cache[key] = self._measure(module, x, forward or _call, backward=True)
        return self._cache[key]

    def host_step(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                  arch: tuple[Any, ...] | None = None) -> int:
        """Forward and backward FLOPs of one training step with every live seed off (module
        docstring; ``arch``: the module's `host_structure`, when the caller read it). Without
        a live seed, `training_step` itself (one cache entry)."""
        arch = host_structure(module) if arch is None else arch
        key = signature(module, x, "train", arch=arch)
        if key not in self._cache:
            with _seeds_off(live_slots(module)):
                self._cache[key] = self._measure(module, x, forward or _call, backward=True)
        return self._cache[key]

    def forward(self, module: nn.Module, x: Tensor, forward: Forward | None = None,
                arch: tuple[Any, ...] | None = None) -> int:
        """FLOPs of one forward without gradients (a validation batch)."""
        key = signature(module, x, "forward", arch=arch)
        if key not in self._cache:
            self._cache[key] = self._measure(module, x, forward or _call, backward=False)
        return self._cache[key]

    def counterfactual(self, module: nn.Module, x: Tensor, slots: Mapping[str, SeedSlot],
                       plan: CounterfactualPlan, mode: str, forward: Forward | None = None,
                       arch: tuple[Any, ...] | None = None) -> int:
        """FLOPs of evaluating every configuration of ``plan`` on a batch like ``x`` the
        ``mode`` way (`core.counterfactual.evaluate`); a plan of the main configuration alone
        is one `forward`, and so is each configuration of a ``"separate"`` plan whose measured
        slots all blend: an alpha override changes what such a slot blends with, elementwise,
        never which matrix products run (an incubating slot's differs: its override blends
        where the plain forward hands the activation on, with a gate's products, so it is
        measured)."""
        if plan.size == 1:
            return self.forward(module, x, forward, arch)
        if mode == "separate" and all(slot_signature(slots[sid])[1] == "blend"
                                      for sid in plan.slot_ids):
            return plan.size * self.forward(module, x, forward, arch)
        key = signature(module, x, "counterfactual", (plan.configs, mode), arch)
        if key not in self._cache:
            fn = forward or _call

            def run(m: nn.Module, xm: Tensor) -> Tensor:
                return evaluate(lambda inputs: fn(m, inputs), xm, slots, plan, mode)

            self._cache[key] = self._measure(module, x, run, backward=False)
        return self._cache[key]

    def _measure(self, module: nn.Module, x: Tensor, forward: Forward, backward: bool) -> int:
        self.measurements += 1
        wrapper = _Apply(module, forward)
        state, leaves = _meta_state(wrapper)
        xm = torch.empty_like(x, device="meta")
        counter = FlopCounterMode(display=False)
        grad = torch.enable_grad() if backward else torch.no_grad()
        with grad, counter, sdpa_kernel(SDPBackend.MATH):
            out = functional_call(wrapper, state, (xm,), tie_weights=True)
            trainable = [t for t in leaves if t.requires_grad]
            if backward and trainable and out.requires_grad:
                torch.autograd.grad(out.float().sum(), trainable, allow_unused=True)
        return int(counter.get_total_flops())


@contextmanager
def _seeds_off(slots: list[SeedSlot]) -> Iterator[None]:
    """Each of ``slots`` without its seed for the block (it hands its activation on, as an
    empty slot does), put back after it, whatever the block raised: only a meta pass runs
    inside, so nothing real sees the seeds gone."""
    seeds = [slot.seed for slot in slots]
    try:
        for slot in slots:
            slot.seed = None
        yield
    finally:
        for slot, seed in zip(slots, seeds, strict=True):
            slot.seed = seed


def _meta_state(module: nn.Module) -> tuple[dict[str, Tensor], list[Tensor]]:
    """Meta copies of every parameter and buffer by name (a tied weight stays one tensor),
    and the parameter copies."""
    copies: dict[int, Tensor] = {}
    state: dict[str, Tensor] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in copies:
            copies[id(p)] = torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
        state[name] = copies[id(p)]
    leaves = list(copies.values())
    for name, b in module.named_buffers(remove_duplicate=False):
        state[name] = torch.empty_like(b, device="meta")
    return state, leaves


__all__ = ["FlopMeter", "host_structure", "live_slots", "signature", "slot_signature",
           "structure"]
