"""Blueprint registry: which seed modules exist per topology, their sizes, and safe construction.

A *blueprint* is a named recipe for a seed module that a slot of width ``channels`` can host.
The registry is keyed by ``(topology, name)``. ``build`` instantiates a blueprint and checks with
a shape probe that the seed maps its input to a tensor of the same shape, so a bad blueprint is
rejected at germination with a one-line error instead of failing somewhere inside a host forward.

The registry also owns the *blueprint table*: the action index of every blueprint name, which
the blueprint head of an `Action`, the action masks and a PPO policy's blueprint head and
embedding all use. The table only grows: `register` gives a new name the next index, a name
registered for two topologies has one index, and `unregister` keeps the index, so a policy's
head keeps its meaning for as long as the process runs (a saved policy stores the names of its
indices and is checked against the table when it is loaded).

This module also holds :class:`LayerScale` / :class:`LayerScale2d`, the small-gain output stage
shared by the built-in blueprints: each seed is ``x + gamma * branch(x)`` with ``gamma`` starting
at 1e-3, which keeps a freshly germinated seed within 1e-2 of the identity while every parameter
still receives gradient (zero-initialising the last layer instead leaves the branch dead).
``build(..., layer_scale=g)`` starts every LayerScale gain of a seed at ``g`` instead (the
``layer_scale_init`` setting of slots, engine and ``--layer_scale_init``).

A blueprint may need more than its width: a depth-growth seed (`blueprints.growth`) is made
from the blocks before its slot. Its spec names that *context* (`BlueprintSpec.context`), the
slot supplies it at germination (``build(..., context={"growth": site})``), and a slot that
cannot is refused in one line. A spec can also set its own lifecycle pace
(`BlueprintSpec.incubation`, `BlueprintSpec.blend_tempo`), and skip the shape probe when its
slot checks the shapes itself (`BlueprintSpec.probe`: a growth slot, on its first activation).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "ACTIVATION_RANKS",
    "ACTIVATION_SHAPES",
    "BUILTIN_TABLE",
    "CONTEXTS",
    "NO_BLUEPRINT",
    "REFERENCE_WIDTHS",
    "TOPOLOGIES",
    "TOPOLOGY_OF_RANK",
    "BlueprintError",
    "BlueprintSpec",
    "LayerScale",
    "LayerScale2d",
    "available",
    "blueprint_at",
    "blueprint_index",
    "blueprint_table",
    "build",
    "context_error",
    "get_spec",
    "param_count",
    "register",
    "scratch_registry",
    "unregister",
]

TOPOLOGIES: tuple[str, ...] = ("cnn", "transformer", "linear")

#: The activations a slot of each topology accepts, by rank; the slot width is dimension 1 of a
#: CNN feature map and the last dimension otherwise. Linear seeds act on each row (and on each
#: token of a ``[B, T, D]`` activation) alone.
ACTIVATION_RANKS: dict[str, tuple[int, ...]] = {"cnn": (4,), "transformer": (3,), "linear": (2, 3)}
#: The same, as written in messages.
ACTIVATION_SHAPES: dict[str, str] = {
    "cnn": "[B, C, H, W]", "transformer": "[B, T, D]", "linear": "[B, D] or [B, T, D]",
}
#: The topology a slot without one takes from the rank of its first activation.
TOPOLOGY_OF_RANK: dict[int, str] = {4: "cnn", 3: "transformer", 2: "linear"}

# Widths at which `available` compares blueprint sizes: a typical CNN slot, the TinyStories
# transformer's embedding width and a typical MLP hidden layer.
REFERENCE_WIDTHS: dict[str, int] = {"cnn": 64, "transformer": 384, "linear": 128}

# Every seed must preserve its input shape; these are the probe inputs used at build time.
_PROBE_SHAPES: dict[str, Callable[[int], tuple[int, ...]]] = {
    "cnn": lambda c: (2, c, 8, 8),  # [B, C, H, W]
    "transformer": lambda d: (2, 8, d),  # [B, T, D]
    "linear": lambda d: (2, d),  # [B, D]
}

DEFAULT_LAYER_SCALE = 1e-3
#: What a blueprint's factory can ask of its slot (`BlueprintSpec.context`), as said in messages.
CONTEXTS: dict[str, str] = {
    "growth": "a growth slot (after a block of a stack of same-shape blocks)",
}

#: Action index of "no blueprint": the blueprint head's value for every op but GERMINATE.
NO_BLUEPRINT = 0
#: The built-in part of the blueprint table: name of action index 1, 2, ... Append only: a new
#: built-in goes at the end, and a retired name (``flex_attention``) keeps its place, so the
#: blueprint head of every policy trained so far keeps its meaning.
BUILTIN_TABLE: tuple[str, ...] = (
    "conv_light",
    "attention",
    "norm",
    "depthwise",
    "bottleneck",
    "conv_small",
    "conv_heavy",
    "lora",
    "lora_large",
    "mlp_small",
    "mlp",
    "flex_attention",
    "mlp_bottleneck",
    "block_copy",
    "block_identity",
    "block_random",
)
# Names appear in command lines (``grower:conv_light:all``) and comma-separated lists.
_NAME = re.compile(r"[a-z][a-z0-9_]*")


class BlueprintError(ValueError):
    """A blueprint request or registration is invalid (unknown name, bad width, bad shape...)."""


@dataclass(frozen=True)
class BlueprintSpec:
    """A registered blueprint.

    Attributes:
        name: Blueprint name, unique within its topology (e.g. ``"conv_light"``).
        topology: One of :data:`TOPOLOGIES`.
        factory: Builds the seed for a slot of the given width (channels for CNNs, model width
            ``D`` for transformers and linear slots), plus one keyword argument per name of
            ``context``. Called without them it must still build a seed of the right size:
            `param_count` and `available` count parameters without any slot.
        description: One line describing the structure and parameter count formula.
        context: What else the factory takes from the slot at germination, by keyword (see
            `CONTEXTS`); `build` refuses to germinate without it.
        incubation: Epochs the seed must spend in TRAINING before gate G2 lets it blend (None:
            the slot's `GateConfig.min_training_epochs`). 0: the seed never incubates; its
            germination passes G0, G1 and G2 at once and it enters BLENDING in the same
            decision (`SeedSlot.germinate`), G2 having nothing to measure on a seed that never
            ran.
        blend_tempo: Alpha ticks (one per decision) of its blend, overriding the germinating
            action's tempo (None: the action's). 0: alpha is 1 from the moment it blends.
        probe: Whether `build` runs the shape probe on a synthetic input. A seed whose blocks
            need their call's other arguments (a growth seed's rotary embeddings, say) skips
            it: its slot checks the shapes on its first real activation instead.
    """

    name: str
    topology: str
    factory: Callable[..., nn.Module]
    description: str
    context: tuple[str, ...] = ()
    incubation: int | None = None
    blend_tempo: int | None = None
    probe: bool = True


_REGISTRY: dict[str, dict[str, BlueprintSpec]] = {topology: {} for topology in TOPOLOGIES}
#: Name of each action index from 1 on (index 0 is `NO_BLUEPRINT`); grows in `register` only.
_TABLE: list[str] = list(BUILTIN_TABLE)


class LayerScale(nn.Module):
    """Per-channel learnable gain on the last dimension (``[..., D]``), as in CaiT.

    Args:
        dim: Size of the last dimension.
        init_value: Initial gain. Small and non-zero so the residual branch starts near silent
            but still passes gradient to every layer behind it.
    """

    def __init__(self, dim: int, init_value: float = DEFAULT_LAYER_SCALE) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init_value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class LayerScale2d(nn.Module):
    """Per-channel learnable gain on dimension 1 of a ``[B, C, H, W]`` feature map.

    Args:
        channels: Number of channels ``C``.
        init_value: Initial gain (see :class:`LayerScale`).
    """

    def __init__(self, channels: int, init_value: float = DEFAULT_LAYER_SCALE) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((channels,), init_value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma.view(-1, 1, 1)


def _check_topology(topology: str) -> None:
    if topology not in _REGISTRY:
        raise BlueprintError(f"unknown topology {topology!r}; accepted: {', '.join(TOPOLOGIES)}")


def _check_channels(channels: int) -> int:
    try:
        value = operator.index(channels)
    except TypeError:
        value = None
    if value is None or isinstance(channels, bool) or value < 1:
        raise BlueprintError(f"channels must be a positive integer (>= 1), got {channels!r}")
    return value


def register(spec: BlueprintSpec) -> BlueprintSpec:
    """Add a blueprint to the registry; a name new to the blueprint table gets the next index.

    Example:
        >>> spec = BlueprintSpec("double", "cnn", lambda c: LayerScale2d(c, 2.0), "2x; C")
        >>> with scratch_registry():
        ...     _ = register(spec)
        ...     blueprint_index("double") == len(blueprint_table()) - 1
        True

    Args:
        spec: The blueprint to add.

    Returns:
        ``spec`` unchanged, so registration can be written inline.

    Raises:
        BlueprintError: If the topology is unknown, the name is not lower-case letters, digits
            and underscores starting with a letter, the factory is not callable, or the name
            is already registered for that topology.
    """
    _check_topology(spec.topology)
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        raise BlueprintError(
            f"blueprint name must be lower-case letters, digits and underscores starting with a "
            f"letter, got {spec.name!r}"
        )
    if not callable(spec.factory):
        raise BlueprintError(f"blueprint {spec.name!r} factory must be callable")
    unknown = [c for c in spec.context if c not in CONTEXTS]
    if unknown:
        raise BlueprintError(f"blueprint {spec.name!r} asks for unknown context {unknown[0]!r}; "
                             f"accepted: {', '.join(CONTEXTS)}")
    for knob, low in (("incubation", 0), ("blend_tempo", 0)):
        value = getattr(spec, knob)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):
            raise BlueprintError(f"blueprint {spec.name!r}: {knob} must be an int >= {low} or "
                                 f"None, got {value!r}")
    table = _REGISTRY[spec.topology]
    if spec.name in table:
        raise BlueprintError(
            f"blueprint {spec.name!r} is already registered for topology {spec.topology!r}; "
            "unregister it first"
        )
    table[spec.name] = spec
    if spec.name not in _TABLE:
        _TABLE.append(spec.name)
    return spec


def unregister(name: str, topology: str = "cnn") -> BlueprintSpec:
    """Remove a blueprint from the registry. Its name keeps its index in the blueprint table, so
    registering it again gives it the same index.

    Args:
        name: Blueprint name.
        topology: Topology it was registered under.

    Returns:
        The removed spec (so a caller can register it again later).

    Raises:
        BlueprintError: If the topology or the name is unknown.
    """
    spec = get_spec(name, topology)
    del _REGISTRY[topology][name]
    return spec


def blueprint_table() -> tuple[str | None, ...]:
    """The blueprint name of every action index: None ("no blueprint") at `NO_BLUEPRINT`, then
    `BUILTIN_TABLE`, then the names registered since, in registration order.

    Its length is the size of the blueprint head of a policy created now.

    Example:
        >>> blueprint_table()[:4]
        (None, 'conv_light', 'attention', 'norm')
    """
    return (None, *_TABLE)


def blueprint_index(name: str | None) -> int:
    """Action index of a blueprint name (`NO_BLUEPRINT` for None).

    Raises:
        BlueprintError: If the name is not in the blueprint table.
    """
    if name is None:
        return NO_BLUEPRINT
    try:
        return _TABLE.index(name) + 1
    except ValueError:
        raise BlueprintError(f"unknown blueprint {name!r}; known: {', '.join(_TABLE)}") from None


def blueprint_at(index: int) -> str | None:
    """Blueprint name of an action index (None for `NO_BLUEPRINT`).

    Raises:
        BlueprintError: If the index is outside the blueprint table.
    """
    if not 0 <= index <= len(_TABLE):
        raise BlueprintError(f"blueprint index {index!r} outside the table 0..{len(_TABLE)}")
    return None if index == NO_BLUEPRINT else _TABLE[index - 1]


@contextmanager
def scratch_registry() -> Iterator[None]:
    """On exit, put the registry and the blueprint table back as they were on entry.

    For tests and throwaway experiments only: everywhere else the table only grows, because a
    policy created inside keeps indices that the process forgets here.
    """
    specs = {topology: dict(table) for topology, table in _REGISTRY.items()}
    names = list(_TABLE)
    try:
        yield
    finally:
        for topology, table in _REGISTRY.items():
            table.clear()
            table.update(specs[topology])
        _TABLE[:] = names


def get_spec(name: str, topology: str = "cnn") -> BlueprintSpec:
    """Look up a registered blueprint.

    Args:
        name: Blueprint name.
        topology: One of :data:`TOPOLOGIES`.

    Returns:
        The registered spec.

    Raises:
        BlueprintError: If the topology or the name is unknown.
    """
    _check_topology(topology)
    spec = _REGISTRY[topology].get(name) if isinstance(name, str) else None
    if spec is None:
        raise BlueprintError(
            f"unknown blueprint {name!r} for topology {topology!r}; "
            f"available: {', '.join(available(topology))}"
        )
    return spec


def _instantiate(spec: BlueprintSpec, channels: int, **context: Any) -> nn.Module:
    module = spec.factory(channels, **context)
    if not isinstance(module, nn.Module):
        raise BlueprintError(
            f"blueprint {spec.name!r} factory returned {type(module).__name__}, "
            "expected an nn.Module"
        )
    return module


def param_count(name: str, channels: int, topology: str = "cnn") -> int:
    """Exact number of trainable parameters of a blueprint at a given width.

    The seed is built on the meta device, so this allocates no parameter memory.

    Args:
        name: Blueprint name.
        channels: Slot width (``C`` for CNNs, ``D`` otherwise), at least 1.
        topology: One of :data:`TOPOLOGIES`.

    Returns:
        The number of scalars in parameters with ``requires_grad=True``.

    Raises:
        BlueprintError: On an unknown topology or name, or ``channels < 1``.
    """
    return _count(get_spec(name, topology), _check_channels(channels))


def _count(spec: BlueprintSpec, channels: int) -> int:
    try:
        with torch.device("meta"):
            module = _instantiate(spec, channels)
    except (NotImplementedError, RuntimeError):
        # A user factory may do data-dependent work the meta device cannot run; pay for a real
        # build rather than refuse to count it.
        module = _instantiate(spec, channels)
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def available(topology: str = "cnn") -> tuple[str, ...]:
    """Names of the blueprints registered for a topology, smallest first.

    Args:
        topology: One of :data:`TOPOLOGIES`.

    Returns:
        Names sorted by (parameter count at :data:`REFERENCE_WIDTHS` for the topology, name).

    Raises:
        BlueprintError: If the topology is unknown.
    """
    _check_topology(topology)
    return tuple(sorted(_REGISTRY[topology], key=lambda n: (_reference_count(topology, n), n)))


#: Each spec's parameter count at its topology's reference width: `available` sorts by it on
#: every call, and building every seed again (on the meta device) made a call cost ~0.1 s. Keyed
#: by the spec object (kept alive beside its count, so its id is never reused), so a name
#: registered again is counted again; a factory need not be hashable.
_REFERENCE_COUNTS: dict[int, tuple[BlueprintSpec, int]] = {}


def _reference_count(topology: str, name: str) -> int:
    spec = _REGISTRY[topology][name]
    if id(spec) not in _REFERENCE_COUNTS:
        _REFERENCE_COUNTS[id(spec)] = (spec, _count(spec, REFERENCE_WIDTHS[topology]))
    return _REFERENCE_COUNTS[id(spec)][1]


def _probe(module: nn.Module, name: str, shape: tuple[int, ...], fallback: torch.dtype) -> None:
    reference = next(itertools.chain(module.parameters(), module.buffers()), None)
    device = reference.device if reference is not None else torch.device("cpu")
    dtype = fallback
    if reference is not None and reference.is_floating_point():
        dtype = reference.dtype
    # A deterministic probe, so germinating a seed draws nothing from the global RNG beyond the
    # seed's own initialisation.
    x = torch.linspace(-2.0, 2.0, steps=torch.Size(shape).numel(), device=device, dtype=dtype)
    x = x.reshape(shape)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(x)
    except Exception as err:
        raise BlueprintError(
            f"blueprint {name!r} failed the shape probe on input {shape}: "
            f"{type(err).__name__}: {err}"
        ) from err
    finally:
        module.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise BlueprintError(
            f"blueprint {name!r} returned {type(out).__name__} for input {shape}; "
            "seeds must return a tensor of their input shape"
        )
    if tuple(out.shape) != shape:
        raise BlueprintError(
            f"blueprint {name!r} changed the shape {shape} -> {tuple(out.shape)}; "
            "seeds must preserve their input shape"
        )


def context_error(name: str, topology: str, context: Mapping[str, Any] | None) -> str | None:
    """What blueprint ``name`` needs at germination and ``context`` lacks (None: nothing).

    Example:
        >>> context_error("block_copy", "transformer", {"growth": None})[:42]
        "blueprint 'block_copy' needs a growth slot"
    """
    spec = get_spec(name, topology)
    missing = [c for c in spec.context if (context or {}).get(c) is None]
    if not missing:
        return None
    return f"blueprint {name!r} needs " + " and ".join(CONTEXTS[c] for c in missing)


def build(
    name: str,
    channels: int,
    topology: str = "cnn",
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    context: Mapping[str, Any] | None = None,
    layer_scale: float | None = None,
) -> nn.Module:
    """Build the seed module for a slot and check that it preserves its input shape.

    The probe input is ``(2, C, 8, 8)`` for CNNs, ``(2, 8, D)`` for transformers and ``(2, D)``
    for linear slots. It runs in
    eval mode under ``no_grad``; the module's train/eval mode is restored afterwards.

    Args:
        name: Blueprint name.
        channels: Slot width (``C`` for CNNs, ``D`` otherwise), at least 1.
        topology: One of :data:`TOPOLOGIES`.
        device: Device for the parameters; the default device if ``None``.
        dtype: Floating dtype for the parameters; unchanged if ``None``.
        context: What the slot offers (`CONTEXTS` names, a value or None each); the factory
            receives the entries its spec's ``context`` names.
        layer_scale: Initial gain of every `LayerScale` / `LayerScale2d` in the seed (None:
            the blueprint's own, `DEFAULT_LAYER_SCALE` for the built-ins).

    Returns:
        The seed module, in training mode.

    Raises:
        BlueprintError: On an unknown topology or name, ``channels < 1``, a missing context, a
            factory that returns no module, or a module whose output is not a tensor of the
            input shape.
    """
    spec = get_spec(name, topology)
    channels = _check_channels(channels)
    missing = context_error(name, topology, context)
    if missing is not None:
        raise BlueprintError(missing)
    given = context or {}
    module = _instantiate(spec, channels, **{c: given[c] for c in spec.context})
    if device is not None or dtype is not None:
        module = module.to(device=device, dtype=dtype)
    if layer_scale is not None:
        _set_layer_scale(module, layer_scale)
    if spec.probe:
        _probe(module, name, _PROBE_SHAPES[topology](channels),
               dtype or torch.get_default_dtype())
    return module


@torch.no_grad()
def _set_layer_scale(module: nn.Module, value: float) -> None:
    for child in module.modules():
        if isinstance(child, LayerScale | LayerScale2d):
            child.gamma.fill_(value)
