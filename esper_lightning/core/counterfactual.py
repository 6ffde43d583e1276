"""Counterfactual evaluation: how much does each seed contribute right now?

The model is evaluated in K configurations, each with its own alpha per measured slot:

* ``main``: every slot at its current alpha;
* ``off:<slot>``: that slot at alpha 0, the others unchanged (one per measured slot);
* ``all_off``: every measured slot at 0 (only when more than one slot is measured).

``contribution(slot) = acc(main) − acc(off:slot)`` in percentage points. A slot is measured when
its seed runs with alpha > 0 (BLENDING after the first tick, HOLDING, FOSSILIZED). Both
configurations score the same examples, so the contribution is a paired difference: its
standard error (`CounterfactualAccumulator.standard_errors`) comes from the examples the seed
turns right and turns wrong, and says how many examples a contribution rests on.

Whether a validation run measures at all depends on who reads it (`validation_plan`): a live
seed is always measured; fossils alone only for a controller that reads their contributions;
the host's accuracy alone only for one that reads the accuracy (`validation_reads`).

Two ways to run the K configurations give the same numbers:

* ``"separate"``: K forwards of the unchanged batch, each with scalar alpha overrides. It asks
  nothing of the model beyond "maps inputs to logits", so it is the safe choice for any module.
* ``"fused"``: one forward whose batch fans out K times at the first measured slot (per-sample
  alphas, `fused_forward`). The model must carry a batch that grows K-fold mid-forward: a
  forward that reads the batch size before the slot and reshapes with it afterwards breaks.

`DEFAULT_MODES` picks one per device type from `benchmarks/bench_counterfactual.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from esper_lightning.core.lifecycle import ACTIVE_STAGES, LIVE_STAGES
from esper_lightning.core.slots import SeedSlot

MAIN = "main"
ALL_OFF = "all_off"
PROBE = "probe"
#: Ways to run the configurations (see the module docstring).
MODES = ("separate", "fused")
#: The default mode per device type, from `benchmarks/bench_counterfactual.py` (docs/benchmarks.md):
#: separate passes won on the CPU. On an H200 fused won (0.31-0.90 of the time), but a growth slot
#: whose block takes other arguments cannot fan out, so CUDA keeps the mode every model can run.
DEFAULT_MODES = {"cpu": "separate", "cuda": "separate"}


class LogitsError(ValueError):
    """The forward's output cannot be read as logits for the class targets."""


def check_mode(mode: str) -> str:
    """``mode`` if it is one of `MODES`, else a one-line `ValueError`."""
    if mode not in MODES:
        raise ValueError(f"unknown counterfactual mode {mode!r}; accepted: {', '.join(MODES)}")
    return mode


def default_mode(device: torch.device | str) -> str:
    """The measured default mode for ``device`` (``"separate"`` for device types not measured).

    Example:
        >>> default_mode("cpu")
        'separate'
    """
    return DEFAULT_MODES.get(torch.device(device).type, "separate")


