"""Scripted depth growth: grow a host to full depth at a fixed fraction of the run, and its
baselines.

`StackController` grows a host to ``depth`` blocks once fraction ``tau`` of the run is spent
(`EpochReport.spent_fraction`: the compute budget's fraction under a budget, else the epochs
done over the planned ones), with block seeds of one init (``copy``, ``identity``, ``random``;
`blueprints.block`). It is the scripted schedule growth is measured with: a learned or
compute-aware controller has to beat "stack at tau".

On a host whose one growth slot stacks every missing block (``grow4``: 1 block, one growth slot
``r1c0`` of 3 blocks) growth is one decision: block seeds need no incubation, so the
germination at the first decision whose report has ``spent_fraction >= tau`` puts the seed in
BLENDING at once. The lag from that decision to training at full depth, alpha 1:

* ``identity``: none; alpha is 1 from the next training step (blend tempo 0), and the host's
  function is unchanged at birth;
* ``copy``, ``random``: one decision; the next epoch trains at alpha 1/2 and the one after at 1
  (blend tempo 2).

Before that, tau itself is read at decisions: growth starts at the first decision at or past it,
less than one decision's slice of the run late. The seed moves to HOLDING at the first decision
with its blend complete and is fossilized at the next (neither changes the function nor the
cost). On a host with several growth slots (``grow4x1``: three of one block) it germinates one
seed per decision, in slot order, since a blending seed does not stop the next germination:
full depth at alpha 1 comes ``n_seeds - 1`` decisions later than on the one-slot host.

`compare` names them ``stack:K@TAU[:INIT]`` (`stack_controller`) and the host born that deep
``born:K`` (`born_implants`): the same host preset, with a random-init block seed implanted
fully blended in every growth slot at epoch 0, which is exactly a ``K``-block network (the
"born big" baseline, S_K, spending its budget on fewer tokens). ``K`` is the host's grown depth
(`GPTConfig.max_depth`), for both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from esper_lightning.blueprints.block import BLOCK_INITS, block_blueprint
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
#: Mixed into an episode's rng seed for ``stack:K@random``'s draw of tau.
_RANDOM_TAU_SALT = 0x7A0
#: ``K@TAU[:INIT]`` (the argument of ``stack:``).
_STACK = re.compile(r"(?P<depth>\d+)@(?P<tau>[0-9.]+|random)(?::(?P<init>[a-z]+))?")
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
    slots in order, and the blocks one block seed in a growth slot stacks."""

    @property
    def n_layer(self) -> int: ...

    @property
    def growth_slot_ids(self) -> tuple[str, ...]: ...

    @property
    def growth_depth(self) -> int: ...

    @property
    def max_depth(self) -> int: ...


