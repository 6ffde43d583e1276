"""Scripted depth growth: grow a model deeper at fixed fractions of the run, and its baselines.

`StackController` grows a model in its growth slots (`core.depth.DepthGrowth`, or a
`GPTHost`'s ``r1c*``) once fraction ``tau`` of the run is spent (`EpochReport.spent_fraction`:
the compute budget's fraction under a budget, else the epochs done over the planned ones), with
the seeds of one growth operator (``copy``, ``identity``, ``random``, or one registered:
`blueprints.growth`). It is the scripted schedule growth is measured with: a learned or
compute-aware controller has to beat "stack at tau".

Growth seeds need no incubation, so a germination at the first decision whose report has
``spent_fraction >= tau`` puts the seed in BLENDING at once. The lag from that decision to
training at full depth, alpha 1:

* an operator that preserves the function (``identity``): none; alpha is 1 from the next
  training step (blend tempo 0), and the model's function is unchanged at birth;
* any other (``copy``, ``random``): one decision; the next epoch trains at alpha 1/2 and the one
  after at 1 (blend tempo 2).

Before that, tau itself is read at decisions: growth starts at the first decision at or past it,
less than one decision's slice of the run late. The seed moves to HOLDING at the first decision
with its blend complete and is fossilized at the next (neither changes the function nor the
cost). With several growth slots it germinates one seed per decision, in order (a blending seed
does not stop the next germination); with one ``tau`` per slot (``tau=(0.2, 0.5)`` on
``DepthGrowth(blocks=(1, 2))``: one block to two at a fifth of the run, to four at half) slot
``k`` waits for its own.

The comparison harness (the ``lab`` extra) writes it ``stack:K@TAU[:OPERATOR]`` and the host
born that deep ``born:K``: that grammar lives with the harness (`app.compare.stack_arms`), not
here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

from esper_lightning.blueprints import available
from esper_lightning.blueprints.growth import growth_blueprint, operator_of, operators
from esper_lightning.controllers.base import (
    WAIT,
    BlueprintCheck,
    ControllerBase,
    check_named_blueprint,
    check_state,
    state_header,
)
from esper_lightning.core.actions import Action, LifecycleOp, Tempo, canonicalize
from esper_lightning.core.lifecycle import SeedStage, blend_complete
from esper_lightning.core.report import EpochReport
from esper_lightning.errors import ConfigError

_KIND = "stack"
#: A growth time of 1 (a later slot's): that slot never grows (``stack:4@0.3,1``: 1 -> 2 only).
NEVER = 1.0
#: What it does first, for the first of its slots in order where the masks allow it: finish an
#: incubation (a seed of a checkpoint from before block seeds skipped it), germinate the next
#: seed (a blending seed does not stop it), then move blended seeds on and keep them.
_ORDER: tuple[tuple[LifecycleOp, frozenset[SeedStage]], ...] = (
    (LifecycleOp.ADVANCE, frozenset({SeedStage.GERMINATED, SeedStage.TRAINING})),
    (LifecycleOp.GERMINATE, frozenset({SeedStage.DORMANT})),
    (LifecycleOp.ADVANCE, frozenset({SeedStage.BLENDING})),
    (LifecycleOp.FOSSILIZE, frozenset({SeedStage.HOLDING})),
)


class StackController(ControllerBase):
    """Grow in every growth slot at fraction ``tau`` of the run, as fast as the lifecycle allows.

    Until ``report.spent_fraction >= tau`` it waits. Then, one action per decision, it
    germinates a seed of ``operator`` in each growth slot in order (straight to BLENDING:
    growth seeds need no incubation), advances each to HOLDING once blended and fossilizes it.
    With one seed (``DepthGrowth(blocks=3)``, ``grow4``) that is germinate, then (after the
    blend: none for ``identity``, one decision otherwise) advance, then fossilize; the module
    docstring gives the lag to full depth.

    Growth chains: each seed is made from the blocks before its slot, those grown in an earlier
    slot included, so with ``DepthGrowth(blocks=(1, 2))`` and ``copy`` the second event copies
    the first block and the block it grew.

    Args:
        tau: Fraction of the run in [0, 1) after which it grows, or one per growth slot (non-
            decreasing): slot ``k`` waits for ``tau[k]``, and a later slot's 1 never comes (the
            model stops growing before that slot: ``(0.3, 1)`` grows once).
        operator: A growth operator (`blueprints.growth.operators`: ``copy``, ``identity``,
            ``random``, ...).
        slots: Growth slot ids to grow in, in this order; None: every growth slot of the run
            in action order.

    Raises:
        ConfigError: A ``tau`` outside [0, 1) or decreasing, an unknown operator, or (at the
            first decision) slots that are not growth slots of the run.

    Example:
        >>> controller = StackController(tau=0.5, operator="identity")
        >>> controller.blueprint
        'block_identity'
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads: frozenset[str] = frozenset()

    def __init__(self, tau: float | Sequence[float], operator: str = "copy",
                 slots: Sequence[str] | None = None) -> None:
        taus = _taus(tau)
        numbers = all(isinstance(t, Real) and not isinstance(t, bool) for t in taus)
        if (not taus or not numbers or not 0.0 <= taus[0] < NEVER
                or not all(0.0 <= t <= NEVER for t in taus)):
            raise ConfigError(f"stack: tau must be in [0, 1) (or a list of such, a later slot's "
                              f"may be 1: never), got {tau!r}")
        if list(taus) != sorted(taus):
            raise ConfigError(f"stack: the taus of successive growth slots must not decrease, "
                              f"got {list(taus)}")
        if operator not in operators():
            raise ConfigError(f"stack: unknown growth operator {operator!r}; accepted: "
                              f"{', '.join(operators())}")
        self.taus = tuple(float(t) for t in taus)
        self.operator = operator
        self.blueprint = growth_blueprint(operator)
        self.slots = None if slots is None else (slots,) if isinstance(slots, str) else tuple(slots)
        if self.slots is not None and len(self.taus) not in (1, len(self.slots)):
            raise ConfigError(f"stack: {len(self.taus)} taus for {len(self.slots)} slots; give "
                              "one tau, or one per slot")
        self._blueprint_check = BlueprintCheck()

    @property
    def tau(self) -> float:
        """When growth starts (the first slot's tau)."""
        return self.taus[0]

    def decide(self, report: EpochReport) -> Action:
        self._blueprint_check(self, report)
        action, self.last_reason = self._rule(report)
        return action

    def next_decision(self, report: EpochReport) -> float | None:
        """Due at the next step while a growth event is under way (something to do now, or a
        blend ramping: its alpha moves once per decision), else at the next ``tau`` still
        ahead (`SchedulesDecisions`); None once every growth slot has grown."""
        action, _ = self._rule(report)
        fraction = self._fraction(report)
        indices = self._slot_indices(report)
        ramping = any(report.slots[i].stage == SeedStage.BLENDING for i in indices)
        if action.op != LifecycleOp.WAIT or ramping:
            return fraction
        ahead = [self._tau_of(k) for k, i in enumerate(indices)
                 if report.slots[i].stage == SeedStage.DORMANT
                 and fraction < self._tau_of(k) < NEVER]
        return min(ahead, default=None)

    def _fraction(self, report: EpochReport) -> float:
        fraction = report.spent_fraction
        if fraction is None:
            raise ConfigError(f"stack: growth at tau={self.tau} needs a compute budget or a "
                              "planned run length (max_steps, max_epochs or max_time), and this "
                              "run has none")
        return fraction

    def _rule(self, report: EpochReport) -> tuple[Action, str]:
        """The action ``report`` calls for and why (no side effect: `next_decision` asks it
        too)."""
        fraction = self._fraction(report)
        indices = self._slot_indices(report)
        due = [i for k, i in enumerate(indices)
               if self._tau_of(k) < NEVER and fraction >= self._tau_of(k)]
        if not due:
            return WAIT, f"{fraction:.3f} of the run spent < tau {self.tau}"
        for op, stages in _ORDER:
            for index in due:
                slot = report.slots[index]
                blending = slot.stage == SeedStage.BLENDING
                if slot.stage not in stages or (blending and not blend_complete(slot.alpha_view)):
                    continue
                action = canonicalize(Action(op, slot=index, blueprint=self.blueprint,
                                             tempo=Tempo.FAST))
                if report.masks.allows(action):
                    return action, (f"grow with {self.operator} at {fraction:.3f} of the "
                                    f"run: {op.name.lower()} {report.slot_ids[index]}")
        return WAIT, "nothing to do now"

    def decisions_after_tau(self, slots: int) -> int:
        """Decisions a fit of ``slots`` growth slots must still make after the last ``tau`` for
        its growth to be fossilized: one germination per slot grown then (one per decision),
        the blend's `blend_ticks`, then the advance to HOLDING and the fossilization.

        Example:
            >>> StackController(0.5, "identity").decisions_after_tau(slots=1)
            3
        """
        if len(self.taus) > 1:
            at_last = sum(1 for k in range(slots) if self._tau_of(k) == self.last_tau)
        else:
            at_last = slots
        return max(1, at_last) + self.blend_ticks + 2

    @property
    def blend_ticks(self) -> int:
        """The decisions its growth seeds take to blend in (the operator's tempo: 0 for one that
        preserves the function)."""
        operator = operator_of(self.blueprint)
        return 0 if operator is None else operator.tempo

    @property
    def last_tau(self) -> float:
        """The last growth time that comes (a slot's 1 never does)."""
        return max(t for t in self.taus if t < NEVER)

    def _tau_of(self, k: int) -> float:
        return self.taus[k] if len(self.taus) > 1 else self.taus[0]

    def _slot_indices(self, report: EpochReport) -> list[int]:
        ids = report.slot_ids
        growing = [i for i, slot in enumerate(report.slots) if slot.growth_blocks > 0]
        if self.slots is None:
            if not growing:
                raise ConfigError(_NO_GROWTH_SLOT)
            if len(self.taus) not in (1, len(growing)):
                raise ConfigError(f"stack: {len(self.taus)} taus for the run's "
                                  f"{len(growing)} growth slots "
                                  f"({', '.join(ids[i] for i in growing)}); give one per slot")
            return growing
        named = {ids[i]: i for i in growing}
        missing = [s for s in self.slots if s not in named]
        if missing:
            raise ConfigError(f"stack: {missing[0]!r} is not a growth slot of this run; "
                              f"accepted: {', '.join(named) or 'none (no growth slot)'}")
        return [named[s] for s in self.slots]

    def earliest_germination(self, max_epochs: int | None) -> int | None:
        """The first epoch whose report is past ``tau`` in a run of ``max_epochs`` epochs
        without a budget (``(epoch + 1) / max_epochs >= tau``)."""
        if not max_epochs:
            return None
        return max(0, math.ceil(self.tau * max_epochs) - 1)

    def check_blueprints(self, topology: str, allowed: Sequence[str]) -> None:
        """Refuse (one line) a run that cannot germinate its growth seeds: none of its slots is
        a growth slot, or its blueprints leave the operator out."""
        if self.blueprint in available(topology) and self.blueprint not in allowed and not any(
                n.startswith("block_") for n in allowed):
            raise ConfigError(_NO_GROWTH_SLOT)
        check_named_blueprint(_KIND, self.blueprint, topology, allowed)

    def state_dict(self) -> dict[str, Any]:
        return state_header(_KIND)  # its decisions are a function of the report alone

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, _KIND, ())


#: Why a stacking controller cannot act in a run without a growth slot, and the fix.
_NO_GROWTH_SLOT = ("stack: no slot of this run is a growth slot, so nothing can grow deeper; "
                   "accepted: MorphogenesisCallback(growth=DepthGrowth('<your stack of "
                   "blocks>')), or a GPTHost growth preset (grow4, grow2) with its r1c* slots")


def _taus(tau: Any) -> tuple[Any, ...]:
    """``tau`` as a tuple: one number, or any sequence of them (a list, a NumPy array); a string
    or anything else is returned whole, for the caller to refuse."""
    if isinstance(tau, Real | str | bytes):
        return (tau,)
    try:
        return tuple(tau)
    except TypeError:  # not iterable (a 0-d tensor, None)
        return (tau,)
