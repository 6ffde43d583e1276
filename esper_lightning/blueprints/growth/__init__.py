"""Growth operators: depth growth on any stack of same-shape blocks, as a family of blueprints.

A growth operator makes the new blocks of a stack from the blocks already there (`registry`:
the contract, `register_operator`); each is germinated as the blueprint ``block_<name>`` in a
growth slot (`site.GrowthSite`: how many blocks, made from which, called how). Importing this
package registers the built-ins, one file each: ``copy`` (`copy`), ``identity`` (`identity`)
and ``random`` (`random`).

    from esper_lightning.blueprints.growth import GrowthOperator, register_operator
    register_operator(GrowthOperator("halve", my_build, preserves_function=False,
                                     copies_weights=True, description="..."))
"""

from esper_lightning.blueprints.growth import copy, identity, random  # noqa: F401 (built-ins)
from esper_lightning.blueprints.growth.layouts import LAYOUTS, residual_projections
from esper_lightning.blueprints.growth.registry import (
    BLUEPRINT_PREFIX,
    GrowthOperator,
    build_seed,
    get_operator,
    growth_blueprint,
    operator_of,
    operators,
    register_operator,
    scratch_operators,
)
from esper_lightning.blueprints.growth.seed import GatedBlock, GrownBlocks, clone_block
from esper_lightning.blueprints.growth.site import MOMENTS, BlockCall, GrowthSite, hidden_of

__all__ = [
    "BLUEPRINT_PREFIX",
    "LAYOUTS",
    "MOMENTS",
    "BlockCall",
    "GatedBlock",
    "GrownBlocks",
    "GrowthOperator",
    "GrowthSite",
    "build_seed",
    "clone_block",
    "get_operator",
    "growth_blueprint",
    "hidden_of",
    "operator_of",
    "operators",
    "register_operator",
    "residual_projections",
    "scratch_operators",
]
