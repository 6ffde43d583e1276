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

`compare` names them ``stack:K@TAU[:OPERATOR]`` (`stack_controller`; ``TAU`` may list one
time per growth slot, ``0.2,0.5``, where a later slot's 1 means it never grows: ``0.3,1``) and
the host born that deep ``born:K`` (`born_implants`): the same host preset, with a random-init
growth seed implanted fully blended in every growth slot at epoch 0, which is exactly a
``K``-block network (the "born big" baseline, S_K, spending its budget on fewer tokens). ``K``
is the host's grown depth (`GPTConfig.max_depth`), for both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

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
#: Mixed into an episode's rng seed for ``stack:K@random``'s draw of tau.
_RANDOM_TAU_SALT = 0x7A0
#: ``K@TAU[,TAU...][:OPERATOR]`` (the argument of ``stack:``).
_STACK = re.compile(r"(?P<depth>\d+)@(?P<tau>[0-9.,]+|random)(?::(?P<operator>[a-z][a-z0-9_]*))?")
#: What it does first, for the first of its slots in order where the masks allow it: finish an
#: incubation (a seed of a checkpoint from before block seeds skipped it), germinate the next
#: seed (a blending seed does not stop it), then move blended seeds on and keep them.
_ORDER: tuple[tuple[LifecycleOp, frozenset[SeedStage]], ...] = (
    (LifecycleOp.ADVANCE, frozenset({SeedStage.GERMINATED, SeedStage.TRAINING})),
    (LifecycleOp.GERMINATE, frozenset({SeedStage.DORMANT})),
    (LifecycleOp.ADVANCE, frozenset({SeedStage.BLENDING})),
    (LifecycleOp.FOSSILIZE, frozenset({SeedStage.HOLDING})),
)


class GrowingHost(Protocol):
    """The shape of a host that grows deeper (`hosts.GPTConfig` is one): its blocks, its growth
    slots in order, and the blocks one seed in a growth slot adds."""

    @property
    def n_layer(self) -> int: ...

    @property
    def growth_slot_ids(self) -> tuple[str, ...]: ...

    @property
    def growth_depths(self) -> tuple[int, ...]: ...

    @property
    def max_depth(self) -> int: ...


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
        taus = (tau,) if isinstance(tau, int | float) else tuple(tau)
        if not taus or not 0.0 <= taus[0] < NEVER or not all(0.0 <= t <= NEVER for t in taus):
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
        self.slots = None if slots is None else tuple(slots)
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


def parse_stack(argument: str) -> tuple[int, tuple[float, ...] | None, str]:
    """``K@TAU[,TAU...][:OPERATOR]`` -> (depth, taus, operator); OPERATOR defaults to ``copy``;
    TAU ``random`` gives None (random timing: `stack_controller` draws tau per episode).

    Example:
        >>> parse_stack("4@0.5:identity")
        (4, (0.5,), 'identity')
        >>> parse_stack("2@random")
        (2, None, 'copy')

    Raises:
        ConfigError: One line naming the bad argument and the accepted form.
    """
    match = _STACK.fullmatch(argument)
    accepted = (f"accepted: stack:K@TAU[:OPERATOR] with TAU a fraction (one per growth slot, "
                f"comma-separated) or random, OPERATOR one of {', '.join(operators())} (e.g. "
                "stack:4@0.5:copy)")
    if match is None or (match["operator"] and match["operator"] not in operators()):
        raise ConfigError(f"bad stack spec 'stack:{argument}'; {accepted}")
    operator = match["operator"] or "copy"
    if match["tau"] == "random":
        return int(match["depth"]), None, operator
    try:
        taus = tuple(float(t) for t in match["tau"].split(","))
    except ValueError:
        raise ConfigError(f"bad stack spec 'stack:{argument}': TAU {match['tau']!r} is not a "
                          "number") from None
    return int(match["depth"]), taus, operator


def stack_controller(argument: str, host: GrowingHost | None, slot_ids: Sequence[str],
                     topology: str, rng_seed: int | None = None) -> StackController:
    """The controller of ``stack:K@TAU[:OPERATOR]`` on ``host`` (None: a host that cannot grow)
    playing ``slot_ids`` of ``topology``: it grows in every growth slot of the host, so ``K``
    must be the host's grown depth. Refused in one line otherwise, or when the run's slots
    lack a growth slot. ``stack:K@random`` is random timing, the baseline a learned timing
    must beat first: one tau per growth slot drawn uniformly from [0, 1) with the episode's
    ``rng_seed`` (`random_taus`), so episode i grows at the same random times in every
    comparison.

    Example:
        >>> from esper_lightning.hosts.presets import GPT_PRESETS
        >>> stack_controller("4@0.8:identity", GPT_PRESETS["grow4"], ("r1c0",),
        ...                  "transformer").slots
        ('r1c0',)
    """
    depth, taus, operator = parse_stack(argument)
    check_named_blueprint(f"stack:{argument}", growth_blueprint(operator), topology)
    slots = _growth_slots(f"stack:{argument}", depth, host, slot_ids)
    if taus is None:
        if rng_seed is None:
            raise ValueError(f"stack:{argument} draws its tau from the episode's rng_seed; "
                             "none was given")
        taus = random_taus(rng_seed, len(slots))
    try:
        return StackController(taus if len(taus) > 1 else taus[0], operator, slots=slots)
    except ConfigError as err:
        raise ConfigError(f"bad stack spec 'stack:{argument}': {err}") from None


def random_taus(rng_seed: int, slots: int = 1) -> tuple[float, ...]:
    """The growth times of ``stack:K@random`` in the episode of ``rng_seed``, one per growth
    slot: independent uniforms in [0, 1), sorted (so each growth decision of a chained host is
    random, not only the first), from a generator of their own (a salt keeps them apart from
    the episode's other draws).

    Example:
        >>> random_taus(3) == random_taus(3) and 0.0 <= random_taus(3)[0] < 1.0
        True
        >>> first, second = random_taus(3, 2)
        >>> first <= second
        True
    """
    draws = np.random.default_rng((rng_seed, _RANDOM_TAU_SALT)).random(slots)
    return tuple(sorted(float(t) for t in draws))


def born_implants(argument: str, host: GrowingHost | None, slot_ids: Sequence[str],
                  topology: str = "transformer") -> tuple[tuple[str, str], ...]:
    """What ``born:K`` implants at birth: a random-init growth seed in every growth slot of
    ``host`` (the ones `StackController` grows in), fully blended from epoch 0, so the host is
    a ``K``-block network from the start; ``K`` must be the host's grown depth.

    Example:
        >>> from esper_lightning.hosts.presets import GPT_PRESETS
        >>> born_implants("4", GPT_PRESETS["grow4"], slot_ids=("r1c0",))
        (('r1c0', 'block_random'),)
    """
    if not argument.isdigit():
        raise ConfigError(f"bad born spec 'born:{argument}'; accepted: born:K, K the depth "
                          "(e.g. born:4)")
    blueprint = growth_blueprint("random")
    check_named_blueprint(f"born:{argument}", blueprint, topology)
    slots = _growth_slots(f"born:{argument}", int(argument), host, slot_ids)
    return tuple((slot_id, blueprint) for slot_id in slots)


def _growth_slots(owner: str, depth: int, host: GrowingHost | None,
                  slot_ids: Sequence[str]) -> tuple[str, ...]:
    """The host's growth slots, once ``depth`` is its grown depth and the run plays them all."""
    if host is None or not host.growth_slot_ids:
        raise ConfigError(f"{owner} needs a host with growth slots (a GPT preset such as grow4, "
                          "grow4x1 or grow2 with --task lm)")
    if depth != host.max_depth:
        k = owner.split(":")[0]
        raise ConfigError(
            f"{owner}: K={depth} is not the host's grown depth; accepted: {k}:{host.max_depth} "
            f"({host.n_layer} block(s) + growth slot(s) of "
            f"{' + '.join(map(str, host.growth_depths))} block(s))")
    missing = [s for s in host.growth_slot_ids if s not in slot_ids]
    if missing:
        raise ConfigError(f"{owner} grows in the growth slots {' '.join(host.growth_slot_ids)}; "
                          f"the run lacks {' '.join(missing)} (--slots {' '.join(slot_ids)})")
    return host.growth_slot_ids
