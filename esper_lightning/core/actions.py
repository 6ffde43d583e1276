"""The factored action space and its state-dependent masks.

This module is the single source of truth for what a controller may do: the callback, the
heuristic and the RL agent all read the same masks, and the engine re-checks every action with
`action_error` before it executes it.

An `Action` has eight heads. The op is chosen first; the causal relevance table
(`CAUSAL_RELEVANCE`) says which other heads matter for that op. Irrelevant heads are set to their
canonical value (`canonicalize`) so they carry no information and, in the RL agent, no log-prob.

The blueprint head names a blueprint (``Action.blueprint = "conv_light"``); its index, in the
masks and for a policy, is the name's place in the blueprint table (`blueprints.blueprint_table`:
0 is "no blueprint", then the built-ins, then every blueprint registered since).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import Protocol

import numpy as np

from esper_lightning.blueprints.registry import (
    NO_BLUEPRINT,
    blueprint_at,
    blueprint_index,
    blueprint_table,
)
from esper_lightning.core.alpha import AlphaAlgorithm, AlphaCurve, AlphaMode
from esper_lightning.core.lifecycle import (
    FAILURE_STAGES,
    LIVE_STAGES,
    MIN_PRUNE_AGE,
    PRESENT_STAGES,
    SeedStage,
)


class LifecycleOp(IntEnum):
    WAIT = 0
    GERMINATE = 1
    SET_ALPHA_TARGET = 2
    PRUNE = 3
    FOSSILIZE = 4
    ADVANCE = 5


class GerminationStyle(IntEnum):
    """Blend curve x blend algorithm for the initial ramp; illegal combinations do not exist."""

    LINEAR_ADD = 0
    LINEAR_MULTIPLY = 1
    SIGMOID_ADD = 2
    GATED_GATE = 3

    @property
    def curve(self) -> AlphaCurve:
        # The gated style ramps linearly so the gate is not starved by a ramp that stays near 0.
        return AlphaCurve.SIGMOID if self == GerminationStyle.SIGMOID_ADD else AlphaCurve.LINEAR

    @property
    def algorithm(self) -> AlphaAlgorithm:
        return {
            GerminationStyle.LINEAR_ADD: AlphaAlgorithm.ADD,
            GerminationStyle.LINEAR_MULTIPLY: AlphaAlgorithm.MULTIPLY,
            GerminationStyle.SIGMOID_ADD: AlphaAlgorithm.ADD,
            GerminationStyle.GATED_GATE: AlphaAlgorithm.GATE,
        }[self]


class Tempo(IntEnum):
    FAST = 0
    STANDARD = 1
    SLOW = 2

    @property
    def epochs(self) -> int:
        return (3, 5, 8)[self]


class AlphaTargetChoice(IntEnum):
    HALF = 0
    SEVENTY = 1
    FULL = 2

    @property
    def alpha(self) -> float:
        return (0.5, 0.7, 1.0)[self]


class AlphaSpeed(IntEnum):
    INSTANT = 0
    FAST = 1
    MEDIUM = 2
    SLOW = 3

    @property
    def steps(self) -> int:
        return (0, 3, 5, 8)[self]


class AlphaCurveChoice(IntEnum):
    LINEAR = 0
    COSINE = 1
    SIGMOID_GENTLE = 2
    SIGMOID = 3
    SIGMOID_SHARP = 4

    @property
    def curve(self) -> AlphaCurve:
        return (
            AlphaCurve.LINEAR,
            AlphaCurve.COSINE,
            AlphaCurve.SIGMOID,
            AlphaCurve.SIGMOID,
            AlphaCurve.SIGMOID,
        )[self]

    @property
    def steepness(self) -> float:
        return (12.0, 12.0, 6.0, 12.0, 24.0)[self]


#: Head order used by masks, the policy network and the rollout buffer.
HEADS: tuple[str, ...] = (
    "op",
    "slot",
    "blueprint",
    "style",
    "tempo",
    "alpha_target",
    "alpha_speed",
    "alpha_curve",
)

#: The heads with a fixed set of values; the slot head has one value per slot and the blueprint
#: head one per entry of the blueprint table.
HEAD_ENUMS: dict[str, type[IntEnum]] = {
    "op": LifecycleOp,
    "style": GerminationStyle,
    "tempo": Tempo,
    "alpha_target": AlphaTargetChoice,
    "alpha_speed": AlphaSpeed,
    "alpha_curve": AlphaCurveChoice,
}

#: Which heads influence the outcome of each op (the op head always does).
CAUSAL_RELEVANCE: dict[LifecycleOp, frozenset[str]] = {
    LifecycleOp.WAIT: frozenset({"op"}),
    LifecycleOp.GERMINATE: frozenset({"op", "slot", "blueprint", "style", "tempo", "alpha_target"}),
    LifecycleOp.SET_ALPHA_TARGET: frozenset(
        {"op", "slot", "style", "alpha_target", "alpha_speed", "alpha_curve"}
    ),
    LifecycleOp.PRUNE: frozenset({"op", "slot", "alpha_speed", "alpha_curve"}),
    LifecycleOp.FOSSILIZE: frozenset({"op", "slot"}),
    LifecycleOp.ADVANCE: frozenset({"op", "slot"}),
}

#: Index an irrelevant head takes (the slot head's canonical value is the first legal slot).
CANONICAL: dict[str, int] = {
    "blueprint": NO_BLUEPRINT,
    "style": GerminationStyle.SIGMOID_ADD,
    "tempo": Tempo.STANDARD,
    "alpha_target": AlphaTargetChoice.FULL,
    "alpha_speed": AlphaSpeed.INSTANT,
    "alpha_curve": AlphaCurveChoice.LINEAR,
}


@dataclass(frozen=True)
class Action:
    """One factored decision. ``slot`` indexes the controller's ordered slot list; ``blueprint``
    is a blueprint name (None: no blueprint, the value of every op but GERMINATE). An index of the
    blueprint table (what a policy samples) is accepted too and stored as its name.

    Example:
        >>> Action(LifecycleOp.GERMINATE, slot=1, blueprint="conv_light").describe()
        'GERMINATE slot=1 blueprint=conv_light style=sigmoid_add tempo=standard alpha_target=full'
        >>> Action.from_indices([1, 1, 1, 2, 1, 2, 0, 0]).blueprint
        'conv_light'

    Raises:
        BlueprintError: For a name or index outside the blueprint table.
    """

    op: LifecycleOp = LifecycleOp.WAIT
    slot: int = 0
    blueprint: str | None = None
    style: GerminationStyle = GerminationStyle.SIGMOID_ADD
    tempo: Tempo = Tempo.STANDARD
    alpha_target: AlphaTargetChoice = AlphaTargetChoice.FULL
    alpha_speed: AlphaSpeed = AlphaSpeed.INSTANT
    alpha_curve: AlphaCurveChoice = AlphaCurveChoice.LINEAR

    def __post_init__(self) -> None:
        # Accept plain ints (from a policy's sampled indices) and store enums and names.
        for f in fields(self):
            enum_type = HEAD_ENUMS.get(f.name)
            if enum_type is not None:
                object.__setattr__(self, f.name, enum_type(getattr(self, f.name)))
        object.__setattr__(self, "slot", int(self.slot))
        if isinstance(self.blueprint, str):
            blueprint_index(self.blueprint)  # a misspelt name fails here, not at execution
        elif self.blueprint is not None:
            object.__setattr__(self, "blueprint", blueprint_at(operator.index(self.blueprint)))

    @classmethod
    def from_indices(cls, indices: Sequence[int]) -> Action:
        """Build from head indices in `HEADS` order."""
        return cls(**dict(zip(HEADS, (int(i) for i in indices), strict=True)))

    def indices(self) -> tuple[int, ...]:
        """Head indices in `HEADS` order (the blueprint's from the blueprint table)."""
        return tuple(
            blueprint_index(self.blueprint) if head == "blueprint" else int(getattr(self, head))
            for head in HEADS
        )

    def relevant(self, head: str) -> bool:
        return head in CAUSAL_RELEVANCE[self.op]

    def describe(self, slot_ids: Sequence[str] | None = None) -> str:
        slot = slot_ids[self.slot] if slot_ids is not None else str(self.slot)
        parts = [self.op.name]
        if self.relevant("slot"):
            parts.append(f"slot={slot}")
        for head in HEADS[2:]:
            if self.relevant(head):
                value = getattr(self, head)
                parts.append(f"{head}={value if head == 'blueprint' else value.name.lower()}")
        return " ".join(parts)


def canonicalize(action: Action, canonical_slot: int = 0) -> Action:
    """Replace every head the op does not use by its canonical value."""
    relevant = CAUSAL_RELEVANCE[action.op]
    changes: dict[str, object] = {
        head: value for head, value in CANONICAL.items() if head not in relevant
    }
    if "slot" not in relevant:
        changes["slot"] = canonical_slot
    return replace(action, **changes)


class SlotView(Protocol):
    """The part of a slot report that the masks read (`slots.SlotReport` satisfies it)."""

    @property
    def stage(self) -> SeedStage: ...

    @property
    def epochs_total(self) -> int: ...

    @property
    def alpha_mode(self) -> AlphaMode: ...


@dataclass(frozen=True)
class MaskContext:
    """Run-level settings that shape the masks.

    Args:
        blueprints: blueprint names a controller may germinate (already filtered to the topology).
        max_seeds: limit on seeds present at once (live or fossilized); None or 0 = unlimited.
        slot_refuses: per slot, in slot order, the blueprints that slot cannot host (a growth
            blueprint outside a growth slot: `SeedSlot.context_error`); empty: every slot hosts
            every blueprint. Names, not allowed lists, so narrowing ``blueprints`` (a policy's
            playable ones) keeps it valid.
    """

    blueprints: tuple[str, ...]
    max_seeds: int | None = None
    slot_refuses: tuple[frozenset[str], ...] = ()

    def slot_blueprints(self, slot: int) -> tuple[str, ...]:
        """The blueprints slot index ``slot`` may germinate (``blueprints`` in their order)."""
        if not self.slot_refuses:
            return self.blueprints
        refused = self.slot_refuses[slot]
        return tuple(name for name in self.blueprints if name not in refused)


#: Stages that block any germination elsewhere: one seed incubates at a time, none in cooldown.
_BLOCKS_GERMINATION = frozenset({SeedStage.GERMINATED, SeedStage.TRAINING}) | FAILURE_STAGES


def slot_op_error(
    op: LifecycleOp, slot: int, views: Sequence[SlotView], ctx: MaskContext
) -> str | None:
    """Why ``op`` on ``views[slot]`` is illegal, or None when it is legal."""
    if not 0 <= slot < len(views):
        return f"slot index {slot} out of range 0..{len(views) - 1}"
    view = views[slot]
    stage = view.stage
    if op == LifecycleOp.WAIT:
        return None
    if op == LifecycleOp.GERMINATE:
        return _germinate_error(slot, views, ctx)
    if op == LifecycleOp.ADVANCE:
        ok = stage in (SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING)
        return None if ok else f"advance_from_{stage.name.lower()}"
    if op == LifecycleOp.FOSSILIZE:
        return None if stage == SeedStage.HOLDING else f"fossilize_from_{stage.name.lower()}"
    if op == LifecycleOp.PRUNE:
        if stage not in LIVE_STAGES:
            return f"prune_from_{stage.name.lower()}"
        if view.epochs_total < MIN_PRUNE_AGE:
            return f"prune_age_{view.epochs_total}_below_{MIN_PRUNE_AGE}"
        if view.alpha_mode != AlphaMode.HOLD:
            return "prune_while_alpha_ramping"
        return None
    if op == LifecycleOp.SET_ALPHA_TARGET:
        if stage not in (SeedStage.BLENDING, SeedStage.HOLDING):
            return f"retarget_from_{stage.name.lower()}"
        return None if view.alpha_mode == AlphaMode.HOLD else "retarget_while_alpha_ramping"
    raise ValueError(f"unknown op {op!r}")


def _germinate_error(slot: int, views: Sequence[SlotView], ctx: MaskContext) -> str | None:
    view = views[slot]
    if view.stage != SeedStage.DORMANT:
        return f"germinate_into_{view.stage.name.lower()}"
    if not ctx.blueprints:
        return "no_blueprints"
    if not ctx.slot_blueprints(slot):  # e.g. only growth blueprints and a plain slot
        return "no_blueprint_fits_slot"
    if any(v.stage in _BLOCKS_GERMINATION for v in views):
        return "another_seed_incubating_or_cooling_down"
    present = sum(v.stage in PRESENT_STAGES for v in views)
    if ctx.max_seeds and present >= ctx.max_seeds:
        return f"max_seeds_{ctx.max_seeds}_reached"
    return None


@dataclass(frozen=True)
class ActionMasks:
    """Boolean masks (True = legal) for every head; ``slot_by_op[op]`` is the slot mask per op.

    ``blueprint`` allows what some slot allows; ``blueprint_by_slot[s]`` is the blueprint mask
    once slot ``s`` is chosen (the slot head is sampled before the blueprint head), so a
    germination the masks allow is one the engine carries out.
    """

    op: np.ndarray  # [6]
    slot_by_op: np.ndarray  # [6, S]
    blueprint: np.ndarray  # [len(blueprint_table())]
    style: np.ndarray  # [4]
    tempo: np.ndarray  # [3]
    alpha_target: np.ndarray  # [3]
    alpha_speed: np.ndarray  # [4]
    alpha_curve: np.ndarray  # [5]
    blueprint_by_slot: np.ndarray  # [S, len(blueprint_table())]

    def head(self, name: str, op: LifecycleOp | None = None,
             slot: int | None = None) -> np.ndarray:
        """Mask for one head; with ``op`` given, irrelevant heads collapse to their canonical
        value and the slot head uses ``slot_by_op[op]``; with ``slot`` given, the blueprint
        head uses ``blueprint_by_slot[slot]``."""
        if name == "op":
            return self.op
        if name == "slot":
            return self.slot_by_op[LifecycleOp.WAIT if op is None else op]
        mask = self.blueprint_by_slot[slot] if name == "blueprint" and slot is not None else (
            getattr(self, name))
        if op is not None and name not in CAUSAL_RELEVANCE[LifecycleOp(op)]:
            mask = np.zeros_like(mask)
            mask[int(CANONICAL[name])] = True
        return mask

    def allows(self, action: Action) -> bool:
        if not self.op[action.op] or not self.head("slot", action.op)[action.slot]:
            return False
        indices = dict(zip(HEADS, action.indices(), strict=True))
        return all(self.head(h, action.op, action.slot)[indices[h]] for h in HEADS[2:])


def compute_masks(views: Sequence[SlotView], ctx: MaskContext) -> ActionMasks:
    """Masks for every head given the current slot states.

    Op validity is optimistic: an op is legal if any slot allows it, and ``slot_by_op`` restricts
    the slot head once the op is chosen. WAIT is always legal, so the op mask is never empty.
    """
    if not views:
        raise ValueError("masks need at least one slot")
    if ctx.slot_refuses and len(ctx.slot_refuses) != len(views):
        raise ValueError(f"the mask context has slot_refuses for {len(ctx.slot_refuses)} slots "
                         f"and the report {len(views)}; accepted: one entry per slot, or none")
    n_ops = len(LifecycleOp)
    slot_by_op = np.zeros((n_ops, len(views)), dtype=bool)
    for op in LifecycleOp:
        for i in range(len(views)):
            slot_by_op[op, i] = slot_op_error(op, i, views, ctx) is None
    op_mask = slot_by_op.any(axis=1)
    blueprint_by_slot = np.zeros((len(views), len(blueprint_table())), dtype=bool)
    for i in range(len(views)):
        for name in ctx.slot_blueprints(i):
            blueprint_by_slot[i, blueprint_index(name)] = True
    blueprint = blueprint_by_slot.any(axis=0)
    configurable = op_mask[LifecycleOp.GERMINATE] or op_mask[LifecycleOp.SET_ALPHA_TARGET]
    style = np.ones(len(GerminationStyle), dtype=bool)
    alpha_target = np.ones(len(AlphaTargetChoice), dtype=bool)
    if not configurable:
        style[:] = False
        style[GerminationStyle.SIGMOID_ADD] = True
        alpha_target[:] = False
        alpha_target[AlphaTargetChoice.FULL] = True
    # A row with nothing legal is only reachable where GERMINATE is masked (for that slot).
    blueprint_by_slot[~blueprint_by_slot.any(axis=1), NO_BLUEPRINT] = True
    if not blueprint.any():
        blueprint[NO_BLUEPRINT] = True
    return ActionMasks(
        op=op_mask,
        slot_by_op=slot_by_op,
        blueprint=blueprint,
        style=style,
        tempo=np.ones(len(Tempo), dtype=bool),
        alpha_target=alpha_target,
        alpha_speed=np.ones(len(AlphaSpeed), dtype=bool),
        alpha_curve=np.ones(len(AlphaCurveChoice), dtype=bool),
        blueprint_by_slot=blueprint_by_slot,
    )


def action_error(action: Action, views: Sequence[SlotView], ctx: MaskContext) -> str | None:
    """Re-check an action against the live slot states; the reason it is illegal, or None."""
    error = slot_op_error(action.op, action.slot, views, ctx)
    if error is not None:
        return error
    if action.op == LifecycleOp.GERMINATE and action.blueprint not in ctx.blueprints:
        return f"blueprint_{action.blueprint or 'none'}_not_allowed"
    if action.op == LifecycleOp.GERMINATE and action.blueprint not in ctx.slot_blueprints(
            action.slot):
        return f"blueprint_{action.blueprint}_not_hostable_in_slot_{action.slot}"
    return None
