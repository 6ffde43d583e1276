"""Baseline controllers: always WAIT, uniformly random valid actions, and a fixed script.

They are what a learned or heuristic controller has to beat (`StaticController` keeps the host
as it is, `RandomController` grows it blindly) and what tests use to drive the engine through a
known sequence of lifecycle events (`ScriptedController`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from esper_lightning.blueprints import blueprint_index
from esper_lightning.controllers.base import (
    WAIT,
    BlueprintCheck,
    check_named_blueprint,
    check_state,
    state_header,
)
from esper_lightning.core.actions import (
    CAUSAL_RELEVANCE,
    HEADS,
    Action,
    ActionMasks,
    LifecycleOp,
    Tempo,
    canonicalize,
)
from esper_lightning.core.report import EpochReport

#: A script: ``{epoch: action or [actions]}`` or an iterable of ``(epoch, action)`` pairs.
Script: TypeAlias = (
    Mapping[int, Action | Sequence[Action]] | Iterable[tuple[int, Action | Sequence[Action]]]
)


class StaticController:
    """Never changes the host: WAIT every epoch (the "no growth" baseline).

    Example:
        >>> StaticController().state_dict()
        {'controller': 'static', 'version': 1}
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads: frozenset[str] = frozenset()

    def decide(self, report: EpochReport) -> Action:
        return WAIT

    def reset(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return state_header("static")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, "static", ())


