"""A frontier study's plan: what is trained, at which budgets and rates, on which episodes.

A plan is a small JSON file, committed before the study's first episode when the study is a
final table (pre-registration): its arms, budgets, learning rates, episodes and root rng seed
are fixed there, and `esper_lightning.app.frontier.study` only executes it. Reading a plan
imports no torch, so a bad one is refused in one line before anything trains.

Example plan (fixed-size arms tuned on a 5-point learning-rate grid)::

    {
      "name": "w32-tuning",
      "purpose": "tuning",
      "shape": {"width": 32, "n_head": 4, "block_size": 32, "batch_size": 32},
      "base_flops": 1.2e12,
      "budgets": [0.25, 0.5, 1, 2, 4],
      "warmup_flops": 1e10,
      "arms": [{"arm": "S1", "lr": [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]},
               {"arm": "S4", "lr": {"0.25": 1.6e-2, "1": 8e-3}, "budgets": [0.25, 1]}],
      "episodes": 2,
      "rng_seed": 100
    }

An arm's ``lr`` is one rate, a list (a grid: every rate at every budget, for tuning) or a map
from budget (as written in ``budgets``) to its rate (a tuned plan). ``budgets`` are multiples
of ``base_flops``; an arm may list its own. A ``tuning`` study evaluates the validation split
only; a ``final`` study evaluates validation and test, and its tables read test alone.

A growing arm may instead, or as well, take ``lr_phases``: a *phase rate*, one rate per phase
(``[before growth, after growth]`` for one growth), in the same three forms: one phase rate for
every budget (``[8e-3, 8e-3]``), a list of them (a grid: ``[[4e-3, 8e-3], [8e-3, 8e-3]]``) or a
map from budget to one phase rate or a list of them (``{"1": [8e-3, 8e-3], "2": [[4e-3, 8e-3],
[8e-3, 8e-3]]}``). Its peak rate changes at each growth and re-warms linearly from 0 over the
plan's ``warmup_flops`` after it (`train`). With both keys an arm trains every rate of either,
and every budget needs one from one of them; a unit is one arm at one rate or one phase rate.

**Curves** (``"curve_points": 16``): every run is also read at that many points at equal FLOP
intervals of its own budget (after the first step to pass ``k/16`` of it, k = 1..16; the last point
is the end of the run), on ``curve_blocks`` blocks of the split the study's tables read
(`Plan.curve_split`: validation in tuning, test in a final, so that no reading of a final table
looks at the blocks its rates were chosen on) spread evenly over the split (default 128,
`DEFAULT_CURVE_BLOCKS`), and each row carries its run's curve
(`train`). The points are read outside the budget, like the end-of-budget evaluation: they
train nothing, draw no random numbers and their time is kept out of ``wall_s``. A point costs
``curve_blocks × block_size`` tokens of forward passes, about ``curve_blocks / (3 ×
batch_size)`` training steps (one forward is about a third of a step): 128 blocks at a batch of
32 are 1.3 steps a point, 21 steps for 16 points, 0.7 % of a width-32 S4 run at 1.2 TFLOP
(2,981 steps) and 5.7 % at 0.125 of it; each row says the FLOPs its curve cost
(``curve_flops``). A fixed size's budgets branch from one run (`arms.ArmSpec.branches`), so the
points of a budget's curve before its decay lie on that shared run: the curve of the largest
budget before its decay is the WSD stable phase the growth literature reads.

**One long schedule** (an arm's ``"long_schedule": "cosine"`` or ``"linear"``, with curves):
besides its budgets the arm trains one run of the plan's largest budget (over every arm's,
`Plan.long_budget`) that warms up as every run does and then decays once, by a half cosine or
linearly, from the end of the warmup to ``min_lr_ratio`` at the end, at each rate it has at its
own largest budget, and its curve is read mid-run: the schedule on which the literature reads a
grown model against the same size trained from scratch (`estimators.literature`). Its row has
``schedule`` set; the frontier's rows (fully decayed at each budget) have none.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esper_lightning.app.frontier.arms import WIDENING_OPTIONS, ArmSpec, parse_arm
from esper_lightning.errors import ConfigError, read_json_file

__all__ = ["DEFAULT_CURVE_BLOCKS", "LONG_SCHEDULES", "PURPOSES", "ArmPlan", "Plan", "Rate",
           "Shape", "Unit", "episode_rng_seed", "rate_text", "read_plan", "row_rate"]

#: What a study is for: ``tuning`` decides (validation split), ``final`` reports (test split).
PURPOSES = ("tuning", "final")
#: The splits each purpose evaluates at the end of every budget.
SPLITS = {"tuning": ("validation",), "final": ("validation", "test")}
#: Mixed into the root rng seed for the episodes' seeds (apart from every other stream).
_EPISODE_STREAM = 0xF407
#: The decays of one long schedule (an arm's ``long_schedule``).
LONG_SCHEDULES = ("cosine", "linear")
#: Validation blocks a curve point reads when the plan names no ``curve_blocks``.
DEFAULT_CURVE_BLOCKS = 128

#: What a unit trains at: one rate throughout (a number) or one per phase (a tuple, `lr_phases`).
Rate = float | tuple[float, ...]


def rate_order(rate: Rate) -> tuple[int, tuple[float, ...]]:
    """A sort key over rates: the single rates by value, then the phase rates."""
    return (1, rate) if isinstance(rate, tuple) else (0, (rate,))


def rate_text(rate: Rate) -> str:
    """A rate as tables print it: ``0.004``, or a phase rate ``0.004→0.008``.

    Example:
        >>> rate_text(0.004), rate_text((0.004, 0.008))
        ('0.004', '0.004→0.008')
    """
    return "→".join(f"{r:g}" for r in rate) if isinstance(rate, tuple) else f"{rate:g}"


def row_rate(row: Mapping[str, Any]) -> Rate:
    """The rate a row was trained at: its ``lr_phases`` where it has them (a row of an older
    study has none), else its ``lr``."""
    phases = row.get("lr_phases")
    return tuple(phases) if phases else row["lr"]


@dataclass(frozen=True)
class Shape:
    """Everything of a training step but depth: the GPT's width, heads, sequence and batch."""

    width: int = 32
    n_head: int = 4
    block_size: int = 32
    batch_size: int = 32

    def __post_init__(self) -> None:
        for name in ("width", "n_head", "block_size", "batch_size"):
            _check_int(f"shape.{name}", getattr(self, name), 1)
        if self.width % self.n_head:
            raise ConfigError(f"shape.n_head={self.n_head} must divide shape.width="
                              f"{self.width}")


