"""The registry of growth operators: how new blocks of a stack are made from the blocks there.

A growth operator is a small self-contained unit with a functional form and a contract:

* **what it builds**: ``build(source, site)`` returns one new block from its *source* block (an
  instance of the stack's own block class, or a module wrapping one) that maps a hidden state
  to one of the same shape under the same call;
* **whether it preserves the function**: a new block that returns its input at birth leaves
  the model's output unchanged (``preserves_function``); its seed then blends at once (blend
  tempo 0), any other over one epoch at alpha ½ (tempo 2);
* **whether it copies weights** (``copies_weights``): only then may the new block start from
  its source's optimizer moments (``DepthGrowth(moments="copy")``);
* **its FLOPs**: a new block costs what its source costs, measured by the meter like every
  seed's (`core.flops`), plus what a wrapper adds.

`register_operator` also registers the blueprint ``block_<name>`` (topology ``transformer``,
no incubation, context ``growth``), so controllers germinate an operator by that name and a
PPO policy created afterwards has a head entry for it: a new operator is one file and one
registration (docs/design.md, "A growth operator"). The built-ins: ``copy``, ``identity``,
``random`` (`blueprints.growth.copy`, `.identity`, `.random`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from torch import nn

from esper_lightning.blueprints.block import Block
from esper_lightning.blueprints.growth.seed import GrownBlocks
from esper_lightning.blueprints.growth.site import GrowthSite
from esper_lightning.blueprints.registry import BlueprintError, BlueprintSpec, register
from esper_lightning.blueprints.transformer import default_num_heads

__all__ = [
    "BLUEPRINT_PREFIX",
    "GrowthOperator",
    "build_seed",
    "get_operator",
    "growth_blueprint",
    "operator_of",
    "operators",
    "register_operator",
    "scratch_operators",
]

#: A growth operator ``op`` is germinated as the blueprint ``block_<op>``.
BLUEPRINT_PREFIX = "block_"
_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: Blend tempo of a seed whose blocks change the function at birth: one epoch at alpha ½.
CHANGING_TEMPO = 2


@dataclass(frozen=True)
class GrowthOperator:
    """A registered way to make a new block from a source block (module docstring).

    Attributes:
        name: Lower-case name (``copy``); germinated as the blueprint ``block_<name>``.
        build: ``(source block, site) -> new block``.
        preserves_function: The new block returns its input at birth.
        copies_weights: The new block starts from its source's weights (moments may follow).
        description: One line: what it builds and what it costs.
        blend_tempo: Alpha ticks of its seed's blend; None: 0 when it preserves the function,
            else `CHANGING_TEMPO`.
    """

    name: str
    build: Callable[[nn.Module, GrowthSite], nn.Module]
    preserves_function: bool
    copies_weights: bool
    description: str
    blend_tempo: int | None = None

    @property
    def tempo(self) -> int:
        if self.blend_tempo is not None:
            return self.blend_tempo
        return 0 if self.preserves_function else CHANGING_TEMPO

    @property
    def blueprint(self) -> str:
        return BLUEPRINT_PREFIX + self.name


_OPERATORS: dict[str, GrowthOperator] = {}


def register_operator(operator: GrowthOperator) -> GrowthOperator:
    """Register ``operator`` and its blueprint ``block_<name>``.

    Raises:
        BlueprintError: A bad or taken name, or a build that is not callable (one line).
    """
    if not isinstance(operator.name, str) or not _NAME.fullmatch(operator.name):
        raise BlueprintError(f"growth operator name must be lower-case letters, digits and "
                             f"underscores starting with a letter, got {operator.name!r}")
    if operator.name in _OPERATORS:
        raise BlueprintError(f"growth operator {operator.name!r} is already registered")
    if not callable(operator.build):
        raise BlueprintError(f"growth operator {operator.name!r}: build must be callable")
    register(BlueprintSpec(operator.blueprint, "transformer", partial(_factory, operator.name),
                           f"{operator.description} (growth operator {operator.name!r})",
                           context=("growth",), incubation=0, blend_tempo=operator.tempo,
                           probe=False))
    _OPERATORS[operator.name] = operator
    return operator


def get_operator(name: str) -> GrowthOperator:
    """The operator registered as ``name`` (one-line `BlueprintError` listing the others)."""
    if name not in _OPERATORS:
        raise BlueprintError(f"unknown growth operator {name!r}; accepted: "
                             f"{', '.join(_OPERATORS)}")
    return _OPERATORS[name]


def operators() -> tuple[str, ...]:
    """Names of the registered growth operators, in registration order."""
    return tuple(_OPERATORS)


def operator_of(blueprint: str | None) -> GrowthOperator | None:
    """The growth operator behind a blueprint name, or None for any other blueprint."""
    if blueprint is None or not blueprint.startswith(BLUEPRINT_PREFIX):
        return None
    return _OPERATORS.get(blueprint[len(BLUEPRINT_PREFIX):])


def growth_blueprint(name: str) -> str:
    """The blueprint that germinates growth operator ``name``.

    Example:
        >>> growth_blueprint("identity")
        'block_identity'
    """
    return get_operator(name).blueprint


def build_seed(operator: GrowthOperator, site: GrowthSite) -> GrownBlocks:
    """The seed of ``site.blocks`` new blocks, each built by ``operator`` from its source."""
    return GrownBlocks([operator.build(source, site) for source in site.sources()])


def _factory(name: str, channels: int, growth: GrowthSite | None = None) -> nn.Module:
    """The blueprint factory: the seed at a growth site; without one (counting parameters),
    one nanoGPT `Block` of width ``channels`` stands in for a block of the stack."""
    if growth is None:
        return GrownBlocks([Block.like(Block(channels, default_num_heads(channels)))])
    return build_seed(get_operator(name), growth)


@contextmanager
def scratch_operators() -> Iterator[None]:
    """On exit, put the operator registry back as it was (tests; use with
    `blueprints.scratch_registry`, which puts the blueprints back)."""
    saved = dict(_OPERATORS)
    try:
        yield
    finally:
        _OPERATORS.clear()
        _OPERATORS.update(saved)
