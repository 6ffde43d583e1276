"""What ``--controllers`` names: one registry of compare arm kinds, one entry per kind.

An arm is written ``KIND`` or ``KIND:ARGUMENT`` (``static``, ``policy:runs/ckpt.pt``,
``stack:4@0.25:identity``). Its `ArmKind` says how it is written, checks it when the comparison
is built (a bad argument is one line before anything trains, and what the check builds — a
loaded policy, a parsed schedule — is kept for the episodes), builds the controller of each
episode, and says what the host is born with. Naming a new kind on the command line is one
`ArmKind` and one `register_arm` call::

    from esper_lightning.app.compare.arms import ArmKind, register_arm
    from esper_lightning.controllers import StaticController

    register_arm(ArmKind("idle", "idle", "the host as it is, never grown",
                         controller=lambda arena, spec, plan, prepared: StaticController()))

``Comparison`` is the ``arena`` each function receives: its ``config``, ``topology``,
``specs`` (every arm by label) and ``heuristic``.

An installed package reaches the installed ``esper-lightning compare`` through the entry-point
group ``esper_lightning.arms`` (`ENTRY_POINTS`): each entry names an `ArmKind` (registered when
the registry is first read: `arm_kinds`) or a module whose import calls `register_arm`. In the
package's ``pyproject.toml``::

    [project.entry-points."esper_lightning.arms"]
    idle = "my_package.arms:IDLE"
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import math
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esper_lightning.app.config.layers import ADDED_KEY_DEFAULTS
from esper_lightning.app.config.task import TaskConfig
from esper_lightning.errors import ConfigError

if TYPE_CHECKING:  # the registry imports no torch: ``compare --help`` lists it at once
    from esper_lightning.controllers import Controller, GrowerController
    from esper_lightning.rl.checkpoint import PolicyBundle

__all__ = ["ARM_KINDS", "ENTRY_POINTS", "ArmKind", "ControllerSpec", "EpisodePlan", "Implants",
           "arm_kinds", "arm_usages", "check_policy", "fingerprint", "make_grower",
           "parse_controller", "register_arm"]

log = logging.getLogger("esper_lightning")

#: What a host is born with: ``(slot id, blueprint)`` pairs, fossilized from birth.
Implants = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ControllerSpec:
    """One entry of ``--controllers``: its label (as written), kind and argument."""

    label: str
    kind: str
    argument: str | None = None


@dataclass(frozen=True)
class EpisodePlan:
    """One episode to play: who plays it, which one it is, seeds implanted at birth and its
    host learning rate (None: the config's ``host_lr``)."""

    label: str
    index: int
    rng_seed: int
    implants: Implants = ()
    host_lr: float | None = None


@dataclass(frozen=True)
class ArmKind:
    """One kind of compare arm.

    Attributes:
        name: the kind, as written before the colon.
        usage: how ``--controllers`` writes it (help and errors), e.g. ``policy:PATH``.
        about: what it plays, for ``esper-lightning compare --help``.
        controller: ``(arena, spec, plan, prepared) -> Controller`` for one episode.
        prepare: ``(arena, spec) -> prepared``, run when the comparison is built: checks the
            argument (`ConfigError` in one line) and returns what ``controller`` and
            ``implants`` reuse (None: nothing to check or keep).
        implants: ``(arena, spec, plan index, earlier episodes, prepared) -> Implants``: what
            the host is born with (None: nothing).
        reads_others: it plays after the other arms, reading their episodes (``matched:``).
        identity: ``spec -> dict``: what identifies the arm beyond its kind (a policy's file
            and its SHA-256), saved in ``controllers.json`` so a rerun never mixes two arms of
            one label.
        cost: ``(spec, prepared) -> dict``: what making the arm cost before the comparison (a
            policy's training, a lookup's tuning: ``made_by``, ``episodes``, ``train_flops``,
            ``wall_seconds``), None when unknown; the report's cost table.
    """

    name: str
    usage: str
    about: str
    controller: Callable[[Any, ControllerSpec, EpisodePlan, Any], Controller]
    prepare: Callable[[Any, ControllerSpec], Any] | None = None
    implants: Callable[[Any, ControllerSpec, int, Mapping[tuple[str, int], Any], Any],
                       Implants] | None = None
    reads_others: bool = False
    identity: Callable[[ControllerSpec], dict[str, Any]] | None = None
    cost: Callable[[ControllerSpec, Any], dict[str, Any] | None] | None = None

    @property
    def takes_argument(self) -> bool:
        return ":" in self.usage


#: Every arm kind, by name, in the order ``--help`` lists them.
ARM_KINDS: dict[str, ArmKind] = {}


def register_arm(kind: ArmKind) -> ArmKind:
    """Add ``kind`` to `ARM_KINDS` and return it (``IDLE = register_arm(ArmKind(...))``).

    Raises:
        ValueError: a kind of that name exists, or its usage does not start with its name.
    """
    if kind.name in ARM_KINDS:
        raise ValueError(f"arm kind {kind.name!r} is registered already")
    if kind.usage.split(":")[0] != kind.name:
        raise ValueError(f"arm kind {kind.name!r}: usage {kind.usage!r} must start with "
                         f"'{kind.name}'")
    ARM_KINDS[kind.name] = kind
    return kind


#: The entry-point group of installed packages' arm kinds.
ENTRY_POINTS = "esper_lightning.arms"


@functools.cache
def _load_entry_points() -> None:
    """Register every installed package's arm kinds (`ENTRY_POINTS`), once per process.

    Raises:
        ConfigError: one line naming the entry point that failed to load, whose object is
            neither an `ArmKind` nor a module, or whose name is not its `ArmKind`'s.
    """
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        where = f"arm entry point '{entry.name} = {entry.value}' ({ENTRY_POINTS})"
        try:
            loaded = entry.load()
        except Exception as err:  # a user's package: any failure is that package's one line
            raise ConfigError(f"{where} failed to load: {type(err).__name__}: {err}") from None
        if isinstance(loaded, ArmKind):
            if loaded.name != entry.name:  # --controllers would not find it by that name
                raise ConfigError(f"{where} is the arm kind {loaded.name!r}; name the entry "
                                  f"point after it: {loaded.name} = {entry.value}")
            try:
                if ARM_KINDS.get(loaded.name) is not loaded:
                    register_arm(loaded)
            except ValueError as err:  # a name taken, or a usage not of its name
                raise ConfigError(f"{where}: {err}") from None
        elif not isinstance(loaded, types.ModuleType):  # a module registered on import
            raise ConfigError(f"{where} is a {type(loaded).__name__}; accepted: an ArmKind or "
                              "a module that calls register_arm")


def arm_kinds() -> dict[str, ArmKind]:
    """`ARM_KINDS` with every installed package's kinds (`ENTRY_POINTS`) registered."""
    _load_entry_points()
    return ARM_KINDS


def arm_usages() -> tuple[str, ...]:
    """How ``--controllers`` writes each kind (``static``, ``policy:PATH``, ...)."""
    return tuple(kind.usage for kind in arm_kinds().values())


def parse_controller(text: str, custom: Sequence[str] = ()) -> ControllerSpec:
    """A registered kind as written (``static``, ``policy:PATH``, ...) or the name of a custom
    controller given to `Comparison`.

    Raises:
        ConfigError: an unknown kind, or one written without the argument it takes (or with
            one it does not take).
    """
    if text in custom:
        return ControllerSpec(text, "custom")
    name, sep, argument = text.partition(":")
    kind = arm_kinds().get(name)
    if kind is not None and (bool(argument) if kind.takes_argument else not sep):
        return ControllerSpec(text, name, argument or None)
    accepted = ", ".join((*arm_usages(), *custom))
    raise ConfigError(f"unknown controller {text!r}; accepted: {accepted}")


def fingerprint(spec: ControllerSpec, lr: float | None = None) -> dict[str, Any]:
    """What identifies a controller beyond its label: its kind, its ``arm_lr`` when it has one,
    and what its kind adds (`ArmKind.identity`: a policy's file and SHA-256; a custom
    controller's code cannot be identified: its label is all there is). The learning rate
    belongs to the arm, not to the comparison, so a folder takes a new controller with its own
    rate beside the old ones."""
    found: dict[str, Any] = {"kind": spec.kind}
    kind = ARM_KINDS.get(spec.kind)
    if kind is not None and kind.identity is not None:
        found |= kind.identity(spec)
    return found if lr is None else found | {"lr": lr}


# --- the built-in kinds ------------------------------------------------------------------------
def make_grower(argument: str, topology: str) -> GrowerController:
    """``BLUEPRINT[:all][:hold]``: grow it in the first slot (``all``: in every slot), fossilize
    once held (``hold``: never fossilize, the seed stays blended in HOLDING). The blueprint must
    exist for the task's slot ``topology``."""
    from esper_lightning.controllers import GrowerController

    blueprint, *options = argument.split(":")
    unknown = [o for o in options if o not in ("all", "hold")]
    if unknown:
        raise ConfigError(f"unknown grower option {unknown[0]!r} in 'grower:{argument}'; "
                          "accepted: all, hold")
    try:
        return GrowerController(blueprint, slots=None if "all" in options else (0,),
                                fossilize="hold" not in options, topology=topology)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_policy(path: str, task: TaskConfig, transfer: bool = False) -> PolicyBundle:
    """Load a policy checkpoint, refusing one trained for another task, slots or host (another
    host is accepted with ``transfer``), one without a blueprint-head entry for a blueprint
    the comparison allows, or one trained with a subset of blueprints of which the comparison
    allows none (it could only ever wait: an arm that is static under the policy's name)."""
    from esper_lightning.app.task import germinable_blueprints
    from esper_lightning.rl.checkpoint import check_blueprints, load_policy, read_checkpoint

    state = read_checkpoint(path)
    saved = {**ADDED_KEY_DEFAULTS, **state.get("config", {})}
    wanted = {"task": task.task, "slots": list(task.slots or ()), "host_preset": task.host_preset}
    for key, value in wanted.items():
        if saved.get(key) != value:
            if key == "host_preset" and transfer:
                log.info("policy '%s' (trained on host_preset=%r) plays host_preset=%r: "
                         "transfer", path, saved.get(key), value)
                continue
            hint = ("; --transfer_policies lets it play another host of the same task"
                    if key == "host_preset" else "")
            raise ConfigError(f"policy '{path}' was trained with {key}={saved.get(key)!r}; the "
                              f"comparison uses {key}={value!r}{hint}")
    bundle = load_policy(state, source=f"policy '{path}'")
    allowed = germinable_blueprints(task)
    check_blueprints(bundle, allowed)
    if not bundle.playable(allowed):
        raise ConfigError(f"policy '{path}' was trained to germinate only "
                          f"{', '.join(bundle.allowed_blueprints or ())}; the comparison allows "
                          f"none of them ({', '.join(allowed)})")
    return bundle


def _growing_host(arena: Any) -> Any:
    """The host's shape as a stack that grows deeper, whose blocks and slots ``stack:`` and
    ``born:`` read (`TaskSpec.growing_host`; None on a task whose hosts do not grow depth:
    they refuse it in one line)."""
    config = arena.config
    return config.task_spec.growing_host(str(config.host_preset))


def _stack(arena: Any, spec: ControllerSpec, rng_seed: int | None) -> Controller:
    from esper_lightning.app.compare.stack_arms import stack_controller

    return stack_controller(str(spec.argument), _growing_host(arena), arena.config.slots,
                            arena.topology, rng_seed)


def _lookup(arena: Any, spec: ControllerSpec) -> Any:
    """``lookup:PATH``'s table, checked against the run's host (its depth and growth slots,
    as ``stack:`` is) and the operator's blueprint."""
    from esper_lightning.app.compare.stack_arms import stack_controller
    from esper_lightning.controllers.lookup import read_lookup

    lookup = read_lookup(str(spec.argument))
    taus = ",".join("0" for _ in range(lookup.slots))
    try:  # the same checks as the stack arm the lookup stands for
        stack_controller(f"{lookup.depth}@{taus}:{lookup.operator}", _growing_host(arena),
                         arena.config.slots, arena.topology)
    except ConfigError as err:
        raise ConfigError(f"{spec.label}: {err}") from None
    _check_tuned_setting(spec, lookup.tuning, arena.config)
    return lookup


def _check_tuned_setting(spec: ControllerSpec, tuning: Mapping[str, Any], config: Any) -> None:
    """A lookup's scales are multiples of the base budget it was tuned at, on its host: played
    at another base or host they mean other budgets, which only ``transfer_policies`` accepts
    (a transfer evaluation, where the scale is read against the comparison's own base, as a
    policy reads it)."""
    from esper_lightning.app.task import budget_flops

    base = budget_flops(config)
    for key, value in (("host_preset", config.host_preset), ("base_flops", base)):
        tuned = tuning.get(key, value)  # a hand-written table records neither
        if tuned == value or (key == "base_flops" and value is not None
                              and math.isclose(tuned, value, rel_tol=1e-9)):
            continue
        if config.transfer_policies:
            log.info("%s (tuned at %s=%r) plays %s=%r: transfer", spec.label, key, tuned, key,
                     value)
            continue
        raise ConfigError(f"{spec.label} was tuned at {key}={tuned!r}; the comparison uses "
                          f"{key}={value!r} (its budget scales would mean other budgets); "
                          "--transfer_policies lets it play there")


def _file_identity(spec: ControllerSpec) -> dict[str, Any]:
    path = Path(str(spec.argument)).expanduser().resolve()
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _policy_cost(spec: ControllerSpec, bundle: Any) -> dict[str, Any] | None:
    """A policy's training cost, as its checkpoint records it (None: written before)."""
    from esper_lightning.rl.checkpoint import read_checkpoint

    cost = read_checkpoint(str(spec.argument)).get("training_cost")
    return None if cost is None else {"made_by": "PPO training", **cost}


def _lookup_cost(spec: ControllerSpec, lookup: Any) -> dict[str, Any] | None:
    """A lookup's tuning cost, as the file records it (None: a hand-written table)."""
    tuning = lookup.tuning
    if "episodes" not in tuning:
        return None
    return {"made_by": "tuning", **{k: tuning[k] for k in ("episodes", "train_flops",
                                                             "wall_seconds") if k in tuning}}


def _born(arena: Any, spec: ControllerSpec) -> Implants:
    from esper_lightning.app.compare.stack_arms import born_implants

    return born_implants(str(spec.argument), _growing_host(arena), arena.config.slots,
                         arena.topology)


def _check_matched(arena: Any, spec: ControllerSpec) -> None:
    others = [label for label in arena.specs if label != spec.label]
    if spec.argument not in others:
        raise ConfigError(f"{spec.label}: {spec.argument!r} is not among the other controllers; "
                          f"accepted: {', '.join(others) or 'none (add the one to match)'}")


def _matched_implants(arena: Any, spec: ControllerSpec, index: int,
                      by_episode: Mapping[tuple[str, int], Any], prepared: Any) -> Implants:
    """What ``matched:NAME`` is born with in episode ``index``: the seeds NAME had at the end
    of its own episode ``index`` (the same blueprints in the same slots), fully blended."""
    grown = by_episode.get((spec.argument, index))
    if grown is None:
        raise RuntimeError(f"{spec.label}: {spec.argument!r} has not played episode {index}")
    seeds = grown["final_seeds"]
    if seeds is None:  # refused before anything is written (`Comparison._check_controllers`)
        raise RuntimeError(f"{spec.label}: episode {index} of {spec.argument!r} has no seeds")
    log.info("%s episode %d: implants %s", spec.label, index, list(seeds) or "none")
    return seeds


def _lookup_controller(arena: Any, lookup: Any) -> Controller:
    from esper_lightning.controllers.lookup import LookupController

    return LookupController(lookup, slots=_growing_host(arena).growth_slot_ids)


def _static(arena: Any, spec: ControllerSpec, plan: EpisodePlan, prepared: Any) -> Controller:
    from esper_lightning.controllers import StaticController

    return StaticController()  # matched and born too: their seeds are implanted at birth


def _heuristic(arena: Any, spec: ControllerSpec, plan: EpisodePlan, prepared: Any
               ) -> Controller:
    from esper_lightning.controllers import HeuristicController

    return HeuristicController(arena.heuristic)


def _random(arena: Any, spec: ControllerSpec, plan: EpisodePlan, prepared: Any) -> Controller:
    from esper_lightning.controllers import RandomController

    return RandomController(rng_seed=plan.rng_seed)


def _policy(arena: Any, spec: ControllerSpec, plan: EpisodePlan, bundle: PolicyBundle
            ) -> Controller:
    from esper_lightning.controllers import PolicyController

    return PolicyController(bundle)


def _sampled(arena: Any, spec: ControllerSpec, plan: EpisodePlan, bundle: PolicyBundle
             ) -> Controller:
    from esper_lightning.controllers import PolicyController

    # Seeded by the episode: a rerun draws the same actions, and each episode its own.
    return PolicyController(bundle, deterministic=False, rng_seed=plan.rng_seed)


def _prepare_policy(arena: Any, spec: ControllerSpec) -> PolicyBundle:
    return check_policy(str(spec.argument), arena.config, arena.config.transfer_policies)


register_arm(ArmKind("static", "static", "always WAIT: the host as it is", _static))
register_arm(ArmKind(
    "heuristic", "heuristic", "the plateau heuristic (tuned with --tune_heuristic)",
    _heuristic))
register_arm(ArmKind(
    "random", "random", "a random legal action each decision",
    _random))
register_arm(ArmKind(
    "grower", "grower:BLUEPRINT[:all][:hold]",
    "germinate BLUEPRINT in the first slot (all: every slot), advance when legal, fossilize "
    "unless hold",
    lambda arena, spec, plan, prepared: make_grower(str(spec.argument), arena.topology),
    prepare=lambda arena, spec: make_grower(str(spec.argument), arena.topology)))
register_arm(ArmKind(
    "policy", "policy:PATH", "a PPO checkpoint's policy (argmax actions)",
    _policy, prepare=_prepare_policy, identity=_file_identity, cost=_policy_cost))
register_arm(ArmKind(
    "sampled", "sampled:PATH",
    "a PPO checkpoint's policy, its actions sampled as in training (seeded by the episode)",
    _sampled, prepare=_prepare_policy, identity=_file_identity, cost=_policy_cost))
register_arm(ArmKind(
    "matched", "matched:NAME",
    "the host born in each episode with the seeds NAME had at the end of that episode (the "
    "same blueprints in the same slots), fully blended from epoch 0",
    _static, prepare=_check_matched, implants=_matched_implants, reads_others=True))
register_arm(ArmKind(
    "stack", "stack:K@TAU[:OPERATOR]",
    "lm: grow to K blocks with growth operator OPERATOR (copy, identity, random) once "
    "fraction TAU of the run is spent (TAU may be 'random')",
    lambda arena, spec, plan, prepared: _stack(arena, spec, plan.rng_seed),
    prepare=lambda arena, spec: _stack(arena, spec, rng_seed=0)))
register_arm(ArmKind(
    "lookup", "lookup:PATH",
    "lm: grow at the times a per-budget growth lookup gives for the episode's budget "
    "(esper-lightning lookup tunes one from a comparison; interpolated in log budget)",
    lambda arena, spec, plan, lookup: _lookup_controller(arena, lookup),
    prepare=_lookup, identity=_file_identity, cost=_lookup_cost))
register_arm(ArmKind(
    "born", "born:K", "lm: the host born with K blocks, its growth seeds fully blended",
    _static, prepare=_born,
    implants=lambda arena, spec, index, by_episode, implants: implants))
