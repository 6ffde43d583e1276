"""Seed blueprints: the small modules a host grows in its slots, per topology.

Importing this package registers the built-in CNN and transformer blueprints::

    from esper_lightning import blueprints

    blueprints.available("cnn")  # ('norm', 'attention', 'conv_small', ...), smallest first
    seed = blueprints.build("conv_light", channels=32)
"""

from esper_lightning.blueprints import cnn, transformer  # noqa: F401  (registers the built-ins)
from esper_lightning.blueprints.registry import (
    TOPOLOGIES,
    BlueprintError,
    BlueprintSpec,
    available,
    build,
    get_spec,
    param_count,
    register,
    unregister,
)

__all__ = [
    "TOPOLOGIES",
    "BlueprintError",
    "BlueprintSpec",
    "available",
    "build",
    "get_spec",
    "param_count",
    "register",
    "unregister",
]