class StackController(ControllerBase):
    """Grow to ``depth`` blocks at fraction ``tau`` of the run, as fast as the lifecycle allows.

    Until ``report.spent_fraction >= tau`` it waits. Then, one action per decision, it
    germinates a block seed of ``init`` in each of its slots in order (straight to BLENDING:
    block seeds need no incubation), advances each to HOLDING once blended and fossilizes it.
    With one seed (``grow4``) that is germinate, then (after the blend: none for ``identity``,
    one decision otherwise) advance, then fossilize; the module docstring gives the lag to full
    depth.

    Growth chains: each block seed builds on the block its slot follows, so on ``grow4x1`` a
    ``copy`` in ``r1c1`` copies the seed in ``r1c0``.

    Args:
        depth: Blocks of the grown host (``host_blocks`` plus ``growth_depth`` per seed).
        tau: Fraction of the run in [0, 1) after which it grows.
        init: ``copy``, ``identity`` or ``random`` (`blueprints.block.BLOCK_INITS`).
        host_blocks: Blocks the host has before growing.
        slots: Slot ids to grow in, in this order (as many as seeds); None: the last
            `n_seeds` slots of the report (a GPT host's growth slots ``r1c*`` come last in
            action order).
        growth_depth: Blocks one seed stacks (its slots' ``growth_depth``; 3 on ``grow4``).

    Raises:
        ConfigError: For a depth not above ``host_blocks`` or not reached by whole seeds, a
            ``tau`` outside [0, 1), an unknown init, or a list of slots of the wrong length.

    Example:
        >>> controller = StackController(depth=4, tau=0.5, init="identity", growth_depth=3)
        >>> controller.blueprint, controller.n_seeds
        ('block_identity', 1)
    """

    def __init__(self, depth: int, tau: float, init: str = "copy", host_blocks: int = 1,
                 slots: Sequence[str] | None = None, growth_depth: int = 1) -> None:
        if host_blocks < 1 or depth <= host_blocks:
            raise ConfigError(f"stack: depth {depth} must exceed the host's {host_blocks} "
                              "block(s)")
        if growth_depth < 1 or (depth - host_blocks) % growth_depth:
            raise ConfigError(f"stack: depth {depth} is not {host_blocks} block(s) plus whole "
                              f"seeds of {growth_depth} block(s)")
        if not 0.0 <= tau < 1.0:
            raise ConfigError(f"stack: tau must be in [0, 1), got {tau}")
        if init not in BLOCK_INITS:
            raise ConfigError(f"stack: unknown init {init!r}; accepted: "
                              f"{', '.join(BLOCK_INITS)}")
        self.depth, self.tau, self.init, self.host_blocks = depth, float(tau), init, host_blocks
        self.growth_depth = growth_depth
        self.blueprint = block_blueprint(init)
        self.slots = None if slots is None else tuple(slots)
        self._blueprint_check = BlueprintCheck()
        if self.slots is not None and len(self.slots) != self.n_seeds:
            raise ConfigError(f"stack: {self.n_seeds} block seed(s) need as many slots, got "
                              f"{list(self.slots)}")

    @property
    def n_seeds(self) -> int:
        """Block seeds it grows."""
        return (self.depth - self.host_blocks) // self.growth_depth

    def decide(self, report: EpochReport) -> Action:
        self._blueprint_check(self, report)
        fraction = report.spent_fraction
        if fraction is None:
            raise ConfigError(f"stack: growth at tau={self.tau} needs a compute budget or a "
                              "planned number of epochs, and this run has neither")
        if fraction < self.tau:
            self.last_reason = f"{fraction:.3f} of the run spent < tau {self.tau}"
            return WAIT
        for op, stages in _ORDER:
            for index in self._slot_indices(report):
                slot = report.slots[index]
                blending = slot.stage == SeedStage.BLENDING
                if slot.stage not in stages or (blending and not blend_complete(slot.alpha_view)):
                    continue
                action = canonicalize(Action(op, slot=index, blueprint=self.blueprint,
                                             tempo=Tempo.FAST))
                if report.masks.allows(action):
                    self.last_reason = (f"stack to {self.depth} blocks at {fraction:.3f} of the "
                                        f"run: {op.name.lower()} {report.slot_ids[index]}")
                    return action
        self.last_reason = "nothing to do now"
        return WAIT

    def _slot_indices(self, report: EpochReport) -> list[int]:
        ids = report.slot_ids
        if self.slots is None:
            if len(ids) < self.n_seeds:
                raise ConfigError(f"stack: {self.n_seeds} block seed(s) need as many slots; "
                                  f"the run has {', '.join(ids)}")
            return list(range(len(ids) - self.n_seeds, len(ids)))
        missing = [s for s in self.slots if s not in ids]
        if missing:
            raise ConfigError(f"stack: slot {missing[0]!r} is not in this run; accepted: "
                              f"{', '.join(ids)}")
        return [ids.index(s) for s in self.slots]

    def earliest_germination(self, max_epochs: int | None) -> int | None:
        """The first epoch whose report is past ``tau`` in a run of ``max_epochs`` epochs
        without a budget (``(epoch + 1) / max_epochs >= tau``)."""
        if not max_epochs:
            return None
        return max(0, math.ceil(self.tau * max_epochs) - 1)

    def check_blueprints(self, topology: str, allowed: Sequence[str]) -> None:
        """Refuse (one line) a run that cannot germinate its block seeds."""
        check_named_blueprint(_KIND, self.blueprint, topology, allowed)

    def state_dict(self) -> dict[str, Any]:
        return state_header(_KIND)  # its decisions are a function of the report alone

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, _KIND, ())


