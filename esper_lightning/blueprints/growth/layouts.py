"""Where common transformer blocks keep the output projections of their residual branches.

A pre-norm block is ``x + attn(LN x)`` then ``x + mlp(LN x)``; each branch ends in a linear
projection back to the residual stream. With both projections (weights and biases) at zero the
block returns its input exactly: how offline depth up-scaling starts its added layers as the
identity, and how the ``identity`` growth operator does. A block laid out otherwise has its
projections found by running it (`find_projections`: the fewest of its layers, the last one of
each residual branch, whose zeroing makes it return its input exactly) or named by the user
(``DepthGrowth(projections=...)``); where no layer does it (a post-norm block), it is gated
instead (`seed.GatedBlock`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from esper_lightning.blueprints.growth.seed import clone_block

__all__ = ["LAYOUTS", "find_projections", "layout_names", "probe_projections",
           "residual_projections", "zero_projections"]

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
    layout = layout_names(block)
    return None if layout is None else [modules[n] for n in layout]


def layout_names(block: nn.Module) -> tuple[str, ...] | None:
    """The projections' names of the first layout in `LAYOUTS` that ``block`` has, or None.

    Example:
        >>> from esper_lightning.blueprints.block import Block
        >>> layout_names(Block(8, 2))
        ('attn.c_proj', 'mlp.c_proj')
    """
    modules = dict(block.named_modules())
    for layout in LAYOUTS.values():
        if all(hasattr(modules.get(n), "weight") for n in layout):
            return layout
    return None


@torch.no_grad()
def zero_projections(projections: Sequence[nn.Module]) -> None:
    """Zero the weight (and bias) of every projection."""
    for module in projections:
        module.weight.zero_()
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias.zero_()


def _weighted(module: nn.Module) -> bool:
    return isinstance(getattr(module, "weight", None), Tensor)


def find_projections(block: nn.Module, run: Callable[[nn.Module], Tensor],
                     hidden: Tensor) -> tuple[str, ...] | None:
    """The residual output projections of ``block``, found by running it: the fewest of its
    layers with a weight and an output as wide as the hidden state whose weights and biases at
    zero make ``run`` of a copy return ``hidden`` exactly; None when no such set exists (a
    post-norm block normalises the sum itself).

    Every such layer the block runs is first zeroed together; then, in the order the block
    runs them, each gets its weights back while the copy still returns its input. What stays
    zero is the last layer of each residual branch (``x + proj(...)``): a norm or an input
    projection before it is restored, since the branch's output is zero without it. ``block``
    itself is neither changed nor run (each run is of a copy, without gradients).

    Args:
        block: One block of a stack.
        run: ``block -> its hidden state`` for the input ``hidden`` (with the block's call).
        hidden: The hidden state ``run`` passes in.

    Returns:
        The layers' names inside ``block``, in the order it runs them.

    Example:
        >>> from esper_lightning.blueprints.block import Block
        >>> x = torch.randn(2, 3, 8)
        >>> find_projections(Block(8, 2), lambda b: b(x), x)
        ('attn.c_proj', 'mlp.c_proj')
    """
    block = clone_block(block)  # without the slots' hooks: running it must not run them
    names = {module: name for name, module in block.named_modules() if name}
    order: list[str] = []

    def record(module: nn.Module, args: object, output: object) -> None:
        name = names[module]
        if (name not in order and isinstance(output, Tensor)
                and output.shape[-1:] == hidden.shape[-1:]):
            order.append(name)

    handles = [m.register_forward_hook(record) for m in names if _weighted(m)]
    try:
        with torch.no_grad():
            run(block)
    finally:
        for handle in handles:
            handle.remove()

    def returns_input(zeroed: Sequence[str]) -> bool:
        trial = clone_block(block)
        modules = dict(trial.named_modules())
        zero_projections([modules[n] for n in zeroed])
        with torch.no_grad():
            return torch.equal(run(trial), hidden)

    if not order or not returns_input(order):
        return None
    kept = list(order)
    for name in order:  # the earliest first: what stays zero is the last of each branch
        rest = [n for n in kept if n != name]
        if rest and returns_input(rest):
            kept = rest
    return tuple(kept)


def probe_projections(block: nn.Module, width: int | None) -> tuple[str, ...] | None:
    """`find_projections` on a seeded random hidden state ``[2, 4, width]`` passed alone, for
    building new blocks where no activation is at hand; None for a block that needs more
    arguments or runs otherwise. ``width`` None: the size of the block's first norm, or the
    input size of its first linear layer."""
    if width is None:
        width = next((int(m.weight.shape[-1]) for m in block.modules()
                      if isinstance(m, nn.Linear) or (_weighted(m) and m.weight.dim() == 1)),
                     None)
    reference = next(block.parameters(), None)
    if width is None or reference is None:
        return None
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 4, width, generator=generator).to(reference)
    try:
        return find_projections(block, lambda b: _first(b(hidden)), hidden)
    except Exception:  # a block that cannot run on a bare hidden state (it needs a mask, ...)
        return None


def _first(output: object) -> Tensor:
    """A block's hidden state: its output, or the first element of a tuple."""
    if isinstance(output, tuple | list):
        output = output[0]
    if not isinstance(output, Tensor):
        raise TypeError(f"a block returned {type(output).__name__}, not a hidden state")
    return output