@dataclass(frozen=True)
class ArmPlan:
    """One arm of a plan: its spec, its budgets (multiples of the base) and the rate at each.

    ``lrs`` maps each budget to the rates it trains at (one, or a tuning grid; each a number or
    a phase rate, `Rate`), in `rate_order`; ``long_schedule`` the decay of its one long run
    (`LONG_SCHEDULES`), None for none."""

    spec: ArmSpec
    budgets: tuple[float, ...]
    lrs: Mapping[float, tuple[Rate, ...]]
    long_schedule: str | None = None


@dataclass(frozen=True)
class Unit:
    """What one worker trains in one go: one arm, one rate, one episode, and every budget of the
    arm at that rate (branched from one run when the arm allows it, `ArmSpec.branches`).

    ``lr`` is the rate the run is born with; ``phases``, when given, the rate of each of its
    phases (``lr`` is then the first); ``schedule`` the decay of a long run (`LONG_SCHEDULES`:
    one run of its one budget, read mid-run), None for the frontier's runs."""

    arm: ArmSpec
    lr: float
    episode: int
    rng_seed: int
    budgets: tuple[float, ...]
    phases: tuple[float, ...] = ()
    schedule: str | None = None

    @property
    def rate(self) -> Rate:
        """The unit's `Rate`: its phase rate, or its one rate."""
        return self.phases or self.lr

    @property
    def key(self) -> tuple[str, Rate, int]:
        return (self.arm.name, self.rate, self.episode)


