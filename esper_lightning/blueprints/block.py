"""The pre-norm transformer block that `GPTHost` stacks, and GPT-2's init of it.

`Block` is nanoGPT's: ``x + attn(LN x)`` then ``x + mlp(LN x)`` with causal multi-head
self-attention and a 4x GELU MLP. `GPTHost` stacks them; growing it deeper adds more of them
(`blueprints.growth`: the growth operators build new blocks of any stack's own block class, this
one included). Its residual branches end in ``attn.c_proj`` and ``mlp.c_proj``, the nanoGPT
layout the ``identity`` operator zeroes.

Params per block: ``12D^2 + 13D`` with biases (two LayerNorms 4D, qkv 3D^2 + 3D, attention
projection D^2 + D, MLP 4D^2 + 4D and 4D^2 + D).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Block",
    "BlockAttention",
    "BlockMLP",
    "init_block",
    "init_gpt_weights",
    "init_residual_projections",
]
#: Std of every Linear and Embedding weight at init (GPT-2's).
INIT_STD = 0.02


class BlockAttention(nn.Module):
    """Multi-head self-attention where position ``t`` attends to positions ``<= t`` only."""

    def __init__(self, dim: int, n_head: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if dim % n_head != 0:
            raise ValueError(f"n_head={n_head} must divide the width {dim}")
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(dim, 3 * dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        dim = x.shape[-1]
        q, k, v = self.c_attn(x).split(dim, dim=-1)  # 3 x [B, T, D]
        # [B, T, D] -> [B, H, T, D / H]
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).flatten(2)  # [B, T, D]
        return self.resid_drop(self.c_proj(y))


class BlockMLP(nn.Module):
    """Position-wise feed-forward: Linear(D, 4D) -> GELU -> Linear(4D, D)."""

    def __init__(self, dim: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim, bias=bias)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * dim, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.c_proj(self.act(self.c_fc(x))))  # [B, T, D]


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(LN x)`` then ``x + mlp(LN x)``, on ``[B, T, D]``.

    Construction leaves PyTorch's default init; `init_gpt_weights` and
    `init_residual_projections` give the host's (`Block.like` does both).

    Args:
        dim: Width ``D``.
        n_head: Attention heads; must divide ``dim``.
        dropout: Dropout on attention weights and residual branches.
        bias: Biases in the Linear and LayerNorm layers.
        depth: Blocks of the network it is made for: its residual projections are initialised
            with std ``0.02 / sqrt(2 * depth)``, so the stream's variance does not grow with
            depth.

    Example:
        >>> import torch
        >>> block = Block.like(Block(32, n_head=4))
        >>> block(torch.zeros(2, 8, 32)).shape
        torch.Size([2, 8, 32])
    """

    def __init__(self, dim: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 depth: int = 1) -> None:
        super().__init__()
        # The shape, kept so that a block seed can be made like this block (`like`).
        self.dim, self.n_head, self.dropout = dim, n_head, dropout
        self.bias, self.depth = bias, depth
        self.ln_1 = nn.LayerNorm(dim, bias=bias)
        self.attn = BlockAttention(dim, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(dim, bias=bias)
        self.mlp = BlockMLP(dim, dropout, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))  # [B, T, D]

    @classmethod
    def like(cls, other: Block) -> Block:
        """A block of ``other``'s shape, freshly initialised as the host initialises its own."""
        block = cls(other.dim, other.n_head, other.dropout, other.bias, other.depth)
        block.apply(init_gpt_weights)
        init_residual_projections(block, block.depth)
        return block


def init_gpt_weights(module: nn.Module) -> None:
    """GPT-2's init of one module (use with ``Module.apply``): Linear and Embedding weights
    normal with std 0.02, biases zero; other modules keep theirs."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)


def init_residual_projections(module: nn.Module, depth: int) -> None:
    """Re-draw every residual output projection (``*c_proj.weight``) in ``module`` with std
    ``0.02 / sqrt(2 * depth)``: two residual branches per block, ``depth`` blocks."""
    for name, p in module.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, mean=0.0, std=INIT_STD / math.sqrt(2 * depth))


def init_block(block: nn.Module, depth: int) -> None:
    """GPT-2's init of one block of a network ``depth`` blocks deep (`init_gpt_weights`, then
    the residual projections scaled for ``depth``): how `GPTHost` initialises a block, and
    what its ``random`` growth operator draws a new block from."""
    block.apply(init_gpt_weights)
    init_residual_projections(block, depth)