@dataclass(frozen=True)
class CounterfactualPlan:
    """Which configurations to evaluate and each measured slot's alpha in each of them."""

    slot_ids: tuple[str, ...]
    configs: tuple[str, ...]
    alphas: Mapping[str, Tensor]  # slot id -> [K] alpha per configuration
    _per_sample: dict[tuple[int, str], dict[str, Tensor]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _scalars: dict[tuple[int, str], dict[str, Tensor]] = field(
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

    def scalars(self, config: int, device: torch.device) -> dict[str, Tensor]:
        """0-dim alphas per slot for configuration ``config`` (an index into `configs`), built
        once per device: the batch keeps its shape."""
        key = (config, str(device))
        if key not in self._scalars:
            self._scalars[key] = {sid: a[config].to(device) for sid, a in self.alphas.items()}
        return self._scalars[key]


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


#: What a controller's decisions may read of a validation run: the host's accuracy, and the
#: counterfactual contributions of seeds that are no longer live (fossils). A live seed's
#: contribution is always measured: the lifecycle is about it.
ACCURACY, FOSSIL_CONTRIBUTIONS = "accuracy", "fossil_contributions"
VALIDATION_READS = frozenset({ACCURACY, FOSSIL_CONTRIBUTIONS})

def validation_reads(controller: object) -> frozenset[str]:
    """What ``controller`` reads of a validation run (a subset of `VALIDATION_READS`): its
    ``validation_reads`` attribute (the built-in controllers say theirs: the heuristic tracks
    the accuracy and reads HOLDING seeds' contributions only; a policy observes every present
    seed's contribution, as in the env it was trained in; the growth schedules, baselines and
    scripts read neither), else everything: a controller that does not say is measured as
    before.

    Example:
        >>> sorted(validation_reads(object()))
        ['accuracy', 'fossil_contributions']
    """
    reads = getattr(controller, "validation_reads", None)
    if reads is None:
        return VALIDATION_READS
    reads = frozenset(reads)
    if not reads <= VALIDATION_READS:
        raise ValueError(f"{type(controller).__name__}.validation_reads names "
                         f"{sorted(reads - VALIDATION_READS)}; accepted: "
                         f"{', '.join(sorted(VALIDATION_READS))}")
    return reads


def validation_plan(slots: Mapping[str, SeedSlot],
                    reads: frozenset[str]) -> tuple[CounterfactualPlan | None, bool]:
    """What a validation run must measure for a reader of ``reads`` (`validation_reads`), as
    ``(plan, accuracy_only)``:

    * a measured slot holds a live seed: every measured slot (`make_plan`), fossils included;
    * else fossils are measured and their contributions are read: the same plan;
    * else the accuracy is read: the main configuration alone, ``accuracy_only`` (one forward a
      batch, which a logged accuracy makes unnecessary: the caller knows whether it is logged);
    * else None: no forward at all.
    """
    plan = make_plan(slots)
    live = any(slots[sid].stage in LIVE_STAGES for sid in plan.slot_ids)
    if live or (plan.slot_ids and FOSSIL_CONTRIBUTIONS in reads):
        return plan, False
    if ACCURACY in reads:
        return make_plan({}), True
    return None, False


def probe_plan(slots: Mapping[str, SeedSlot]) -> CounterfactualPlan:
    """Two configurations that override every slot at its current alpha (the outputs equal an
    ordinary forward's). A fused pass fans the batch out at the first slot the forward reaches,
    seed or not, so one call checks what a later measurement will need of the model."""
    alphas = {sid: torch.tensor([s.alpha, s.alpha]) for sid, s in slots.items()}
    return CounterfactualPlan(tuple(slots), (MAIN, PROBE), alphas)


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
    _check_tensor(out)
    if out.shape[0] != k * b:
        raise RuntimeError(
            f"fused counterfactual: the forward returned {out.shape[0]} rows, expected {k}x{b}; "
            f"are the measured slots {list(plan.slot_ids)} in this forward's path?"
        )
    return out.view(k, b, *out.shape[1:])


def separate_forward(
    forward: Callable[[Tensor], Tensor],
    x: Tensor,
    slots: Mapping[str, SeedSlot],
    plan: CounterfactualPlan,
) -> Tensor:
    """Run ``forward`` once per configuration on the unchanged batch, with scalar alpha
    overrides; returns ``[K, B, ...]`` like `fused_forward`."""
    outputs = []
    for k in range(plan.size):
        with ExitStack() as stack:
            for sid, alpha in plan.scalars(k, x.device).items():
                stack.enter_context(slots[sid].alpha_override(alpha))
            out = forward(x)
        outputs.append(_check_tensor(out))
    return torch.stack(outputs)


def evaluate(
    forward: Callable[[Tensor], Tensor],
    x: Tensor,
    slots: Mapping[str, SeedSlot],
    plan: CounterfactualPlan,
    mode: str,
) -> Tensor:
    """Logits ``[K, B, ...]`` of every configuration of ``plan``, run the ``mode`` way."""
    run = fused_forward if check_mode(mode) == "fused" else separate_forward
    return run(forward, x, slots, plan)


def _check_tensor(out: object) -> Tensor:
    if not isinstance(out, Tensor):
        raise LogitsError(f"the forward returned a {type(out).__name__}, not a logits tensor")
    return out


def flat_logits(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``[K, B, ..., C]`` logits and ``[B, ...]`` class targets as ``[K, N, C]`` and ``[N]``
    (a token-level classifier counts every token)."""
    if logits.dim() < 3 or tuple(logits.shape[1:-1]) != tuple(y.shape):
        raise LogitsError(
            f"logits of shape {tuple(logits.shape[1:])} do not match class targets of shape "
            f"{tuple(y.shape)}; expected logits [B, ..., classes] for targets [B, ...]"
        )
    if y.is_floating_point() or y.is_complex():
        raise LogitsError(f"targets must be class indices (an integer tensor), got {y.dtype}")
    if logits.shape[-1] < 2:
        raise LogitsError(f"logits of shape {tuple(logits.shape[1:])} score one class; a "
                          f"classifier's logits have a column per class")
    return logits.reshape(logits.shape[0], -1, logits.shape[-1]), y.reshape(-1)


class CounterfactualAccumulator:
    """Accumulates correct counts per configuration (and the main configuration's summed
    cross-entropy) over the validation batches of an epoch, and per measured slot the examples
    its seed turns right (main right, slot off wrong) and turns wrong (the reverse). Sums stay
    on the device of the logits: nothing is copied to the host until `read` (or `accuracies`)
    is called.

    Args:
        plan: the configurations (`make_plan`).
        mode: ``"separate"`` or ``"fused"``; None picks `default_mode` of the first batch's
            device.

    Example:
        >>> acc = CounterfactualAccumulator(make_plan(model.slots))  # doctest: +SKIP
        >>> acc.update(model, x, y, model.slots)  # doctest: +SKIP
        >>> acc.contributions()  # doctest: +SKIP
        {'r0c1': 1.25}
    """

    def __init__(self, plan: CounterfactualPlan, mode: str | None = None) -> None:
        self.plan = plan
        self.mode = None if mode is None else check_mode(mode)
        self.correct: Tensor | None = None  # [K]
        self.loss_sum: Tensor | None = None  # scalar
        self.flips: Tensor | None = None  # [S, 2]: turned right, turned wrong, per slot
        self.total = 0

    @torch.no_grad()
    def update(
        self,
        forward: Callable[[Tensor], Tensor],
        x: Tensor,
        y: Tensor,
        slots: Mapping[str, SeedSlot],
    ) -> None:
        if self.mode is None:
            self.mode = default_mode(x.device)
        logits = evaluate(forward, x, slots, self.plan, self.mode)  # [K, B, ..., classes]
        logits, targets = flat_logits(logits.float(), y)  # [K, N, classes], [N]
        right = logits.argmax(dim=-1) == targets.unsqueeze(0)  # [K, N]
        hits = right.sum(dim=1)  # [K]
        off = right[1:1 + len(self.plan.slot_ids)]  # [S, N]: configs are main, off:<slot>...
        flips = torch.stack([(right[0] & ~off).sum(dim=1), (~right[0] & off).sum(dim=1)], 1)
        loss = F.cross_entropy(logits[0], targets, reduction="sum")
        if self.correct is None or self.loss_sum is None or self.flips is None:
            self.correct, self.loss_sum, self.flips = hits, loss, flips
        else:
            self.correct, self.loss_sum = self.correct + hits, self.loss_sum + loss
            self.flips = self.flips + flips
        self.total += int(targets.shape[0])

    def reduce(self, all_reduce: Callable[[Tensor], Tensor], device: torch.device) -> None:
        """Sum this accumulator with the other processes' (data-parallel validation): correct
        counts, loss sum and total of every rank, in one collective. Sums, not ratios, so the
        accuracies are those of the whole validation set however it was sharded.

        ``all_reduce`` sums a tensor over the ranks and returns the sum; every rank must call
        this, also one that saw no batch (its part is zero). Counts travel as float64, exact
        below 2**53.
        """
        k, s = self.plan.size, len(self.plan.slot_ids)
        # [correct..., loss, n, flips...]
        packed = torch.zeros(k + 2 + 2 * s, dtype=torch.float64, device=device)
        if self.correct is not None and self.loss_sum is not None and self.flips is not None:
            packed[:k], packed[k] = self.correct, self.loss_sum
            packed[k + 2:] = self.flips.flatten()
        packed[k + 1] = self.total
        packed = all_reduce(packed)
        self.total = int(packed[k + 1].item())
        if self.total > 0:
            self.correct, self.loss_sum = packed[:k].round().long(), packed[k]
            self.flips = packed[k + 2:].round().long().view(s, 2)

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

    def standard_errors(self) -> dict[str, float]:
        """The standard error of each measured slot's contribution, percentage points.

        The contribution is the mean of a paired difference over the ``n`` validation examples
        (+1 where the seed turns an example right, −1 where it turns one wrong, 0 elsewhere),
        so its standard error is ``100 * sqrt(r + w − (r − w)² / n) / n`` with ``r`` and ``w``
        those counts (the sample standard deviation's ``n`` denominator; zero when the seed
        changes no example). With 40 examples one example is 2.5 points. A token-level
        classifier's examples are its tokens, which are not independent within a sequence:
        there the standard error is a lower bound.

        Example:
            >>> plan = CounterfactualPlan(("r0c0",), ("main", "off:r0c0"), {})
            >>> acc = CounterfactualAccumulator(plan)
            >>> acc.flips, acc.total = torch.tensor([[3, 1]]), 40  # 3 turned right, 1 wrong
            >>> round(acc.standard_errors()["r0c0"], 3)  # of a contribution of 5 points
            4.937
        """
        if self.flips is None or self.total == 0:
            return {}
        n = self.total
        counts = self.flips.tolist()  # [S, 2], one small transfer a validation run
        return {sid: 100.0 * math.sqrt(max(0.0, up + down - (up - down) ** 2 / n)) / n
                for sid, (up, down) in zip(self.plan.slot_ids, counts, strict=True)}