@dataclass(frozen=True)
class Plan:
    """A parsed plan (see the module docstring); `units` lists the work."""

    name: str
    purpose: str
    shape: Shape
    base_flops: float
    warmup_flops: float
    arms: tuple[ArmPlan, ...]
    episodes: int
    rng_seed: int
    decay_fraction: float = 0.2
    min_lr_ratio: float = 0.0
    first_episode: int = 0
    curve_points: int = 0
    curve_blocks: int = 0
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def splits(self) -> tuple[str, ...]:
        return SPLITS[self.purpose]

    @property
    def curve_split(self) -> str:
        """The split a curve point reads: the one the study's tables read (a final's test)."""
        return self.splits[-1]

    @property
    def long_budget(self) -> float:
        """The budget (FLOPs) of every long run: the largest any arm trains."""
        return max(b for arm in self.arms for b in arm.budgets) * self.base_flops

    def episode_rng_seeds(self) -> list[int]:
        return [episode_rng_seed(self.rng_seed, e)
                for e in range(self.first_episode, self.first_episode + self.episodes)]

    def units(self) -> Iterator[Unit]:
        """Every unit, episode by episode (an interrupted study has whole episodes done)."""
        for episode, rng_seed in enumerate(self.episode_rng_seeds(), self.first_episode):
            for arm in self.arms:
                for rate in sorted({r for rates in arm.lrs.values() for r in rates},
                                   key=rate_order):
                    budgets = tuple(b * self.base_flops for b in arm.budgets
                                    if rate in arm.lrs[b])
                    yield _unit(arm, rate, episode, rng_seed, budgets)
                if arm.long_schedule is not None:  # at the rates of its own largest budget
                    for rate in arm.lrs[max(arm.budgets)]:
                        yield _unit(arm, rate, episode, rng_seed, (self.long_budget,),
                                    arm.long_schedule)


def _unit(arm: ArmPlan, rate: Rate, episode: int, rng_seed: int, budgets: tuple[float, ...],
          schedule: str | None = None) -> Unit:
    """The unit of ``arm`` at ``rate`` (one rate, or a phase rate whose first is ``lr``)."""
    if isinstance(rate, tuple):
        return Unit(arm.spec, rate[0], episode, rng_seed, budgets, rate, schedule)
    return Unit(arm.spec, rate, episode, rng_seed, budgets, schedule=schedule)


def episode_rng_seed(root: int, episode: int) -> int:
    """The rng seed of episode ``episode`` of a study rooted at ``root`` (a 31-bit integer mixed
    from both: every arm plays episode ``e`` with it, so arms are paired by episode).

    Example:
        >>> episode_rng_seed(7, 0) == episode_rng_seed(7, 0) != episode_rng_seed(7, 1)
        True
    """
    state = np.random.SeedSequence([root, _EPISODE_STREAM, episode]).generate_state(1)
    return int(state[0]) & 0x7FFFFFFF


def read_plan(path: str | Path) -> Plan:
    """Parse and check a plan file; one-line `ConfigError` naming what is wrong."""
    file = Path(path)
    data = read_json_file(file, "plan")
    if not isinstance(data, dict):
        raise ConfigError(f"plan '{file}' must hold a JSON object, got {type(data).__name__}")
    return parse_plan(data)


_KEYS = {"name", "purpose", "shape", "base_flops", "budgets", "warmup_flops", "arms", "episodes",
         "rng_seed", "decay_fraction", "min_lr_ratio", "first_episode", "notes", "curve_points",
         "curve_blocks"}