class RandomController:
    """Uniformly random valid actions: the op uniformly among the legal ops, then each head the
    op uses uniformly among its legal values; heads the op ignores take their canonical value.

    The generator keeps running across `reset` so successive episodes differ; its state is in
    `state_dict`, so a restored controller continues the exact same sequence.

    Args:
        rng_seed: seed of the ``numpy.random.Generator``.
        wait_probability: None for WAIT as likely as any other legal op; otherwise the
            probability of WAIT whenever another op is legal (a less fidgety baseline).

    Example:
        >>> controller = RandomController(rng_seed=7, wait_probability=0.8)
        >>> controller.state_dict()["wait_probability"]
        0.8
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads: frozenset[str] = frozenset()

    def __init__(self, rng_seed: int = 0, wait_probability: float | None = None) -> None:
        if wait_probability is not None and not 0.0 <= wait_probability <= 1.0:
            raise ValueError(f"wait_probability must be in [0, 1] or None, got {wait_probability}")
        self.rng_seed = int(rng_seed)
        self.wait_probability = None if wait_probability is None else float(wait_probability)
        self._rng = np.random.default_rng(self.rng_seed)

    def decide(self, report: EpochReport) -> Action:
        masks = report.masks
        op = self._sample_op(masks)
        heads: dict[str, int] = {"op": int(op)}
        for head in HEADS[1:]:
            if head in CAUSAL_RELEVANCE[op]:
                heads[head] = self._choice(masks.head(head, op), head)
        first_slot = int(np.flatnonzero(masks.head("slot", op))[0])
        return canonicalize(Action(**heads), canonical_slot=first_slot)

    def reset(self) -> None:
        pass  # the generator runs on so each episode gets fresh draws

    def state_dict(self) -> dict[str, Any]:
        return {
            **state_header("random"),
            "rng_seed": self.rng_seed,
            "wait_probability": self.wait_probability,
            # A dict of str/int (PCG64's 128-bit ints included): plain data for weights_only.
            "bit_generator": copy.deepcopy(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, "random", ("rng_seed", "wait_probability", "bit_generator"))
        generator = state["bit_generator"]
        expected = type(self._rng.bit_generator).__name__
        if not isinstance(generator, Mapping) or generator.get("bit_generator") != expected:
            raise ValueError(f"random controller state holds no {expected} generator state")
        self.rng_seed = int(state["rng_seed"])
        p = state["wait_probability"]
        self.wait_probability = None if p is None else float(p)
        self._rng.bit_generator.state = copy.deepcopy(dict(generator))

    def _sample_op(self, masks: ActionMasks) -> LifecycleOp:
        if self.wait_probability is None:
            return LifecycleOp(self._choice(masks.op, "op"))
        others = masks.op.copy()
        others[LifecycleOp.WAIT] = False
        if not others.any() or self._rng.random() < self.wait_probability:
            return LifecycleOp.WAIT
        return LifecycleOp(self._choice(others, "op"))

    def _choice(self, mask: np.ndarray, head: str) -> int:
        legal = np.flatnonzero(mask)
        if legal.size == 0:
            # Masks always leave WAIT and one value per head; an empty one is a masking bug.
            raise RuntimeError(f"empty {head!r} mask: no legal value to sample")
        return int(legal[self._rng.integers(legal.size)])


class GrowerController:
    """A fixed growth rule: germinate ``blueprint`` in each listed slot as soon as the masks
    allow, advance it whenever legal and fossilize it once it holds (never, with
    ``fossilize=False``: the seed then stays in HOLDING, blended in at alpha 1).

    A baseline whose behaviour does not depend on measurements, so a learned or tuned
    controller can be compared with "just grow": ``GrowerController("conv_light")`` is a good
    grower on the CIFAR hosts, ``GrowerController("conv_heavy", slots=None, fossilize=False)``
    (every slot, never kept) a wasteful one.

    A blueprint the run cannot germinate (another topology's, or one the run does not allow)
    is refused in one line: at construction when ``topology`` is given, else by
    `check_blueprints` (the callback calls it at fit start) or at the first decision.

    Args:
        blueprint: what to germinate.
        slots: slot indices to grow in (in this order); None for every slot.
        fossilize: fossilize held seeds.
        tempo: blend tempo of new seeds.
        topology: the slots' topology, when known up front: the blueprint is checked against
            it now (None: against the blueprint table now, the topology later).

    Example:
        >>> GrowerController("conv_light").state_dict()["controller"]
        'grower'
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads: frozenset[str] = frozenset()

    def __init__(
        self,
        blueprint: str,
        slots: Sequence[int] | None = (0,),
        fossilize: bool = True,
        tempo: Tempo = Tempo.FAST,
        topology: str | None = None,
    ) -> None:
        if topology is None:
            blueprint_index(blueprint)  # BlueprintError (a ValueError) listing the known names
        else:
            check_named_blueprint("grower", blueprint, topology)
        self.blueprint = blueprint
        self.slots = None if slots is None else tuple(int(s) for s in slots)
        self.fossilize = fossilize
        self.tempo = Tempo(tempo)
        self._blueprint_check = BlueprintCheck()

    def check_blueprints(self, topology: str, allowed: Sequence[str]) -> None:
        """Refuse (one line) a blueprint this run can never germinate."""
        check_named_blueprint("grower", self.blueprint, topology, allowed)

    def decide(self, report: EpochReport) -> Action:
        self._blueprint_check(self, report)
        masks = report.masks
        slots = range(len(report.slots)) if self.slots is None else self.slots
        for op in (LifecycleOp.FOSSILIZE, LifecycleOp.ADVANCE, LifecycleOp.GERMINATE):
            if op == LifecycleOp.FOSSILIZE and not self.fossilize:
                continue
            for slot in slots:
                action = Action(op, slot=slot, blueprint=self.blueprint, tempo=self.tempo)
                if masks.allows(canonicalize(action)):
                    return canonicalize(action)
        return WAIT

    def reset(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return state_header("grower")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, "grower", ())


class ScriptedController:
    """Plays a fixed script: the scripted action at ``report.epoch``, WAIT at other epochs.

    Actions are returned exactly as written, legal or not: the engine re-checks every action
    and executes an illegal one as WAIT with the reason recorded, so scripts can also probe
    that path. When an epoch lists several actions, successive `decide` calls at that epoch
    return them in order, then WAIT. `reset` replays the script from the start.

    Args:
        script: ``{epoch: action or [actions]}`` or ``(epoch, action)`` pairs (repeated
            epochs queue up in order). Epochs are 0-based ints.

    Raises:
        ValueError: for a negative or non-integer epoch or a malformed pair.
        TypeError: for an entry that is not an `Action`.

    Example:
        >>> from esper_lightning.core.actions import LifecycleOp
        >>> germinate = Action(LifecycleOp.GERMINATE, slot=0, blueprint="norm")
        >>> controller = ScriptedController({5: germinate, 6: Action(LifecycleOp.ADVANCE)})
        >>> sorted(controller.script)
        [5, 6]
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads: frozenset[str] = frozenset()

    def __init__(self, script: Script) -> None:
        self._script = _parse_script(script)
        self.reset()

    @property
    def script(self) -> dict[int, tuple[Action, ...]]:
        """The parsed script: epoch -> actions in the order they are returned."""
        return dict(self._script)

    def decide(self, report: EpochReport) -> Action:
        epoch = int(report.epoch)
        actions = self._script.get(epoch, ())
        served = self._served.get(epoch, 0)
        if served >= len(actions):
            return WAIT
        self._served[epoch] = served + 1
        return actions[served]

    def reset(self) -> None:
        self._served: dict[int, int] = {}

    def state_dict(self) -> dict[str, Any]:
        # Pairs rather than an int-keyed dict, so the state also survives JSON.
        return {**state_header("scripted"), "served": [[e, n] for e, n in self._served.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, "scripted", ("served",))
        served: dict[int, int] = {}
        for epoch, count in state["served"]:
            epoch, count = int(epoch), int(count)
            if not 0 <= count <= len(self._script.get(epoch, ())):
                raise ValueError(
                    f"scripted controller state served {count} action(s) at epoch {epoch}, "
                    f"but this script has {len(self._script.get(epoch, ()))} there"
                )
            served[epoch] = count
        self._served = served


def _parse_script(script: Script) -> dict[int, tuple[Action, ...]]:
    """Validate a script up front so a typo fails at construction, not mid-run."""
    if isinstance(script, Mapping):
        items: Iterable[Any] = script.items()
    elif isinstance(script, Iterable) and not isinstance(script, (str, bytes)):
        items = script
    else:
        raise TypeError(f"script must be a mapping or (epoch, action) pairs, got {script!r}")
    parsed: dict[int, list[Action]] = {}
    for item in items:
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"script entries must be (epoch, action) pairs, got {item!r}")
        epoch, value = item
        parsed.setdefault(_check_epoch(epoch), []).extend(_check_actions(value, epoch))
    return {epoch: tuple(actions) for epoch, actions in sorted(parsed.items())}


def _check_epoch(epoch: Any) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"script epoch must be an int >= 0, got {epoch!r}")
    return int(epoch)


def _check_actions(value: Any, epoch: int) -> list[Action]:
    actions = [value] if isinstance(value, Action) else value
    if not isinstance(actions, Sequence) or isinstance(actions, (str, bytes)):
        raise TypeError(
            f"script epoch {epoch}: expected an Action or a sequence of Actions, got {value!r}"
        )
    for action in actions:
        if not isinstance(action, Action):
            raise TypeError(f"script epoch {epoch}: expected an Action, got {action!r}")
    return list(actions)
