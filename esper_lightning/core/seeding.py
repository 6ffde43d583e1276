"""`SeedingConfig`: how seeds grow in a run, as one value passed whole.

The engine (`MorphogenesisEngine(model, slots, seeding=...)`), the Trainer callback
(`MorphogenesisCallback(controller, seeding=...)`, whose keyword arguments of the same names are a
shorthand that builds one: `with_shorthand`) and the RL envs (`EnvSpec(seeding=...)`) take this
one dataclass, and the command line builds one from its task configuration
(`app.task.seeding_config`), so each option is declared, documented and checked here once.

Example:
    >>> seeding = SeedingConfig(blend_gradient="detached", max_seeds=2)
    >>> SeedingConfig.from_dict(seeding.to_dict()) == seeding
    True
    >>> with_shorthand(seeding, "example", seed_lr=0.01).seed_optim.lr
    0.01
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from esper_lightning.core.lifecycle import GateConfig, GateMode, QualityGates
from esper_lightning.core.optim import SeedOptimConfig
from esper_lightning.core.slots import check_blend_gradient, check_layer_scale_init
from esper_lightning.core.timing import DecisionPlan, Duration, SeedTiming

#: Optimizer steps between gradient-health measurements (each epoch's first step is measured too).
GRAD_STATS_EVERY = 25
#: The keyword shorthand of `MorphogenesisCallback`: keyword -> (field, part of ``seed_optim``).
SHORTHAND: dict[str, tuple[str, str | None]] = {
    "blueprints": ("blueprints", None),
    "max_seeds": ("max_seeds", None),
    "gate_mode": ("gate_mode", None),
    "gate_config": ("gate_config", None),
    "blend_gradient": ("blend_gradient", None),
    "layer_scale_init": ("layer_scale_init", None),
    "seed_lr": ("seed_optim", "lr"),
    "seed_momentum": ("seed_optim", "momentum"),
    "seed_weight_decay": ("seed_optim", "weight_decay"),
    "grad_stats_every": ("grad_stats_every", None),
    "timing": ("timing", None),
}


@dataclass(frozen=True)
class SeedingConfig:
    """How seeds grow in every slot of a run: the one place each option is documented.

    None means "leave it to each slot" (its own gates, blend gradient and LayerScale gain, as
    the model built it; slots injected after named modules are permissive, ``"through"``,
    1e-3) or "no limit".

    Attributes:
        blueprints: blueprint names a controller may germinate (None: every one of the slots'
            topology; growth blueprints ``block_*`` only where a slot grows depth). Checked
            against the registry once the topology is known (`MorphogenesisEngine`).
        max_seeds: maximum seeds present at once (None: unlimited).
        gate_mode: the quality gates' mode, ``"permissive"`` or ``"strict"`` (`GateMode`), for
            every slot (None: each slot keeps its own).
        gate_config: `GateConfig` thresholds for every slot (None: each slot keeps its own; the
            default's G2 incubation of 10 decisions suits long runs).
        blend_gradient: ``"through"`` or ``"detached"``: whether host layers before a BLENDING
            seed learn through it, or the seed's input is detached from the host so they get
            only ``1 - alpha`` of their gradient (`core.slots.SeedSlot`; docs/evidence.md
            measures both). None: each slot keeps its own, ``"through"`` by default.
        layer_scale_init: initial gain of every LayerScale in a new seed, a number >= 0 (None:
            the blueprints' own, 1e-3 for the built-ins; `blueprints.build`).
        seed_optim: hyper-parameters of the seeds' param groups ``seed/<slot>``
            (`core.optim.SeedOptimConfig`: ``lr``, ``momentum``, ``weight_decay``; None in it
            copies the host group's value).
        grad_stats_every: measure seed gradient health every this many optimizer steps (and
            on each epoch's first step), an int >= 1, by every adapter alike.
        timing: lifecycle durations (incubation, blend, hold, embargo) as a
            `core.timing.SeedTiming`. The Trainer callback turns steps, epochs and shares of
            the run into decisions at fit start; the engine and the envs, which have no run
            plan, take durations in decisions only (`fixed_durations`). None: the slots' own.
    """

    blueprints: tuple[str, ...] | None = None
    max_seeds: int | None = None
    gate_mode: GateMode | str | None = None  # a name is read as its `GateMode`
    gate_config: GateConfig | None = None
    blend_gradient: str | None = None
    layer_scale_init: float | None = None
    seed_optim: SeedOptimConfig = field(default_factory=SeedOptimConfig)
    grad_stats_every: int = GRAD_STATS_EVERY
    timing: SeedTiming | None = None

    def __post_init__(self) -> None:
        set_value = _setter(self)
        set_value("blueprints", _blueprint_names(self.blueprints))
        _check_count("max_seeds", self.max_seeds, optional=True)
        _check_count("grad_stats_every", self.grad_stats_every, optional=False)
        if self.gate_mode is not None:  # one line naming the accepted modes
            set_value("gate_mode", QualityGates(self.gate_mode).mode)
        check_blend_gradient(self.blend_gradient)
        set_value("layer_scale_init", check_layer_scale_init(self.layer_scale_init))
        for name, kind in (("gate_config", GateConfig), ("seed_optim", SeedOptimConfig),
                           ("timing", SeedTiming)):
            value = getattr(self, name)
            if not isinstance(value, kind) and not (value is None and name != "seed_optim"):
                accepted = kind.__name__ + ("" if name == "seed_optim" else " or None")
                raise TypeError(f"{name} must be a {accepted}, got {type(value).__name__}")

    def fixed_durations(self) -> dict[str, int]:
        """``timing`` in decisions where it needs no run plan: what an engine applies when it
        is built ({} without timing).

        Raises:
            ValueError: a duration in steps, epochs or a share of the run (one line: only an
                adapter that knows its run, the Trainer callback, turns those into decisions).
        """
        if self.timing is None:
            return {}
        for f in fields(self.timing):
            duration = getattr(self.timing, f.name)
            if duration is not None and duration.unit != "decisions":
                raise ValueError(f"timing.{f.name}={str(duration)!r} needs the run's plan, which "
                                 "only the Trainer callback has; accepted here: durations in "
                                 "decisions (an int)")
        return self.timing.resolve(DecisionPlan())

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, strings, numbers, dicts) that `from_dict` reads back."""
        timing = None if self.timing is None else {
            f.name: _duration_text(getattr(self.timing, f.name)) for f in fields(self.timing)
            if getattr(self.timing, f.name) is not None}
        return {
            "blueprints": None if self.blueprints is None else list(self.blueprints),
            "max_seeds": self.max_seeds,
            "gate_mode": None if self.gate_mode is None else self.gate_mode.value,
            "gate_config": None if self.gate_config is None else self.gate_config.to_dict(),
            "blend_gradient": self.blend_gradient,
            "layer_scale_init": self.layer_scale_init,
            "seed_optim": dataclasses.asdict(self.seed_optim),
            "grad_stats_every": self.grad_stats_every,
            "timing": timing,
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SeedingConfig:
        """The configuration `to_dict` wrote (keys left out take their defaults).

        Raises:
            ValueError: an unknown key (one line naming the accepted ones), or what the
                options' own checks refuse.
        """
        accepted = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(accepted))
        if unknown:
            raise ValueError(f"unknown seeding option(s) {', '.join(map(repr, unknown))}; "
                             f"accepted: {', '.join(accepted)}")
        options = dict(values)
        parts = {"gate_config": GateConfig, "seed_optim": SeedOptimConfig, "timing": SeedTiming}
        for name, kind in parts.items():
            if isinstance(options.get(name), Mapping):
                options[name] = kind(**options[name])
        return cls(**options)


def with_shorthand(seeding: SeedingConfig | None, owner: str, **options: Any) -> SeedingConfig:
    """``seeding`` (None: the defaults) with each given keyword of `SHORTHAND` (None: not given)
    filled in: ``seed_lr``, ``seed_momentum``, ``seed_weight_decay`` are the parts of
    ``seed_optim``, the others the fields of their names.

    Raises:
        ValueError: a keyword that contradicts a value ``seeding`` sets (one other than the
            default), in one line naming both and ``owner``; or what `SeedingConfig` refuses.
        TypeError: a keyword that is no shorthand.
    """
    unknown = sorted(set(options) - set(SHORTHAND))
    if unknown:
        raise TypeError(f"{owner}: unknown seeding keyword(s) {', '.join(unknown)}; accepted: "
                        f"{', '.join(SHORTHAND)}")
    base, default = seeding or SeedingConfig(), SeedingConfig()
    result = base
    for keyword, value in options.items():
        if value is None:
            continue
        name, part = SHORTHAND[keyword]
        if part is not None:
            value = dataclasses.replace(result.seed_optim, **{part: value})
        result = dataclasses.replace(result, **{name: value})
        given, current, unset = (_part(c, name, part) for c in (result, base, default))
        if current != unset and given != current:
            path = name + ("" if part is None else f".{part}")
            raise ValueError(f"{owner}: {keyword}={_shown(options[keyword])} contradicts "
                             f"seeding.{path}={_shown(current)}; accepted: one of them, or "
                             "equal values")
    return result


def _setter(config: SeedingConfig) -> Any:
    """A setter of ``config``'s fields during its ``__post_init__`` (it is frozen)."""
    return lambda name, value: object.__setattr__(config, name, value)


def _shown(value: Any) -> str:
    """``value`` as a message shows it (a gate mode by its name)."""
    return repr(value.value if isinstance(value, GateMode) else value)


def _part(config: SeedingConfig, name: str, part: str | None) -> Any:
    value = getattr(config, name)
    return value if part is None else getattr(value, part)


def _blueprint_names(names: Sequence[str] | None) -> tuple[str, ...] | None:
    """``names`` as a tuple, in order, or a one-line `ValueError` (which names the registry
    knows is checked with the topology: `MorphogenesisEngine`)."""
    if names is None:
        return None
    if isinstance(names, str):
        raise ValueError(f"blueprints must be a list of names, got the string {names!r}")
    names = tuple(names)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"blueprints must be a non-empty list of blueprint names or None, got "
                         f"{list(names)!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"blueprints lists a blueprint twice: {', '.join(names)}")
    return names


def _check_count(name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        accepted = "an int >= 1 or None" if optional else "an int >= 1"
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


def _duration_text(duration: Duration) -> str:
    """``duration`` as `Duration.parse` reads it back (``"0.1 run"``, ``"200 steps"``)."""
    return f"{duration.value!r} {duration.unit}"  # repr: every digit, read back exactly