def parse_stack(argument: str) -> tuple[int, float | None, str]:
    """``K@TAU[:INIT]`` -> (depth, tau, init); INIT defaults to ``copy``; TAU ``random`` gives
    None (random timing: `stack_controller` draws tau per episode).

    Example:
        >>> parse_stack("4@0.5:identity")
        (4, 0.5, 'identity')
        >>> parse_stack("2@random")
        (2, None, 'copy')

    Raises:
        ConfigError: One line naming the bad argument and the accepted form.
    """
    match = _STACK.fullmatch(argument)
    if match is None:
        raise ConfigError(f"bad stack spec 'stack:{argument}'; accepted: stack:K@TAU[:INIT] "
                          f"with TAU a fraction or random, INIT one of {', '.join(BLOCK_INITS)} "
                          "(e.g. stack:4@0.5:copy)")
    if match["tau"] == "random":
        return int(match["depth"]), None, match["init"] or "copy"
    try:
        tau = float(match["tau"])
    except ValueError:
        raise ConfigError(f"bad stack spec 'stack:{argument}': TAU {match['tau']!r} is not a "
                          "number") from None
    return int(match["depth"]), tau, match["init"] or "copy"


def stack_controller(argument: str, host: GrowingHost | None, slot_ids: Sequence[str],
                     topology: str, rng_seed: int | None = None) -> StackController:
    """The controller of ``stack:K@TAU[:INIT]`` on ``host`` (None: a host that cannot grow)
    playing ``slot_ids`` of ``topology``: it grows in every growth slot of the host, so ``K``
    must be the host's grown depth. Refused in one line otherwise, or when the run's slots
    lack a growth slot. ``stack:K@random`` is random timing, the baseline a learned timing
    must beat first: tau drawn uniformly from [0, 1) with the episode's ``rng_seed``
    (`random_tau`), so episode i grows at the same random time in every comparison.

    Example:
        >>> from esper_lightning.hosts.presets import GPT_PRESETS
        >>> stack_controller("4@0.8:identity", GPT_PRESETS["grow4"], ("r1c0",),
        ...                  "transformer").slots
        ('r1c0',)
    """
    depth, tau, init = parse_stack(argument)
    if tau is None:
        if rng_seed is None:
            raise ValueError(f"stack:{argument} draws its tau from the episode's rng_seed; "
                             "none was given")
        tau = random_tau(rng_seed)
    check_named_blueprint(f"stack:{argument}", block_blueprint(init), topology)
    slots = _growth_slots(f"stack:{argument}", depth, host, slot_ids)
    assert host is not None  # _growth_slots refused it
    return StackController(depth, tau, init, host_blocks=host.n_layer, slots=slots,
                           growth_depth=host.growth_depth)


def random_tau(rng_seed: int) -> float:
    """The growth time of ``stack:K@random`` in the episode of ``rng_seed``: uniform in [0, 1)
    from a generator of its own (a salt keeps it apart from the episode's other draws).

    Example:
        >>> random_tau(3) == random_tau(3) and 0.0 <= random_tau(3) < 1.0
        True
    """
    return float(np.random.default_rng((rng_seed, _RANDOM_TAU_SALT)).random())


def born_implants(argument: str, host: GrowingHost | None, slot_ids: Sequence[str],
                  topology: str = "transformer") -> tuple[tuple[str, str], ...]:
    """What ``born:K`` implants at birth: a random-init block seed in every growth slot of
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
    blueprint = block_blueprint("random")
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
            f"({host.n_layer} block(s) + {len(host.growth_slot_ids)} growth slot(s) of "
            f"{host.growth_depth} block(s))")
    missing = [s for s in host.growth_slot_ids if s not in slot_ids]
    if missing:
        raise ConfigError(f"{owner} grows in the growth slots {' '.join(host.growth_slot_ids)}; "
                          f"the run lacks {' '.join(missing)} (--slots {' '.join(slot_ids)})")
    return host.growth_slot_ids
