"""Scripted depth growth: stack block seeds at a fixed fraction of the run, and its baselines.

`StackController` grows a host to ``depth`` blocks once fraction ``tau`` of the run is spent
(`EpochReport.spent_fraction`: the compute budget's fraction under a budget, else the epochs
done over the planned ones), with block seeds of one init (``copy``, ``identity``, ``random``;
`blueprints.block`). It is the scripted schedule growth is measured with: a learned or
compute-aware controller has to beat "stack at tau".

`compare` names them ``stack:K@TAU[:INIT]`` (`stack_controller`) and the host born that deep
``born:K`` (`born_implants`): the same host preset, with ``K - 1`` random-init block seeds
implanted fully blended at epoch 0, which is exactly a ``K``-block network (the "born big"
baseline, S_K, spending its budget on fewer tokens).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from esper_lightning.blueprints.block import BLOCK_INITS, block_blueprint
from esper_lightning.controllers.base import (
    WAIT,
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
#: ``K@TAU[:INIT]`` (the argument of ``stack:``).
_STACK = re.compile(r"(?P<depth>\d+)@(?P<tau>[0-9.]+)(?::(?P<init>[a-z]+))?")
#: What it does first, for the first of its slots in order where the masks allow it: finish
#: incubations, then germinate the next block, then move blended seeds on and keep them. Each
#: step frees the next: a seed past TRAINING lets the next one germinate.
_ORDER: tuple[tuple[LifecycleOp, frozenset[SeedStage]], ...] = (
    (LifecycleOp.ADVANCE, frozenset({SeedStage.GERMINATED, SeedStage.TRAINING})),
    (LifecycleOp.GERMINATE, frozenset({SeedStage.DORMANT})),
    (LifecycleOp.ADVANCE, frozenset({SeedStage.BLENDING})),
    (LifecycleOp.FOSSILIZE, frozenset({SeedStage.HOLDING})),
)


class StackController(ControllerBase):
    """Grow to ``depth`` blocks at fraction ``tau`` of the run, as fast as the lifecycle allows.

    Until ``report.spent_fraction >= tau`` it waits. Then, one action per decision, it
    germinates a block seed of ``init`` in each of its slots in order, advances each through
    TRAINING and BLENDING and fossilizes it (block seeds incubate one epoch and blend in one:
    `blueprints.block`). Three seeds on a 1-block host take 9 decisions to reach 4 blocks at
    alpha 1 (germinate, to TRAINING, to BLENDING, per seed; the next seed germinates once the
    previous one blends) and 6 more to fossilize all three.

    Growth chains: each block seed builds on the block its slot follows, so on ``grow4`` a
    ``copy`` in ``r1c1`` copies the seed in ``r1c0``.

    Args:
        depth: Blocks of the grown host (``host_blocks`` plus the seeds it grows).
        tau: Fraction of the run in [0, 1) after which it grows.
        init: ``copy``, ``identity`` or ``random`` (`blueprints.block.BLOCK_INITS`).
        host_blocks: Blocks the host has before growing.
        slots: Slot ids to grow in, in this order (as many as seeds); None: the last
            ``depth - host_blocks`` slots of the report (a GPT host's growth slots ``r1c*``
            come last in action order).

    Raises:
        ConfigError: For a depth not above ``host_blocks``, a ``tau`` outside [0, 1), an
            unknown init, or a list of slots of the wrong length.

    Example:
        >>> StackController(depth=4, tau=0.5, init="identity").blueprint
        'block_identity'
    """

    def __init__(self, depth: int, tau: float, init: str = "copy", host_blocks: int = 1,
                 slots: Sequence[str] | None = None) -> None:
        if host_blocks < 1 or depth <= host_blocks:
            raise ConfigError(f"stack: depth {depth} must exceed the host's {host_blocks} "
                              "block(s)")
        if not 0.0 <= tau < 1.0:
            raise ConfigError(f"stack: tau must be in [0, 1), got {tau}")
        if init not in BLOCK_INITS:
            raise ConfigError(f"stack: unknown init {init!r}; accepted: "
                              f"{', '.join(BLOCK_INITS)}")
        self.depth, self.tau, self.init, self.host_blocks = depth, float(tau), init, host_blocks
        self.blueprint = block_blueprint(init)
        self.slots = None if slots is None else tuple(slots)
        self._checked: tuple[str, tuple[str, ...]] | None = None
        if self.slots is not None and len(self.slots) != self.n_seeds:
            raise ConfigError(f"stack: {self.n_seeds} block seed(s) need as many slots, got "
                              f"{list(self.slots)}")

    @property
    def n_seeds(self) -> int:
        """Block seeds it grows."""
        return self.depth - self.host_blocks

    def decide(self, report: EpochReport) -> Action:
        context = (report.topology, report.mask_context.blueprints)
        if self._checked != context:  # once per run: a refused blueprint never silently waits
            self.check_blueprints(*context)
            self._checked = context
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


def parse_stack(argument: str) -> tuple[int, float, str]:
    """``K@TAU[:INIT]`` -> (depth, tau, init); INIT defaults to ``copy``.

    Example:
        >>> parse_stack("4@0.5:identity")
        (4, 0.5, 'identity')

    Raises:
        ConfigError: One line naming the bad argument and the accepted form.
    """
    match = _STACK.fullmatch(argument)
    if match is None:
        raise ConfigError(f"bad stack spec 'stack:{argument}'; accepted: stack:K@TAU[:INIT] "
                          f"with INIT one of {', '.join(BLOCK_INITS)} (e.g. stack:4@0.5:copy)")
    try:
        tau = float(match["tau"])
    except ValueError:
        raise ConfigError(f"bad stack spec 'stack:{argument}': TAU {match['tau']!r} is not a "
                          "number") from None
    return int(match["depth"]), tau, match["init"] or "copy"


def stack_controller(argument: str, host_blocks: int, slot_ids: Sequence[str],
                     topology: str) -> StackController:
    """The controller of ``stack:K@TAU[:INIT]`` on a host of ``host_blocks`` blocks playing
    ``slot_ids`` of ``topology``; refused in one line when those slots cannot hold its seeds."""
    depth, tau, init = parse_stack(argument)
    controller = StackController(depth, tau, init, host_blocks=host_blocks)
    check_named_blueprint(f"stack:{argument}", controller.blueprint, topology)
    if len(slot_ids) < controller.n_seeds:
        raise ConfigError(f"stack:{argument} grows {controller.n_seeds} block seed(s) but the "
                          f"run has {len(slot_ids)} slot(s): {', '.join(slot_ids)}")
    return controller


def born_implants(argument: str, host_blocks: int, slot_ids: Sequence[str],
                  topology: str = "transformer") -> tuple[tuple[str, str], ...]:
    """What ``born:K`` implants at birth: a random-init block seed in each of the last
    ``K - host_blocks`` slots (the ones `StackController` grows in), fully blended from epoch
    0, so the host is a ``K``-block network from the start.

    Example:
        >>> born_implants("4", host_blocks=1, slot_ids=("r1c0", "r1c1", "r1c2"))
        (('r1c0', 'block_random'), ('r1c1', 'block_random'), ('r1c2', 'block_random'))
    """
    if not argument.isdigit():
        raise ConfigError(f"bad born spec 'born:{argument}'; accepted: born:K, K the depth "
                          "(e.g. born:4)")
    n_seeds = int(argument) - host_blocks
    if not 1 <= n_seeds <= len(slot_ids):
        raise ConfigError(f"born:{argument} on a host of {host_blocks} block(s) needs between "
                          f"1 and {len(slot_ids)} block seeds (its slots: {', '.join(slot_ids)})")
    blueprint = block_blueprint("random")
    check_named_blueprint(f"born:{argument}", blueprint, topology)
    return tuple((slot_id, blueprint) for slot_id in slot_ids[len(slot_ids) - n_seeds:])
