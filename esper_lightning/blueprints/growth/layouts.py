"""Where common transformer blocks keep the output projections of their residual branches.

A pre-norm block is ``x + attn(LN x)`` then ``x + mlp(LN x)``; each branch ends in a linear
projection back to the residual stream. With both projections (weights and biases) at zero the
block returns its input exactly: how offline depth up-scaling starts its added layers as the
identity, and how the ``identity`` growth operator does. A block laid out otherwise names its
projections (``DepthGrowth(projections=...)``) or is gated instead (`seed.GatedBlock`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["LAYOUTS", "residual_projections", "zero_projections"]

#: Layout -> the output projections of its two residual branches, by name inside a block.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "nanoGPT and Hugging Face GPT-2": ("attn.c_proj", "mlp.c_proj"),
    "Hugging Face Llama, Mistral, Qwen2": ("self_attn.o_proj", "mlp.down_proj"),
    "timm ViT": ("attn.proj", "mlp.fc2"),
}


def residual_projections(block: nn.Module,
                         names: Sequence[str] | None = None) -> list[nn.Module] | None:
    """The modules ``names`` names in ``block`` (each with a ``weight``), or, without names, those
    of the first layout in `LAYOUTS` that ``block`` has; None when none is found.

    Raises:
        ValueError: A named projection ``block`` lacks (one line naming it and the modules).

    Example:
        >>> from esper_lightning.blueprints.block import Block
        >>> [type(m).__name__ for m in residual_projections(Block(8, 2))]
        ['Linear', 'Linear']
    """
    modules = dict(block.named_modules())
    if names is not None:
        missing = [n for n in names if not hasattr(modules.get(n), "weight")]
        if missing:
            linear = [n for n, m in modules.items() if hasattr(m, "weight") and n]
            raise ValueError(f"{type(block).__name__} has no projection {missing[0]!r}; its "
                             f"modules with weights: {', '.join(linear)}")
        return [modules[n] for n in names]
    for layout in LAYOUTS.values():
        if all(hasattr(modules.get(n), "weight") for n in layout):
            return [modules[n] for n in layout]
    return None


@torch.no_grad()
def zero_projections(projections: Sequence[nn.Module]) -> None:
    """Zero the weight (and bias) of every projection."""
    for module in projections:
        module.weight.zero_()
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias.zero_()
