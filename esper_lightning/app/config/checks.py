"""The checks every configuration runs: one-line `ConfigError`s naming the bad value and what
is accepted; values coerced by the dataclass's own field types."""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Literal

from esper_lightning.errors import ConfigError


# --- checking ---------------------------------------------------------------------------------
@functools.cache
def field_types(cls: type) -> dict[str, tuple[bool, Any]]:
    """Each field of ``cls``: whether it may be null, and its type without the ``None`` (read
    from the dataclass's annotations, so a new field needs no list of its kind here)."""
    found = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        optional = type(None) in args and typing.get_origin(hint) in (typing.Union, types.UnionType)
        rest = tuple(a for a in args if a is not type(None))
        found[name] = (optional, rest[0] if optional and len(rest) == 1 else hint)
    return found


def coerce(name: str, value: Any, cls: type) -> Any:
    """``value`` as field ``name`` of ``cls`` holds it (a list becomes a tuple, an int a float
    where the field is a float); a value of the wrong type is a one-line `ConfigError`."""
    optional, kind = field_types(cls)[name]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} must not be null")
    if typing.get_origin(kind) is tuple:
        numbers = typing.get_args(kind)[0] is float
        items = "numbers" if numbers else "strings"
        if isinstance(value, str) or not isinstance(value, list | tuple) or (numbers and not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
            raise ConfigError(f"{name} must be a list of {items}, got {value!r}")
        return tuple(float(v) for v in value) if numbers else tuple(str(v) for v in value)
    expected = str if typing.get_origin(kind) is Literal else kind
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        article = "an" if expected.__name__[0] in "aeiou" else "a"
        raise ConfigError(f"{name} must be {article} {expected.__name__}, got {value!r}")
    return value


def check_positive(config: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")


def check_optional_positive(config: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1 or null, got {value}")


def check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low}, {high}], got {value}")


def check_choice(name: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ConfigError(f"unknown {name} {value!r}; accepted: {', '.join(accepted)}")


def check_slots(slots: tuple[str, ...] | None, accepted: tuple[str, ...]) -> None:
    if not slots:
        raise ConfigError(f"slots must name at least one slot; accepted: {', '.join(accepted)}")
    for slot in slots:
        check_choice("slot", slot, accepted)
    if len(set(slots)) != len(slots):
        raise ConfigError(f"slots lists a slot twice: {', '.join(slots)}")


def check_device(device: str) -> None:
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ConfigError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N")


def plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
