"""The modules a depth-growth seed is made of: the new blocks, and the gate of a gated identity.

`GrownBlocks` holds the new blocks (each of the user's own block class) and runs them in order
on the hidden state under the call of the block the slot follows (`site.BlockCall`).
`GatedBlock` is the identity init's fallback for a block whose residual output projections are
unknown: ``x + g ⊙ (block(x) − x)`` with a per-channel gate ``g`` at zero, so the block is the
identity at birth whatever it contains and every parameter learns once ``g`` moves.
`clone_block` copies a block without the slot hooks attached to it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from esper_lightning.blueprints.growth.site import BlockCall, hidden_of

__all__ = ["SLOT_HOOK_MARK", "GatedBlock", "GrownBlocks", "clone_block"]

#: Attribute that marks a forward hook as a slot's (`core.injection`): never copied with a block.
SLOT_HOOK_MARK = "_esper_slot_hook"
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


class GrownBlocks(nn.Sequential):
    """New blocks of a stack, applied in order to the hidden state.

    Its children are the blocks themselves (``0``, ``1``, ...), each an instance of the stack's
    own block class (or a `GatedBlock` around one), so a hand-back moves them into the stack
    as they are. A checkpoint written when a one-block seed was the bare block (keys without
    the ``0.`` prefix) loads too.

    Example:
        >>> seed = GrownBlocks([nn.Linear(4, 4), nn.Linear(4, 4)])
        >>> seed(torch.zeros(2, 4)).shape
        torch.Size([2, 4])
    """

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__(*blocks)
        self._register_load_state_dict_pre_hook(_bare_block_keys)

    def forward(self, x: Tensor, call: BlockCall | None = None) -> Tensor:  # [B, T, D]
        for block in self:
            x = hidden_of(block(x)) if call is None else call.run(block, x)
        return x


def _bare_block_keys(state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Keys of a one-block seed saved as the bare block (``seed.ln_1.weight``) under the
    block's own name (``seed.0.ln_1.weight``)."""
    keys = [k for k in state_dict if k.startswith(prefix)]
    if keys and not any(k[len(prefix):].split(".", 1)[0].isdigit() for k in keys):
        for key in keys:
            state_dict[f"{prefix}0.{key[len(prefix):]}"] = state_dict.pop(key)


class GatedBlock(nn.Module):
    """``x + g ⊙ (block(x) − x)``, the per-channel gate ``g`` starting at 0 (the identity).

    Args:
        block: Any block mapping a hidden state ``[..., D]`` to one of the same shape (extra
            arguments pass through).
        width: ``D``, the gate's size.

    Example:
        >>> gated = GatedBlock(nn.Linear(4, 4), width=4)
        >>> x = torch.randn(2, 4)
        >>> torch.equal(gated(x), x)
        True
    """

    def __init__(self, block: nn.Module, width: int) -> None:
        super().__init__()
        self.block = block
        reference = next(block.parameters(), None)
        self.gate = nn.Parameter(torch.zeros(width, device=None if reference is None
                                             else reference.device,
                                             dtype=None if reference is None
                                             else reference.dtype))

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return x + self.gate * (hidden_of(self.block(x, *args, **kwargs)) - x)


def clone_block(block: nn.Module) -> nn.Module:
    """A deep copy of ``block`` (weights, buffers, submodules), without the slot hooks on it or
    its submodules: a copy must not run the slots that follow its source."""
    saved: list[tuple[nn.Module, dict[str, Any]]] = []
    for module in block.modules():
        # A hook's handle id keys it in each of the dicts it appears in.
        marked = {key for key, hook in module._forward_hooks.items()
                  if getattr(hook, SLOT_HOOK_MARK, False)}
        if marked:
            dicts = {name: getattr(module, name) for name in _HOOK_DICTS}
            saved.append((module, dicts))
            for name, hooks in dicts.items():
                setattr(module, name, type(hooks)(
                    (k, v) for k, v in hooks.items() if k not in marked))
    try:
        return copy.deepcopy(block)
    finally:
        for module, dicts in saved:  # the very dicts, in their order
            for name, hooks in dicts.items():
                setattr(module, name, hooks)
