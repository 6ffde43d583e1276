"""A configuration built in layers (defaults, a preset, a file, flags), each strict, and what a
saved configuration means to a later run (compatibility, resuming, keys added since)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from esper_lightning.app.config.checks import coerce, plain
from esper_lightning.envs.task_specs import TASKS
from esper_lightning.errors import ConfigError

#: A configuration class (`TaskConfig` or a subclass; not imported here: it builds on these
#: layers).
ConfigT = TypeVar("ConfigT")

#: Fields that shape the policy or the task: a checkpoint only resumes with equal values.
COMPATIBILITY_KEYS = (
    "task", "slots", "host_preset", "reward", "episode_length", "policy_hidden", "envs",
    "min_training_epochs", "max_seeds", "param_cost", "outcome", "heads", "blend_gradient",
    "layer_scale_init", "budget_flops", "budget_steps", "budget_scales", "budget_range",
    "lr_schedule", "warmup_fraction", "decay_fraction", "min_lr_ratio", "blueprints",
)
#: What a saved config (a checkpoint, a comparison folder) written before these keys existed
#: meant by leaving them out.
ADDED_KEY_DEFAULTS: dict[str, Any] = {
    "task": "cifar", "block_size": None, "blend_gradient": None, "layer_scale_init": None,
    "budget_flops": None, "budget_steps": None, "budget_scales": None, "budget_range": None,
    "lr_schedule": "constant",
    "warmup_fraction": 0.0, "decay_fraction": None, "min_lr_ratio": 0.0, "arm_lr": [],
    "tune_lr": [], "outcome": "accuracy", "blueprints": None,
}
#: Options of which a layer sets at most one: setting one clears the others.
EXCLUSIVE_KEYS = (("budget_flops", "budget_steps"), ("budget_scales", "budget_range"))
#: Keys whose default depends on the task (null in a layer: the task's own).
TASK_DEFAULTED_KEYS = ("host_preset", "slots", "host_lr")


def from_mapping(values: Mapping[str, Any], base: ConfigT) -> ConfigT:
    """Apply ``values`` on top of ``base`` as one layer (`from_layers`); unknown keys are
    errors."""
    current = {f.name: getattr(base, f.name) for f in fields(base)}  # type: ignore[arg-type]
    return _build(base, _apply(current, values, type(base)))


def from_layers(layers: Sequence[Mapping[str, Any]], cls: type[ConfigT]) -> ConfigT:
    """The configuration of ``cls`` from its defaults and ``layers`` in order (a checkpoint's
    values, a preset, what the command line and its files gave). Each layer is coerced and
    checked key by key and brings the layer rules — one that changes the task moves the keys
    still at the old task's defaults, one that sets a key of `EXCLUSIVE_KEYS` clears the others
    — and the whole is checked once, at the end: a later layer may repair what an earlier one
    left inconsistent."""
    return _build(cls(), layered(layers, cls))


def layered(layers: Sequence[Mapping[str, Any]], cls: type) -> dict[str, Any]:
    """Every key of ``cls`` after ``layers`` by the layer rules, before the whole is checked and
    the task's defaults fill the keys left null: what `from_layers` builds, and what a
    ``--print_config`` file holds, so that as one layer of its own it builds the same."""
    default = cls()
    current = {f.name: getattr(default, f.name) for f in fields(default)}
    for layer in layers:
        current = _apply(current, layer, cls)
    return current


def _apply(current: Mapping[str, Any], layer: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """``current`` (every key of a configuration) with ``layer`` on top, by the layer rules."""
    unknown = sorted(set(layer) - set(current))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(map(repr, unknown))}; accepted: "
                          f"{', '.join(current)}")
    coerced = {name: coerce(name, value, cls) for name, value in layer.items()}
    return {**current, **_follow_task(coerced, current), **_exclusive(coerced), **coerced}


def _build(base: ConfigT, values: Mapping[str, Any]) -> ConfigT:
    try:
        return dataclasses.replace(base, **values)  # type: ignore[type-var]
    except TypeError as err:
        raise ConfigError(str(err)) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file '{path}': {err.strerror}") from None
    try:
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except Exception as err:  # any parser error is a user mistake in the file
        reason = str(err).splitlines()[0]
        raise ConfigError(f"cannot parse config file '{path}': {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
    return data


def compatibility_errors(saved: Mapping[str, Any], config: Any) -> list[str]:
    """The compatibility keys whose saved value differs from ``config``."""
    current = config.to_dict()
    saved = {**ADDED_KEY_DEFAULTS, **saved}
    return [
        f"{key}={saved.get(key)!r} (now {current[key]!r})"
        for key in COMPATIBILITY_KEYS
        if plain(saved.get(key)) != current[key]
    ]


def policy_checkpoint(path: str | Path, mode: str) -> Path:
    """Where an A/B run saves the policy of reward mode ``mode`` given ``path`` (``save`` or
    ``resume``): ``<stem>.<mode><suffix>``, e.g. ``ckpt.sparse.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{mode}{path.suffix}")


#: Keys that describe one invocation, not the run: a resumed run does not take them from its
#: checkpoint, and they are not listed among its changes.
INVOCATION_KEYS = ("resume", "overwrite")


def saved_values(saved: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """A saved configuration's values that ``cls`` has (keys it left out at their meaning then,
    `ADDED_KEY_DEFAULTS`), without the `INVOCATION_KEYS`: what a resumed run starts from."""
    known = {f.name for f in fields(cls)} - set(INVOCATION_KEYS)
    return {k: v for k, v in {**ADDED_KEY_DEFAULTS, **saved}.items() if k in known}


def config_differences(saved: Mapping[str, Any], config: Any) -> list[str]:
    """``key old -> new`` for every value of ``config`` that differs from the saved
    configuration (`INVOCATION_KEYS` aside)."""
    before = saved_values(saved, type(config))
    return [f"{key} {plain(before.get(key))!r} -> {value!r}"
            for key, value in config.to_dict().items()
            if key in before and plain(before[key]) != value]


def _follow_task(layer: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """A layer that changes the task resets the task-dependent keys it does not set and that
    still hold the old task's default, so ``--task lm`` alone gets the lm host and slots."""
    task = layer.get("task", current["task"])
    if task == current["task"] or task not in TASKS or current["task"] not in TASKS:
        return {}
    old = TASKS[current["task"]].defaults()
    return {name: None for name in TASK_DEFAULTED_KEYS
            if name not in layer and current[name] == old[name]}


def _exclusive(values: Mapping[str, Any]) -> dict[str, Any]:
    """A layer that sets one of `EXCLUSIVE_KEYS` clears the others it does not set (a preset's
    budget_flops gives way to a flag's budget_steps)."""
    cleared: dict[str, Any] = {}
    for group in EXCLUSIVE_KEYS:
        if any(values.get(key) is not None for key in group):
            cleared.update({key: None for key in group if key not in values})
    return cleared


