"""`CompareConfig`: a paired comparison of controllers (``esper-lightning compare``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from esper_lightning.app.config.checks import check_positive
from esper_lightning.app.config.task import TaskConfig
from esper_lightning.errors import ConfigError


@dataclass(frozen=True)
class CompareConfig(TaskConfig):
    """A paired comparison of controllers (``esper-lightning compare``).

    Args:
        controllers: controllers to compare, each KIND or KIND:ARGUMENT of the arm kinds
            registered in `esper_lightning.app.compare.arms` (``esper-lightning compare --help``
            lists them: static, heuristic, random, policy:PATH, ...).
        seeds: evaluation episodes per controller; episode i has the same host initialisation,
            data order and augmentation for every controller.
        envs: envs in the lockstep pool (episodes run in chunks of this size).
        out: folder for the per-episode CSV, summary and plots (a rerun with the same settings
            and controllers resumes it; other settings, or a policy file whose content changed,
            are refused).
        reference: the controller every other one is compared with.
        all_pairs: also compare every pair of controllers.
        transfer_policies: let a policy:PATH (or sampled:PATH) play a host preset other than
            the one it was trained on (same task and slots; its observation is relative to the
            run: fractions of the budget, normalised statistics), e.g. a policy trained on
            lm-grow-cpu's grow2 evaluated on lm-grow's grow4; and a lookup:FILE play a host or
            base budget other than the one it was tuned at (its budget scales read against
            this comparison's base, as a policy's are).
        tune_heuristic: first tune the heuristic's main knobs on tuning episodes (disjoint from
            the evaluation episodes) and compare with the chosen configuration.
        tuning_seeds: tuning episodes per heuristic configuration (and per learning rate of
            tune_lr).
        arm_lr: a host learning rate per controller, NAME=LR (static=8e-3); the others train
            at host_lr (or their tune_lr choice).
        tune_lr: learning rates to try for every controller without an arm_lr (matched:NAME
            excepted): each plays tuning_seeds tuning episodes (disjoint from the evaluation
            episodes) per rate and keeps the best by the judged metric.
        speedup_reference: the controller whose final validation loss the speed-up table
            measures every controller's FLOPs to (null: reference).
        arm_groups: arms pooled into one, NAME=ARM,ARM,... (policies=policy:a.pt,policy:b.pt,
            policy:c.pt: three PPO training seeds): the report compares each group's mean over
            its members, episode by episode, with the reference, and gives the spread between
            its members.
        group_pairs: groups compared with each other, A=B (all=timing): member i of A minus
            member i of B, episode by episode, for groups whose members pair up (A's training
            seed i started from B's seed i: a curriculum); the interval takes the seeds and the
            episodes as random, as a group's against the reference does.
        progress: show a progress bar.
    """

    controllers: tuple[str, ...] = ("static", "heuristic")
    seeds: int = 10
    envs: int = 4
    out: str = "compare"
    reference: str = "static"
    all_pairs: bool = False
    transfer_policies: bool = False
    tune_heuristic: bool = False
    tuning_seeds: int = 3
    arm_lr: tuple[str, ...] = ()
    tune_lr: tuple[float, ...] = ()
    speedup_reference: str | None = None
    arm_groups: tuple[str, ...] = ()
    group_pairs: tuple[str, ...] = ()
    progress: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, ("seeds", "envs", "tuning_seeds"))
        if self.budget_range is not None:
            raise ConfigError(f"budget_range={list(self.budget_range)} gives every episode a "
                              "budget of its own, and compare groups episodes by budget; "
                              "accepted: budget_scales, the budgets to compare at (e.g. 0.35 "
                              "0.7 1.4 2.8)")

        if not self.controllers:
            raise ConfigError("controllers must name at least one controller")
        if len(set(self.controllers)) != len(self.controllers):
            raise ConfigError(f"controllers lists one twice: {', '.join(self.controllers)}")
        for name in ("reference", "speedup_reference"):
            value = getattr(self, name)
            if value is not None and value not in self.controllers:
                # A misspelt controller (statik) leaves the default reference (static) out: the
                # controller is the mistake to name, with the forms accepted.
                _check_arm_kinds(self.controllers)
                raise ConfigError(f"{name} {value!r} is not among the controllers; "
                                  f"accepted: {', '.join(self.controllers)}")
        self.arm_lrs()  # checked now
        self.paired_groups()
        for lr in self.tune_lr:
            if not (math.isfinite(lr) and lr > 0):
                raise ConfigError(f"tune_lr must list learning rates > 0, got {lr!r}")
        if len(set(self.tune_lr)) != len(self.tune_lr):
            raise ConfigError(f"tune_lr lists a rate twice: {list(self.tune_lr)}")

    def groups(self) -> dict[str, tuple[str, ...]]:
        """``arm_groups`` as a mapping of group name to its member arms (checked)."""
        groups: dict[str, tuple[str, ...]] = {}
        for item in self.arm_groups:
            name, sep, text = item.partition("=")
            members = _split_arms(text, self.controllers)
            if not sep or not name or len(members) < 2 or len(set(members)) != len(members):
                raise ConfigError(f"bad arm_groups {item!r}; accepted: NAME=ARM,ARM,... with two "
                                  f"or more distinct arms, e.g. policies={self.controllers[0]},"
                                  "...")
            unknown = [m for m in members if m not in self.controllers]
            if unknown or name in groups or name in self.controllers:
                what = (f"names {unknown[0]!r}, which is not a controller" if unknown
                        else f"reuses the name {name!r}")
                raise ConfigError(f"arm_groups {item!r} {what}; accepted arms: "
                                  f"{', '.join(self.controllers)}")
            if self.reference in members:
                raise ConfigError(f"arm_groups {item!r} holds the reference {self.reference!r}, "
                                  "which every group is compared with")
            groups[name] = members
        return groups

    def paired_groups(self) -> list[tuple[str, str]]:
        """``group_pairs`` as ``(A, B)`` pairs of group names (checked with the groups)."""
        groups = self.groups()
        pairs: list[tuple[str, str]] = []
        for item in self.group_pairs:
            a, sep, b = item.partition("=")
            if not sep or a not in groups or b not in groups or a == b:
                raise ConfigError(f"bad group_pairs {item!r}; accepted: A=B naming two of the "
                                  f"arm_groups ({', '.join(groups) or 'none given'})")
            if len(groups[a]) != len(groups[b]):
                raise ConfigError(f"group_pairs {item!r}: {a} has {len(groups[a])} members and "
                                  f"{b} {len(groups[b])}; accepted: groups whose members pair "
                                  "up, one for one")
            shared = [m for m in groups[a] if m in groups[b]]
            if shared:
                raise ConfigError(f"group_pairs {item!r}: {shared[0]!r} is in both groups; "
                                  "accepted: groups of different arms")
            pairs.append((a, b))
        return pairs

    def arm_lrs(self) -> dict[str, float]:
        """``arm_lr`` as a mapping of controller to learning rate (checked)."""
        rates: dict[str, float] = {}
        for item in self.arm_lr:
            name, sep, text = item.rpartition("=")
            try:
                lr = float(text)
            except ValueError:
                lr = math.nan
            if not sep or not (math.isfinite(lr) and lr > 0):
                raise ConfigError(f"bad arm_lr {item!r}; accepted: NAME=LR with LR > 0, e.g. "
                                  f"{self.controllers[0]}=1e-3")
            if name not in self.controllers or name in rates:
                what = "names a controller twice" if name in rates else "is not a controller"
                raise ConfigError(f"arm_lr {item!r} {what}; accepted names: "
                                  f"{', '.join(self.controllers)}")
            rates[name] = lr
        return rates


def _split_arms(text: str, controllers: Sequence[str]) -> tuple[str, ...]:
    """The arms of ``A,B,...``, where an arm's own label may hold commas
    (``stack:4@0.1,0.4:identity``): a piece that is no controller joins the one before it
    when together they are.

    Example:
        >>> _split_arms("static,stack:4@0.1,0.4:identity", ["static", "stack:4@0.1,0.4:identity"])
        ('static', 'stack:4@0.1,0.4:identity')
    """
    arms: list[str] = []
    for piece in text.split(","):
        joined = f"{arms[-1]},{piece}" if arms else None
        if piece not in controllers and joined is not None and (
                joined in controllers or any(c.startswith(joined + ",") for c in controllers)):
            arms[-1] = joined
        elif piece:
            arms.append(piece)
    return tuple(arms)


def _check_arm_kinds(controllers: Sequence[str]) -> None:
    """Refuse the first of ``controllers`` that is no registered arm kind as written (one line
    naming it and every accepted form: `arms.parse_controller`)."""
    # Imported here: the arms registry imports this package.
    from esper_lightning.app.compare.arms import parse_controller

    for text in controllers:
        parse_controller(text)

