"""``random``: a block of its source's class and shape, initialised as the model initialises.

* **What**: a copy of the source re-initialised by the model's own init (``init`` of the growth
  site: `GPTHost`'s GPT-2 init, a Hugging Face model's ``_init_weights``, a user's
  ``DepthGrowth(init=...)``), else every submodule's ``reset_parameters``.
* **Function at birth**: changed (a random residual update): its seed blends over one epoch at
  alpha ½.
* **Optimizer**: fresh moments (there is nothing to copy them from).
* **FLOPs**: each new block costs what its source costs.
* **Results** (docs/evidence.md): the worst growing arm at equal compute (+0.090 bits/byte
  against the network born big): what the small model learned is what growth keeps.
"""

from __future__ import annotations

from torch import nn

from esper_lightning.blueprints.growth.registry import GrowthOperator, register_operator
from esper_lightning.blueprints.growth.seed import clone_block
from esper_lightning.blueprints.growth.site import GrowthSite

__all__ = ["RANDOM", "random_block", "reset_parameters"]


def reset_parameters(block: nn.Module) -> None:
    """Every submodule's own ``reset_parameters`` (PyTorch's default init of each layer)."""
    for module in block.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


def random_block(source: nn.Module, site: GrowthSite) -> nn.Module:
    """A copy of ``source`` with fresh weights from the model's init (`GrowthSite.init`)."""
    block = clone_block(source)
    (site.init or reset_parameters)(block)
    return block


RANDOM = register_operator(GrowthOperator(
    "random", random_block, preserves_function=False, copies_weights=False,
    description="fresh blocks of the stack's class, the model's init; FLOPs as theirs"))
