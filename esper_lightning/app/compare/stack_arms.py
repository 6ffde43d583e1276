"""The arm grammar of depth growth: ``stack:K@TAU[:OPERATOR]`` and ``born:K``, as ``compare``
(`app.compare.arms`) and the lookup read them.

``stack:K@TAU[:OPERATOR]`` is a `controllers.StackController` (`stack_controller`): ``TAU`` may
list one time per growth slot, ``0.2,0.5``, where a later slot's 1 means it never grows
(``0.3,1``), or be ``random`` (one tau per growth slot drawn from the episode's rng seed:
`random_taus`); ``OPERATOR`` is a growth operator (``copy`` by default). ``born:K`` is the host
born that deep (`born_implants`): the same host preset, with a random-init growth seed
implanted fully blended in every growth slot at epoch 0, which is exactly a ``K``-block network
(the "born big" baseline, spending its budget on fewer tokens). ``K`` is the host's grown depth
(`GPTConfig.max_depth`), for both; every refusal is one `ConfigError` line naming the spec and
what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from esper_lightning.blueprints.growth import growth_blueprint, operators
from esper_lightning.controllers.base import check_named_blueprint
from esper_lightning.controllers.stack import StackController
from esper_lightning.errors import ConfigError

#: Mixed into an episode's rng seed for ``stack:K@random``'s draw of tau.
_RANDOM_TAU_SALT = 0x7A0
#: ``K@TAU[,TAU...][:OPERATOR]`` (the argument of ``stack:``).
_STACK = re.compile(r"(?P<depth>\d+)@(?P<tau>[0-9.,]+|random)(?::(?P<operator>[a-z][a-z0-9_]*))?")


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
    # The host first: a host without growth slots (a CNN) is the problem, not the blueprint.
    slots = _growth_slots(f"stack:{argument}", depth, host, slot_ids)
    check_named_blueprint(f"stack:{argument}", growth_blueprint(operator), topology)
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
    slots = _growth_slots(f"born:{argument}", int(argument), host, slot_ids)
    check_named_blueprint(f"born:{argument}", blueprint, topology)
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
