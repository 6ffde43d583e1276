"""Seed blueprints: the small modules a host grows in its slots, per topology.

Importing this package registers the built-in CNN, transformer and linear (MLP) blueprints,
and the growth operators' blueprints ``block_copy``, ``block_identity``, ``block_random``
(`growth`: depth growth on any stack of same-shape blocks)::

    from esper_lightning import blueprints

    blueprints.available("cnn")  # ('norm', 'attention', 'conv_small', ...), smallest first
    seed = blueprints.build("conv_light", channels=32)

A blueprint of your own is one `register` call; it gets the next action index, so controllers
can germinate it (``Action(LifecycleOp.GERMINATE, slot=0, blueprint="my_seed")``) and a PPO
policy created afterwards has a blueprint head entry for it::

    blueprints.register(BlueprintSpec("my_seed", "cnn", MySeed, "x + g*f(x); 2C^2"))
"""

from esper_lightning.blueprints import (  # noqa: F401  (the built-ins)
    cnn,
    growth,
    linear,
    transformer,
)
from esper_lightning.blueprints.registry import (
    ACTIVATION_RANKS,
    ACTIVATION_SHAPES,
    BUILTIN_TABLE,
    CONTEXTS,
    NO_BLUEPRINT,
    TOPOLOGIES,
    TOPOLOGY_OF_RANK,
    BlueprintError,
    BlueprintSpec,
    available,
    blueprint_at,
    blueprint_index,
    blueprint_table,
    build,
    context_error,
    get_spec,
    param_count,
    register,
    scratch_registry,
    unregister,
)

__all__ = [
    "ACTIVATION_RANKS",
    "ACTIVATION_SHAPES",
    "BUILTIN_TABLE",
    "CONTEXTS",
    "NO_BLUEPRINT",
    "TOPOLOGIES",
    "TOPOLOGY_OF_RANK",
    "BlueprintError",
    "BlueprintSpec",
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