def parse_plan(data: Mapping[str, Any]) -> Plan:
    """`Plan` from its JSON object (see the module docstring)."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"unknown plan key {unknown[0]!r}; accepted: {', '.join(sorted(_KEYS))}")
    for key in ("name", "purpose", "base_flops", "budgets", "warmup_flops", "arms", "episodes",
                "rng_seed"):
        if key not in data:
            raise ConfigError(f"the plan lacks {key!r}")
    purpose = data["purpose"]
    if purpose not in PURPOSES:
        raise ConfigError(f"unknown purpose {purpose!r}; accepted: {', '.join(PURPOSES)}")
    shape = data.get("shape", {})
    if not isinstance(shape, dict) or set(shape) - {"width", "n_head", "block_size",
                                                    "batch_size"}:
        raise ConfigError(f"shape must be an object of width, n_head, block_size, batch_size; "
                          f"got {shape!r}")
    base = _positive("base_flops", data["base_flops"])
    budgets = _budgets("budgets", data["budgets"])
    arms = data["arms"]
    if not isinstance(arms, list) or not arms:
        raise ConfigError("arms must be a non-empty list of {\"arm\": ..., \"lr\": ...} objects")
    plan = Plan(
        name=str(data["name"]), purpose=purpose, shape=Shape(**shape), base_flops=base,
        warmup_flops=_positive("warmup_flops", data["warmup_flops"]),
        arms=tuple(_arm(a, budgets) for a in arms),
        episodes=_check_int("episodes", data["episodes"], 1),
        rng_seed=_check_int("rng_seed", data["rng_seed"], 0),
        decay_fraction=_fraction("decay_fraction", data.get("decay_fraction", 0.2)),
        min_lr_ratio=_fraction("min_lr_ratio", data.get("min_lr_ratio", 0.0), closed=True),
        first_episode=_check_int("first_episode", data.get("first_episode", 0), 0),
        **_curves(data),
        source=dict(data),
    )
    for arm in plan.arms:
        _check_widths(arm.spec, plan.shape)
        if arm.long_schedule is not None and not plan.curve_points:
            raise ConfigError(f"{arm.spec.name}: long_schedule is read mid-run, on curves; "
                              "accepted with the plan's curve_points only")
    names = [a.spec.name for a in plan.arms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"arm {twice[0]!r} is listed twice; list each arm once")
    smallest = min(b for a in plan.arms for b in a.budgets) * base
    if plan.warmup_flops > (1.0 - plan.decay_fraction) * smallest:
        raise ConfigError(f"warmup_flops={plan.warmup_flops:g} outlasts the stable phase of the "
                          f"smallest budget ({smallest:g} FLOPs); accepted: at most "
                          f"{(1.0 - plan.decay_fraction) * smallest:g}")
    return plan


def _curves(data: Mapping[str, Any]) -> dict[str, int]:
    """The plan's ``curve_points`` and ``curve_blocks`` (0 and 0: no curves)."""
    if "curve_points" not in data:
        if "curve_blocks" in data:
            raise ConfigError("curve_blocks is the size of a curve point's evaluation; accepted "
                              "with curve_points only")
        return {"curve_points": 0, "curve_blocks": 0}
    return {"curve_points": _check_int("curve_points", data["curve_points"], 2),
            "curve_blocks": _check_int("curve_blocks",
                                       data.get("curve_blocks", DEFAULT_CURVE_BLOCKS), 1)}


def _check_widths(spec: ArmSpec, shape: Shape) -> None:
    """Every width ``spec`` names holds whole heads of the shape's head width, each is a
    multiple of the one before, and an option for a widening has one (one line each)."""
    head = shape.width // shape.n_head
    for width in spec.stage_widths(shape.width):
        if width % head:
            raise ConfigError(f"arm {spec.name!r}: width {width} is not a whole number of heads "
                              f"of width {head} (shape.width / shape.n_head); accepted: "
                              f"multiples of {head}")
    factors = spec.width_factors(shape.width)
    widening = sorted(spec.options & set(WIDENING_OPTIONS))
    if widening and all(k == 1 for k in factors):
        raise ConfigError(f"arm {spec.name!r}: +{widening[0]} says how a widening goes and this "
                          f"arm never widens (plan width {shape.width}); accepted: stages of "
                          f"growing width (e.g. G1w32-4w64@0.1:identity+{widening[0]}), or no "
                          f"+{widening[0]}")


