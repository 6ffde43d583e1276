"""``identity``: a copy of its source block that returns its input at birth.

* **What**: a copy of the source with the output projections of its residual branches at zero
  (weights and biases): named by the user (``DepthGrowth(projections=...)``), of a common
  layout (`layouts.LAYOUTS`: nanoGPT, Hugging Face GPT-2 and Llama, timm ViT), or, for any other
  block, found by running it (`layouts.find_projections`: the last layer of each residual
  branch, on a growth slot's first activation; `layouts.probe_projections` on a random hidden
  state elsewhere). Where no set of layers at zero makes the copy return its input (a post-norm
  block), the copy is wrapped in a zero-initialised per-channel gate on its residual update
  (`seed.GatedBlock`) unless the gate is turned off (then the growth slot is refused at fit
  start).
* **Function at birth**: unchanged, exactly: its seed blends at once (alpha 1 from the next
  step). On the first step only the zeroed projections (or the gate) get gradient; the rest of
  the block follows once they move.
* **Optimizer**: fresh moments, or the source's (``DepthGrowth(moments="copy")``).
* **FLOPs**: each new block costs what its source costs (a gate adds one product per value).
* **Results** (docs/evidence.md): the best growing arm of the width-32 GPT at equal compute.
"""

from __future__ import annotations

from torch import nn

from esper_lightning.blueprints.growth.layouts import (
    layout_names,
    probe_projections,
    residual_projections,
    zero_projections,
)
from esper_lightning.blueprints.growth.registry import GrowthOperator, register_operator
from esper_lightning.blueprints.growth.seed import GatedBlock, clone_block
from esper_lightning.blueprints.growth.site import GrowthSite
from esper_lightning.blueprints.registry import BlueprintError

__all__ = ["IDENTITY", "identity_block", "identity_mode", "projection_names"]

#: How the identity init makes a copy return its input.
MODES = ("projections", "gate")


def projection_names(block: nn.Module, site: GrowthSite) -> tuple[str, ...] | None:
    """The names of ``block``'s residual output projections: the site's (named by the user, or
    found on the slot's first activation), its layout's, or found by running it on a random
    hidden state of the site's width (`layouts.probe_projections`); None when none is."""
    if site.projections is not None:
        return site.projections
    return layout_names(block) or probe_projections(block, site.width)


def identity_mode(block: nn.Module, site: GrowthSite) -> str:
    """``"projections"`` when ``block``'s residual projections are known (`projection_names`),
    else ``"gate"`` where the site allows a gate. A site checked on a real activation
    (`GrowthSite.identity`) says which itself.

    Raises:
        BlueprintError: Neither is possible (one line naming the block and the fix).
    """
    if site.identity is not None:
        return site.identity
    if projection_names(block, site) is not None:
        return "projections"
    if site.gate:
        return "gate"
    raise BlueprintError(f"identity growth of {type(block).__name__}: no residual output "
                         "projections found (no known layout, and no layers at zero make it "
                         "return a bare hidden state) and the gate is off; accepted: "
                         "DepthGrowth(projections=[...names in the block...]) or gate=True")


def identity_block(source: nn.Module, site: GrowthSite) -> nn.Module:
    """A copy of ``source`` that returns its input (zeroed projections, or a gate at zero)."""
    block = clone_block(source)
    if identity_mode(block, site) == "projections":
        names = projection_names(block, site)
        if names is None:  # a resumed slot checked "projections" on a call this one cannot make
            raise BlueprintError(f"identity growth of {type(block).__name__}: its residual "
                                 "output projections are of no known layout and running it "
                                 "on a bare hidden state does not find them; accepted: "
                                 "DepthGrowth(projections=[...names in the block...])")
        zero_projections(residual_projections(block, names))
        return block
    if site.width is None:
        raise BlueprintError("a gated identity block needs the slot's width")
    return GatedBlock(block, site.width)


IDENTITY = register_operator(GrowthOperator(
    "identity", identity_block, preserves_function=True, copies_weights=True,
    description="copies of the blocks before the slot with zero residual output projections "
                "(or a zero gate): the identity at birth; FLOPs as theirs"))
