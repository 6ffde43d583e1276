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
* **Widths**: any stage may say its width, ``<depth>w<width>`` (``S4w64``, a fixed size of width
  64; ``G1w32-4w64@0.1:identity``, born one block of width 32, grown at 0.1 to four blocks of
  width 64); a stage without one is the plan's width (``shape.width``). Heads keep their width
  (``shape.width / shape.n_head``): a wider stage has more of them. At a growth that changes
  both, the model is widened first (`core.width.widen`: function-preserving, its AdamW moments
  carried) and its new blocks are then made from the widened ones; a growth may change the
  width alone (``G2w32-2w64@0.2:identity``). Each width is a multiple of the one before
  (`ArmSpec.width_factors`, checked against the plan's shape by `plan`). ``+reset`` drops the
  widened parameters' AdamW moments at a widening instead of carrying them into the new shapes
  (`core.width.WidthGrowth`'s ``moments="reset"``); ``+clone`` makes a widening's new heads and
  MLP units copies of the old ones (``new_units="clone"``) instead of drawn; either on an arm
  that never widens at the plan's width is refused by `plan`. ``+steady``: a unit with phase
  rates (`plan`'s ``lr_phases``) changes its peak rate at each growth without re-warming from 0
  (the default with phase rates is to re-warm; ``+rewarm`` with ``+steady`` is refused).

Torch-free: plans name arms, and a bad name is refused in one line before anything trains.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from esper_lightning.errors import ConfigError

__all__ = ["OPTIONS", "WIDENING_OPTIONS", "ArmSpec", "parse_arm"]

_STAGE = r"[1-9]\d*(?:w[1-9]\d*)?"
_FIXED = re.compile(rf"S(?P<stage>{_STAGE})")
_GROWING = re.compile(rf"G(?P<stages>{_STAGE}(?:-{_STAGE})+)@(?P<taus>[0-9.]+(?:,[0-9.]+)*)"
                      r":(?P<operator>[a-z][a-z0-9_]*)(?P<options>(?:\+[a-z]+)*)")
#: What a growing arm may add to its operator.
OPTIONS = ("moments", "rewarm", "reset", "steady", "clone")
#: The options that say how a widening goes (refused by `plan` on an arm that never widens).
WIDENING_OPTIONS = ("reset", "clone")
#: The accepted forms, as said in messages.
FORMS = ("S<k>[w<width>] (a GPT born with k blocks, e.g. S4 or S4w64) or "
         "G<d0>[w<width>]-<d1>[w<width>][-...]@<tau1>[,...]:<operator>[+moments][+rewarm]"
         "[+reset][+steady][+clone] "
         "(e.g. G1-4@0.25:identity, G1w32-4w64@0.1:identity)")


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its name, the depths it trains at in order (one: a fixed size), when it grows
    (fractions of its budget, one per growth), how, and with which options."""

    name: str
    depths: tuple[int, ...]
    taus: tuple[float, ...] = ()
    operator: str | None = None
    options: frozenset[str] = frozenset()
    #: Each stage's width (None: the plan's), one per depth; () for an arm that names none.
    widths: tuple[int | None, ...] = ()

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

    def stage_widths(self, base: int) -> tuple[int, ...]:
        """Each stage's width, a stage without one at ``base`` (the plan's width)."""
        named = self.widths or (None,) * len(self.depths)
        return tuple(base if w is None else w for w in named)

    def width_factors(self, base: int) -> tuple[int, ...]:
        """How many times wider each growth makes the model (1: its width stays).

        Raises:
            ConfigError: A width that is not a multiple of the one before (one line).
        """
        widths = self.stage_widths(base)
        for before, after in itertools.pairwise(widths):
            if after % before:
                raise ConfigError(f"arm {self.name!r}: width {after} is not a multiple of the "
                                  f"width {before} before it; accepted: k times it, k an int")
        return tuple(after // before for before, after in itertools.pairwise(widths))

    def events(self, budget: float, base: int | None = None) -> list[tuple[float, int, int]]:
        """``(FLOPs spent at which it grows, blocks it adds, times wider)`` for a run of
        ``budget`` FLOPs (widths against ``base``, the plan's; None: the arm names none)."""
        if self.widths and base is None:
            raise ValueError(f"arm {self.name!r} names widths: its events need the plan's width")
        factors = self.width_factors(base or 1)
        return [(tau * budget, after - before, factor) for tau, before, after, factor
                in zip(self.taus, self.depths[:-1], self.depths[1:], factors, strict=True)]


def parse_arm(name: str) -> ArmSpec:
    """`ArmSpec` of an arm's name (one-line `ConfigError` naming the accepted forms).

    Example:
        >>> parse_arm("S4")
        ArmSpec(name='S4', depths=(4,), taus=(), operator=None, options=frozenset(), widths=())
        >>> arm = parse_arm("G1-2-4@0.2,0.5:copy+moments")
        >>> arm.depths, arm.taus, arm.operator, sorted(arm.options), arm.events(100.0)
        ((1, 2, 4), (0.2, 0.5), 'copy', ['moments'], [(20.0, 1, 1), (50.0, 2, 1)])
        >>> parse_arm("G1w32-4w64@0.1:identity").events(100.0, base=32)  # 3 blocks, 2x wider
        [(10.0, 3, 2)]
    """
    fixed = _FIXED.fullmatch(name)
    if fixed:
        depths, widths = _stages(fixed["stage"])
        return ArmSpec(name, depths, widths=widths)
    growing = _GROWING.fullmatch(name)
    if not growing:
        raise ConfigError(f"unknown arm {name!r}; accepted: {FORMS}")
    depths, widths = _stages(growing["stages"])
    try:
        taus = tuple(float(t) for t in growing["taus"].split(","))
    except ValueError:
        raise ConfigError(f"arm {name!r}: a tau is not a number") from None
    options = frozenset(o for o in growing["options"].split("+") if o)
    if list(depths) != sorted(depths):
        raise ConfigError(f"arm {name!r}: depths must not decrease, got {list(depths)}")
    stages = list(zip(depths, widths or (None,) * len(depths), strict=True))
    if any(a == b for a, b in itertools.pairwise(stages)):
        raise ConfigError(f"arm {name!r}: each growth must add blocks or width, got "
                          f"{name.split('@')[0][1:]}")
    if len(taus) != len(depths) - 1:
        raise ConfigError(f"arm {name!r}: {len(depths) - 1} growth(s) need as many taus, got "
                          f"{len(taus)}")
    if not all(0.0 < t < 1.0 for t in taus) or list(taus) != sorted(taus):
        raise ConfigError(f"arm {name!r}: taus must be in (0, 1) and not decrease, got "
                          f"{list(taus)}")
    if {"rewarm", "steady"} <= options:
        raise ConfigError(f"arm {name!r}: +rewarm re-warms after a growth and +steady does "
                          "not; accepted: one of them")
    unknown = sorted(options - set(OPTIONS))
    if unknown:
        raise ConfigError(f"arm {name!r}: unknown option {unknown[0]!r}; accepted: "
                          f"{', '.join(OPTIONS)}")
    return ArmSpec(name, depths, taus, growing["operator"], options, widths)


def _stages(text: str) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """Depths and widths of ``"1w32-4w64"`` (widths () when no stage names one)."""
    parts = [stage.partition("w") for stage in text.split("-")]
    depths = tuple(int(depth) for depth, _, _ in parts)
    widths = tuple(int(width) if width else None for _, _, width in parts)
    return depths, widths if any(w is not None for w in widths) else ()
