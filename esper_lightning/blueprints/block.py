"""The pre-norm transformer block, shared by `GPTHost` and the ``block_*`` seeds that deepen it.

`Block` is nanoGPT's: ``x + attn(LN x)`` then ``x + mlp(LN x)`` with causal multi-head
self-attention and a 4x GELU MLP. `GPTHost` stacks them; a *block seed* is one or more of them,
grown in a slot on the residual stream, so a host with its block seeds blended in at alpha 1
computes exactly what a deeper host with the same weights computes (the ADD blend outputs
``h + 1·(s − h) = s``). A block seed carries no LayerScale: its own residual branches carry its
function, and its birth is made safe by its init and the alpha ramp instead.

How many blocks one seed stacks is its slot's (the slot's ``growth_depth`` context;
`GPTConfig.growth_depth` for a GPT host's growth slots, 1 elsewhere): one block is a `Block`,
several are a `BlockStack` (an ``nn.Sequential`` of blocks, all built by the same init), so a
host grows to full depth in one germination, as stacking methods grow (one expansion to full
depth rather than several).

The init of a block seed is part of its blueprint name, one name per init, so a policy chooses
the init with the blueprint head, a comparison names its arms by blueprint, and a slot's
manifest says which init grew there. Each block of the seed is, by init:

* ``block_copy``: a copy of the block the slot follows (stacking by copying, as G_stack). Several
  copies of one trained block change the host's function at birth far more than one does (a
  pilot's trained 1-block host: validation loss 2.00 before, 3.6 to 4.1 with three copies at
  alpha 1), which is why it blends over an epoch rather than at once;
* ``block_identity``: the same copy with the attention and MLP output projections at zero, so
  each block returns its input exactly and the host's function is unchanged at birth, whatever
  alpha does; on the first step only the zeroed output projections get gradient (everything
  before them in the branch is multiplied by zero), and the rest follows once they move;
* ``block_random``: a fresh block initialised as the host initialises its own.

Every init takes its shape (heads, bias, dropout, the depth the residual projections are scaled
for) from the block the slot follows, which the slot supplies as the ``preceding`` context: a
slot that follows no block refuses them in one line. A new block joins the optimizer with fresh
moments (AdamW state starts at zero, as for every seed): the seed is built a decision before it
first trains, so its source's moments would be stale by then.

Block seeds need no incubation (`BlueprintSpec.incubation` 0): their germination passes G0, G1
and G2 at once and they enter BLENDING in the same decision (`SeedSlot.germinate`), which makes
growth one decision. ``block_identity`` changes nothing at birth, so it blends at once
(`BlueprintSpec.blend_tempo` 0: alpha 1 from the next training step on); ``block_copy`` and
``block_random`` do change the function and blend over one epoch (tempo 2: alpha ramps once
per decision, so the epoch after germination trains at alpha 1/2 and the next at 1). They are
built for growth measured in compute: waiting ten epochs in isolation and ramping over five
costs a growing run the compute it is trying to save.

Params per block: ``12D^2 + 13D`` with biases (two LayerNorms 4D, qkv 3D^2 + 3D, attention
projection D^2 + D, MLP 4D^2 + 4D and 4D^2 + D); a seed of ``n`` blocks has ``n`` times that.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper_lightning.blueprints.registry import BlueprintSpec, register
from esper_lightning.blueprints.transformer import default_num_heads

__all__ = [
    "BLOCK_INITS",
    "BLOCK_TEMPOS",
    "Block",
    "BlockAttention",
    "BlockMLP",
    "BlockStack",
    "block_blueprint",
    "block_seed",
    "init_gpt_weights",
    "init_residual_projections",
    "last_block",
]

#: Init of a block seed -> its blueprint name.
BLOCK_INITS: dict[str, str] = {
    "copy": "block_copy",
    "identity": "block_identity",
    "random": "block_random",
}
#: Init of a block seed -> its blend tempo (`BlueprintSpec.blend_tempo`): alpha ticks once per
#: decision, so 0 is alpha 1 at once and 2 is one epoch at alpha 1/2, then 1.
BLOCK_TEMPOS: dict[str, int] = {"copy": 2, "identity": 0, "random": 2}
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


class BlockStack(nn.Sequential):
    """Several blocks applied in order: a block seed that stacks more than one block.

    Example:
        >>> stack = BlockStack(Block.like(Block(32, 4)), Block.like(Block(32, 4)))
        >>> stack(torch.zeros(2, 8, 32)).shape, isinstance(last_block(stack), Block)
        (torch.Size([2, 8, 32]), True)
    """


def last_block(module: nn.Module | None) -> Block | None:
    """The block whose output ``module`` returns: ``module`` itself if it is a `Block`, the last
    block of a `BlockStack`, else None (what a block seed after it builds on)."""
    if isinstance(module, BlockStack) and len(module) and isinstance(module[-1], Block):
        return module[-1]
    return module if isinstance(module, Block) else None


def block_seed(dim: int, *, init: str, preceding: nn.Module | None = None,
               growth_depth: int = 1) -> Block | BlockStack:
    """Build a block seed of width ``dim`` by ``init`` (a key of `BLOCK_INITS`) from the block
    the slot follows: one `Block`, or a `BlockStack` of ``growth_depth`` blocks, each built
    from ``preceding`` by the same init. Without ``preceding`` (parameter counting,
    `param_count`) it builds one block of the default shape: `build` never calls it so at
    germination.

    Raises:
        TypeError: If ``preceding`` is not a `Block` (the slot's context is a programming
            matter).
        ValueError: For an unknown ``init`` or a ``growth_depth`` below 1.
    """
    if init not in BLOCK_INITS:
        raise ValueError(f"unknown block init {init!r}; accepted: {', '.join(BLOCK_INITS)}")
    if isinstance(growth_depth, bool) or not isinstance(growth_depth, int) or growth_depth < 1:
        raise ValueError(f"growth_depth must be an int >= 1, got {growth_depth!r}")
    if preceding is None:
        return Block.like(Block(dim, default_num_heads(dim)))
    if not isinstance(preceding, Block):
        raise TypeError(f"a block seed follows a Block, got {type(preceding).__name__}")
    blocks = [_one_block(preceding, init) for _ in range(growth_depth)]
    return blocks[0] if growth_depth == 1 else BlockStack(*blocks)


def _one_block(preceding: Block, init: str) -> Block:
    block = Block.like(preceding)
    if init == "random":
        return block
    block.load_state_dict(preceding.state_dict())
    if init == "identity":
        with torch.no_grad():
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                if proj.bias is not None:
                    proj.bias.zero_()
    return block


def block_blueprint(init: str) -> str:
    """The blueprint name of a block seed with ``init`` (``copy``, ``identity``, ``random``).

    Raises:
        ValueError: For an unknown ``init`` (one line, listing the accepted ones).
    """
    if init not in BLOCK_INITS:
        raise ValueError(f"unknown block init {init!r}; accepted: {', '.join(BLOCK_INITS)}")
    return BLOCK_INITS[init]


_DESCRIPTIONS = {
    "copy": "copies of the preceding block; 12D^2+13D per block",
    "identity": "the preceding block with zero output projections (identity at birth); "
                "12D^2+13D per block",
    "random": "fresh blocks, the host's init; 12D^2+13D per block",
}

for _init, _name in BLOCK_INITS.items():
    register(BlueprintSpec(_name, "transformer", partial(block_seed, init=_init),
                           _DESCRIPTIONS[_init], context=("preceding", "growth_depth"),
                           incubation=0, blend_tempo=BLOCK_TEMPOS[_init]))
