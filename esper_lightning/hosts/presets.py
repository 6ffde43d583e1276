"""The hosts' shapes, presets and slot ids: plain data, importable without torch.

The command line checks ``--host_preset``, ``--slots`` and ``--block_size`` against these before
it imports torch; the host modules build their networks from them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPT_PRESETS", "PRESETS", "CifarCNNConfig", "GPTConfig", "gpt_slot_ids", "slot_ids"]


@dataclass(frozen=True)
class CifarCNNConfig:
    """Shape of the host. Block i has ``base_channels * 2**i`` channels."""

    base_channels: int = 8
    n_blocks: int = 3
    kernel_size: int = 3
    num_classes: int = 10

    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Every slot id of this host, in action order (`slot_ids`)."""
        return slot_ids(self.n_blocks)


PRESETS: dict[str, CifarCNNConfig] = {
    "baseline": CifarCNNConfig(base_channels=8, n_blocks=3, kernel_size=3),  # ~6.4K params
    "impaired": CifarCNNConfig(base_channels=1, n_blocks=3, kernel_size=1),  # 77 params
    "scale": CifarCNNConfig(base_channels=8, n_blocks=5, kernel_size=3),  # ~100K params
}


def slot_ids(n_blocks: int) -> tuple[str, ...]:
    """Slot ids in action order: ``r0c*`` (after each block) then ``r1c*`` (after each pool)."""
    return tuple(f"r0c{i}" for i in range(n_blocks)) + tuple(f"r1c{i}" for i in range(n_blocks))


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the host.

    Attributes:
        vocab_size: Number of token ids (256: one per byte).
        block_size: Longest sequence the position embedding covers.
        n_layer: Number of transformer blocks (each followed by a slot ``r0c{i}``).
        n_head: Attention heads per block; must divide ``n_embd``.
        n_embd: Width ``D`` of the residual stream (the slot width).
        dropout: Dropout on embeddings, attention weights and residual branches.
        bias: Biases in the Linear and LayerNorm layers, as in GPT-2.
        growth_slots: Slots ``r1c0 .. r1c{growth_slots-1}`` in sequence after the last
            block's slot, where block seeds (``block_copy``, ...) make the host deeper.
        growth_depth: Blocks one block seed in a growth slot stacks (a seed of several blocks
            is an ``nn.Sequential`` of them), the same in every growth slot, or one number per
            growth slot (``(1, 2)``: one block to two, then two to four): a host with
            ``n_layer`` blocks grows to `max_depth` ``= n_layer + sum(growth_depths)``. Its
            residual projections are initialised for that depth, as a host born that deep
            would be.
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True
    growth_slots: int = 0
    growth_depth: int | tuple[int, ...] = 1

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be an int >= 1, got {value!r}")
        value = self.growth_slots
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"GPTConfig.growth_slots must be an int >= 0, got {value!r}")
        depths = self.growth_depth if isinstance(self.growth_depth, tuple) else (
            self.growth_depth,)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in depths) or (
                isinstance(self.growth_depth, tuple) and len(depths) != self.growth_slots):
            raise ValueError(f"GPTConfig.growth_depth must be an int >= 1, or one per growth "
                             f"slot ({self.growth_slots}), got {self.growth_depth!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_head={self.n_head} must divide n_embd={self.n_embd}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Every slot id of this host, in action order (`gpt_slot_ids`)."""
        return gpt_slot_ids(self.n_layer, self.growth_slots)

    @property
    def growth_slot_ids(self) -> tuple[str, ...]:
        """The growth slots ``r1c*``, in action order (empty: a host that does not grow)."""
        return gpt_slot_ids(0, self.growth_slots)

    @property
    def growth_depths(self) -> tuple[int, ...]:
        """Blocks a seed adds in each growth slot, in action order."""
        if isinstance(self.growth_depth, tuple):
            return self.growth_depth
        return (self.growth_depth,) * self.growth_slots

    @property
    def max_depth(self) -> int:
        """Blocks of the host once every growth slot holds a block seed."""
        return self.n_layer + sum(self.growth_depths)


GPT_PRESETS: dict[str, GPTConfig] = {
    # CPU-sized: trains in minutes on 2 cores at block 64-128.
    "tiny": GPTConfig(block_size=128, n_layer=2, n_head=4, n_embd=64),  # 124,672 params
    "small": GPTConfig(block_size=256, n_layer=4, n_head=4, n_embd=256),  # 3,290,624 params
    # TinyStories-sized (6 x 384); wants a GPU.
    "medium": GPTConfig(block_size=512, n_layer=6, n_head=6, n_embd=384),  # 10,942,464 params
    # Growth that saves compute (docs/evidence.md): one block that grows to four in one step
    # (one growth slot r1c0 whose block seed is 3 blocks), the same growth block by block
    # (r1c0 r1c1 r1c2, one block each), one block that grows to two, and the static hosts they
    # are measured against, same width. Params: host as built / grown to full depth.
    "grow4": GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32, growth_slots=1,
                       growth_depth=3),  # 21,984 / 60,096
    "grow4x1": GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32,
                         growth_slots=3),  # 21,984 / 60,096
    "grow2": GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32,
                       growth_slots=1),  # 21,984 / 34,688
    # Two growth decisions: one block to two (r1c0, one block), then two to four (r1c1, two).
    "grow124": GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32, growth_slots=2,
                         growth_depth=(1, 2)),  # 21,984 / 60,096
    # The same growth at width 64 (8 heads of width 8, as at width 32): hosts a controller
    # tuned or trained at width 32 has never seen.
    "grow2-w64": GPTConfig(block_size=32, n_layer=1, n_head=8, n_embd=64,
                           growth_slots=1),  # 68,544 / 118,528
    "grow124-w64": GPTConfig(block_size=32, n_layer=1, n_head=8, n_embd=64, growth_slots=2,
                             growth_depth=(1, 2)),  # 68,544 / 218,496
    "w32l1": GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32),  # 21,984 params
    "w32l2": GPTConfig(block_size=32, n_layer=2, n_head=4, n_embd=32),  # 34,688 params
    "w32l4": GPTConfig(block_size=32, n_layer=4, n_head=4, n_embd=32),  # 60,096 params
}


def gpt_slot_ids(n_layer: int, growth_slots: int = 0) -> tuple[str, ...]:
    """Slot ids in action order: ``r0c{i}`` after block ``i``, then the growth slots
    ``r1c{k}`` (row 1: after the last block, in sequence).

    Example:
        >>> gpt_slot_ids(1, growth_slots=3)
        ('r0c0', 'r1c0', 'r1c1', 'r1c2')
    """
    return tuple(f"r0c{i}" for i in range(n_layer)) + tuple(f"r1c{k}" for k in range(growth_slots))
