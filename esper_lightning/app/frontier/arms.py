"""The arms of a frontier study, by name.

* ``S<k>``: a GPT born with ``k`` blocks that never grows (a *fixed size*). Fixed sizes make the
  compute-optimal frontier; every budget of one fixed size at one rate is a cooldown branched
  from one shared run (`ArmSpec.branches`).
* ``G<d0>-<d1>[-<d2>...]@<τ1>[,<τ2>...]:<operator>[+moments][+rewarm]``: a GPT born with ``d0``
  blocks that grows to ``d1`` once fraction ``τ1`` of its budget is spent, to ``d2`` at ``τ2``,
  ..., each time adding blocks on top made by a growth operator (`blueprints.growth`: ``copy``,
  ``identity``, ``random``) from the blocks below (one block grown to four: three copies of it;
  two to four: both, in order). ``+moments`` starts copied blocks from their sources' AdamW
  moments; ``+rewarm`` re-warms the learning rate after each growth (linearly from 0 over the
  study's warmup compute). It is born with the residual-projection init of its final depth.
  ``G1-4@0.25:identity``; ``G1-2-4@0.2,0.5:copy+moments``.

Torch-free: plans name arms, and a bad name is refused in one line before anything trains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from esper_lightning.errors import ConfigError

__all__ = ["OPTIONS", "ArmSpec", "parse_arm"]

_FIXED = re.compile(r"S(?P<depth>[1-9]\d*)")
_GROWING = re.compile(r"G(?P<depths>[1-9]\d*(?:-[1-9]\d*)+)@(?P<taus>[0-9.]+(?:,[0-9.]+)*)"
                      r":(?P<operator>[a-z][a-z0-9_]*)(?P<options>(?:\+[a-z]+)*)")
#: What a growing arm may add to its operator.
OPTIONS = ("moments", "rewarm")
#: The accepted forms, as said in messages.
FORMS = ("S<k> (a GPT born with k blocks, e.g. S4) or G<d0>-<d1>[-...]@<tau1>[,...]:<operator>"
         "[+moments][+rewarm] (e.g. G1-4@0.25:identity)")


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its name, the depths it trains at in order (one: a fixed size), when it grows
    (fractions of its budget, one per growth), how, and with which options."""

    name: str
    depths: tuple[int, ...]
    taus: tuple[float, ...] = ()
    operator: str | None = None
    options: frozenset[str] = frozenset()

    @property
    def fixed(self) -> bool:
        """Whether it never grows (one of the fixed sizes the frontier is made of)."""
        return len(self.depths) == 1

    @property
    def branches(self) -> bool:
        """Whether its budgets share one run up to each budget's decay: true when nothing it
        does depends on the budget before the decay (a fixed size)."""
        return self.fixed

    @property
    def final_depth(self) -> int:
        return self.depths[-1]

    def events(self, budget: float) -> list[tuple[float, int]]:
        """``(FLOPs spent at which it grows, blocks it adds)`` for a run of ``budget`` FLOPs."""
        return [(tau * budget, after - before) for tau, before, after
                in zip(self.taus, self.depths[:-1], self.depths[1:], strict=True)]


def parse_arm(name: str) -> ArmSpec:
    """`ArmSpec` of an arm's name (one-line `ConfigError` naming the accepted forms).

    Example:
        >>> parse_arm("S4")
        ArmSpec(name='S4', depths=(4,), taus=(), operator=None, options=frozenset())
        >>> arm = parse_arm("G1-2-4@0.2,0.5:copy+moments")
        >>> arm.depths, arm.taus, arm.operator, sorted(arm.options), arm.events(100.0)
        ((1, 2, 4), (0.2, 0.5), 'copy', ['moments'], [(20.0, 1), (50.0, 2)])
    """
    fixed = _FIXED.fullmatch(name)
    if fixed:
        return ArmSpec(name, (int(fixed["depth"]),))
    growing = _GROWING.fullmatch(name)
    if not growing:
        raise ConfigError(f"unknown arm {name!r}; accepted: {FORMS}")
    depths = tuple(int(d) for d in growing["depths"].split("-"))
    try:
        taus = tuple(float(t) for t in growing["taus"].split(","))
    except ValueError:
        raise ConfigError(f"arm {name!r}: a tau is not a number") from None
    options = frozenset(o for o in growing["options"].split("+") if o)
    if list(depths) != sorted(set(depths)):
        raise ConfigError(f"arm {name!r}: depths must increase, got {list(depths)}")
    if len(taus) != len(depths) - 1:
        raise ConfigError(f"arm {name!r}: {len(depths) - 1} growth(s) need as many taus, got "
                          f"{len(taus)}")
    if not all(0.0 < t < 1.0 for t in taus) or list(taus) != sorted(taus):
        raise ConfigError(f"arm {name!r}: taus must be in (0, 1) and not decrease, got "
                          f"{list(taus)}")
    unknown = sorted(options - set(OPTIONS))
    if unknown:
        raise ConfigError(f"arm {name!r}: unknown option {unknown[0]!r}; accepted: "
                          f"{', '.join(OPTIONS)}")
    return ArmSpec(name, depths, taus, growing["operator"], options)
