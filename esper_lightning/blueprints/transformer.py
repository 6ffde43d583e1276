"""Transformer seed blueprints for slots on the residual stream ``[B, T, D]``.

Same rules as the CNN blueprints: residual ``x + gamma * branch(x)`` with a per-channel
:class:`LayerScale` ``gamma = 1e-3`` (near identity at birth, every parameter live), branches that
end in a linear layer (signed residual), and no zero-initialised layers. Every blueprint is causal:
the output at position ``t`` depends on positions ``<= t`` only, as an autoregressive host needs.
Attention and MLP branches are pre-norm, as in the host's own blocks, because the residual stream
a slot sees can have any scale.

Parameter formulas use ``D`` for the slot width.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from esper_lightning.blueprints.cnn import NormSeed
from esper_lightning.blueprints.registry import (
    DEFAULT_LAYER_SCALE,
    BlueprintSpec,
    LayerScale,
    register,
)

__all__ = ["MLP", "CausalSelfAttention", "LoRA", "default_num_heads"]

NormFactory = Callable[[int], nn.Module]
ActFactory = Callable[[], nn.Module]


def default_num_heads(dim: int) -> int:
    """Head count for the ``attention`` blueprint: the first of 4, 2, 1 that divides ``dim``."""
    return next(h for h in (4, 2, 1) if dim % h == 0)


class LoRA(nn.Module):
    """``lora`` / ``lora_large``: low-rank residual update ``x + gamma * up(down(x))``.

    Both projections keep their default (non-zero) init; the LayerScale keeps the update small
    at birth. Zero-initialising ``up``, the usual LoRA recipe, would leave ``down`` without
    gradient on the first step.

    Params: ``2Dr + D`` (down and up without bias, gamma).

    Args:
        dim: Slot width ``D``.
        rank: Rank ``r`` of the update.
        init_scale: Initial LayerScale ``gamma``.
    """

    def __init__(self, dim: int, rank: int = 8, init_scale: float = DEFAULT_LAYER_SCALE) -> None:
        super().__init__()
        self.down = nn.Linear(dim, rank, bias=False)
        self.up = nn.Linear(rank, dim, bias=False)
        self.ls = LayerScale(dim, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ls(self.up(self.down(x)))


class CausalSelfAttention(nn.Module):
    """``attention``: pre-norm causal multi-head self-attention, ``x + gamma * proj(attn(Norm x))``.

    Params: ``4D^2 + 7D`` (norm 2D, qkv 3D^2 + 3D, proj D^2 + D, gamma D).

    Args:
        dim: Slot width ``D``.
        num_heads: Number of heads, must divide ``D``; :func:`default_num_heads` if ``None``.
        norm_layer: Builds the pre-normalisation for ``D`` channels.
        init_scale: Initial LayerScale ``gamma``.

    Raises:
        ValueError: If ``num_heads`` does not divide ``dim``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int | None = None,
        norm_layer: NormFactory = nn.LayerNorm,
        init_scale: float = DEFAULT_LAYER_SCALE,
    ) -> None:
        super().__init__()
        self.num_heads = default_num_heads(dim) if num_heads is None else num_heads
        if dim % self.num_heads != 0:
            raise ValueError(f"num_heads {self.num_heads} does not divide dim {dim}")
        self.norm = norm_layer(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ls = LayerScale(dim, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = x.shape[-1]
        q, k, v = self.qkv(self.norm(x)).split(dim, dim=-1)  # 3 x [B, T, D]
        # [B, T, D] -> [B, H, T, D / H]
        q, k, v = (t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).flatten(2)  # [B, T, D]
        return x + self.ls(self.proj(y))


class MLP(nn.Module):
    """``mlp_small`` / ``mlp``: pre-norm feed-forward, ``x + gamma * fc2(act(fc1(Norm(x))))``.

    Params: ``2Dh + h + 4D`` for hidden width ``h`` (norm 2D, fc1 Dh + h, fc2 hD + D, gamma D),
    with ``h = eD`` for expansion ``e``: ``4D^2 + 6D`` for ``mlp_small`` (e = 2), ``8D^2 + 8D``
    for ``mlp`` (e = 4). The linear blueprint ``mlp_bottleneck`` sets ``h`` directly.

    Args:
        dim: Slot width ``D``.
        expansion: Hidden width as a multiple of ``D`` (when ``hidden`` is None).
        norm_layer: Builds the pre-normalisation for ``D`` channels.
        act_layer: Hidden activation.
        init_scale: Initial LayerScale ``gamma``.
        hidden: Hidden width ``h``; None for ``expansion * dim``.
    """

    def __init__(
        self,
        dim: int,
        expansion: int = 4,
        norm_layer: NormFactory = nn.LayerNorm,
        act_layer: ActFactory = nn.GELU,
        init_scale: float = DEFAULT_LAYER_SCALE,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        width = expansion * dim if hidden is None else hidden
        self.norm = norm_layer(dim)
        self.fc1 = nn.Linear(dim, width)
        self.act = act_layer()
        self.fc2 = nn.Linear(width, dim)
        self.ls = LayerScale(dim, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ls(self.fc2(self.act(self.fc1(self.norm(x)))))


_BUILTINS = (
    BlueprintSpec(
        "norm",
        "transformer",
        partial(NormSeed, norm_layer=nn.LayerNorm),
        "x + tanh(s)*(LN(x) - x); 2D+1",
    ),
    BlueprintSpec("lora", "transformer", partial(LoRA, rank=8), "x + g*up(down x), rank 8; 17D"),
    BlueprintSpec(
        "lora_large", "transformer", partial(LoRA, rank=32), "x + g*up(down x), rank 32; 65D"
    ),
    BlueprintSpec(
        "attention",
        "transformer",
        CausalSelfAttention,
        "x + g*proj(causal SDPA(LN x)), 4 heads if they divide D; 4D^2+7D",
    ),
    BlueprintSpec(
        "mlp_small",
        "transformer",
        partial(MLP, expansion=2),
        "x + g*fc2(GELU(fc1(LN x))), 2x expansion; 4D^2+6D",
    ),
    BlueprintSpec(
        "mlp", "transformer", partial(MLP, expansion=4), "x + g*fc2(GELU(fc1(LN x))), 4x; 8D^2+8D"
    ),
)

for _spec in _BUILTINS:
    register(_spec)