def _arm(item: Any, budgets: tuple[float, ...]) -> ArmPlan:
    if not isinstance(item, dict) or "arm" not in item or not {"lr", "lr_phases"} & set(item):
        raise ConfigError(f"each arm is an object with 'arm' and 'lr' (or 'lr_phases'), got "
                          f"{item!r}")
    extra = sorted(set(item) - {"arm", "lr", "lr_phases", "budgets", "long_schedule"})
    if extra:
        raise ConfigError(f"unknown arm key {extra[0]!r}; accepted: arm, lr, lr_phases, budgets, "
                          "long_schedule")
    spec = parse_arm(str(item["arm"]))
    own = _budgets(f"{spec.name}: budgets", item["budgets"]) if "budgets" in item else budgets
    rates: dict[float, set[Rate]] = {b: set() for b in own}
    if "lr" in item:
        for budget, grid in _lr(spec, item["lr"], own).items():
            rates[budget].update(grid)
    if "lr_phases" in item:
        for budget, grid in _lr_phases(spec, item["lr_phases"], own).items():
            rates[budget].update(grid)
    missing = [b for b in own if not rates[b]]
    if missing:
        raise ConfigError(f"{spec.name}: no lr for budget {missing[0]:g}; the lr map needs "
                          f"one rate per budget ({', '.join(f'{b:g}' for b in own)})")
    long = item.get("long_schedule")
    if long is not None and long not in LONG_SCHEDULES:
        raise ConfigError(f"{spec.name}: unknown long_schedule {long!r}; accepted: "
                          f"{', '.join(LONG_SCHEDULES)}")
    return ArmPlan(spec, own, {b: tuple(sorted(r, key=rate_order)) for b, r in rates.items()},
                   long)


def _lr(spec: ArmSpec, lr: Any, own: tuple[float, ...]) -> dict[float, tuple[float, ...]]:
    """``lr``'s rates per budget: one rate, a grid (a list) or a map from budget to a rate."""
    if isinstance(lr, dict):
        rates = {}
        for key, value in lr.items():
            if isinstance(value, list) and not spec.fixed:  # the likely meaning of a list here
                raise ConfigError(f"{spec.name}: lr for budget {key!r} is a list, {value!r}; an "
                                  f"lr map takes one rate per budget, and a rate per phase goes "
                                  f"in lr_phases")
            rates[_budget_key(spec.name, key, own)] = (_positive(f"{spec.name}: lr", value),)
        return rates
    grid = lr if isinstance(lr, list) else [lr]
    if not grid:
        raise ConfigError(f"{spec.name}: lr is an empty list")
    return {b: tuple({_positive(f"{spec.name}: lr", r) for r in grid}) for b in own}


def _lr_phases(spec: ArmSpec, value: Any,
               own: tuple[float, ...]) -> dict[float, tuple[tuple[float, ...], ...]]:
    """``lr_phases``'s phase rates per budget: one phase rate (a list of numbers, one per
    phase), a grid of them (a list of such lists), or a map from budget to either."""
    if spec.fixed:
        raise ConfigError(f"{spec.name}: lr_phases is for a growing arm (one rate per phase); "
                          f"a fixed size takes lr")
    if isinstance(value, dict):
        return {_budget_key(spec.name, key, own): _phase_grid(spec, v)
                for key, v in value.items()}
    grid = _phase_grid(spec, value)
    return {b: grid for b in own}


def _phase_grid(spec: ArmSpec, value: Any) -> tuple[tuple[float, ...], ...]:
    """One phase rate, or a non-empty list of them, as a tuple of phase rates."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return tuple(dict.fromkeys(_phase_rate(spec, v) for v in value))
    return (_phase_rate(spec, value),)


def _phase_rate(spec: ArmSpec, value: Any) -> tuple[float, ...]:
    phases = len(spec.depths)
    if not isinstance(value, list) or len(value) != phases:
        raise ConfigError(f"{spec.name}: lr_phases needs one rate per phase ({phases}: "
                          f"{' -> '.join(map(str, spec.depths))} blocks), or a list of such "
                          f"lists; got {value!r}")
    return tuple(_positive(f"{spec.name}: lr_phases", r) for r in value)


def _budget_key(arm: str, key: str, budgets: tuple[float, ...]) -> float:
    try:
        value = float(key)
    except ValueError:
        value = math.nan
    if value not in budgets:
        raise ConfigError(f"{arm}: lr for budget {key!r}, which the arm does not train; "
                          f"accepted: {', '.join(f'{b:g}' for b in budgets)}")
    return value


def _budgets(name: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{name} must be a non-empty list of multiples of base_flops, "
                          f"got {value!r}")
    budgets = tuple(_positive(name, v) for v in value)
    if len(set(budgets)) != len(budgets):
        raise ConfigError(f"{name} lists a budget twice: {list(value)}")
    return tuple(sorted(budgets))


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


def _fraction(name: str, value: Any, closed: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (
        0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0)
    if not ok:
        interval = "[0, 1]" if closed else "(0, 1)"
        raise ConfigError(f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value
