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
        n_layer: Number of transformer blocks (and of slots).
        n_head: Attention heads per block; must divide ``n_embd``.
        n_embd: Width ``D`` of the residual stream (the slot width).
        dropout: Dropout on embeddings, attention weights and residual branches.
        bias: Biases in the Linear and LayerNorm layers, as in GPT-2.
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be an int >= 1, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_head={self.n_head} must divide n_embd={self.n_embd}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Every slot id of this host, in action order (`gpt_slot_ids`)."""
        return gpt_slot_ids(self.n_layer)


GPT_PRESETS: dict[str, GPTConfig] = {
    # CPU-sized: trains in minutes on 2 cores at block 64-128.
    "tiny": GPTConfig(block_size=128, n_layer=2, n_head=4, n_embd=64),  # 124,672 params
    "small": GPTConfig(block_size=256, n_layer=4, n_head=4, n_embd=256),  # 3,290,624 params
    # TinyStories-sized (6 x 384); wants a GPU.
    "medium": GPTConfig(block_size=512, n_layer=6, n_head=6, n_embd=384),  # 10,942,464 params
    # The growth-at-equal-compute task (preset lm-grow): width 32, 4 heads, 32-byte blocks; one
    # block (S1, 0.138 GFLOP per batch of 32) and the four-block host born big (S4, 0.403).
    "w32l1": GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=32),  # 21,984 params
    "w32l4": GPTConfig(block_size=32, n_layer=4, n_head=4, n_embd=32),  # 60,096 params
}


def gpt_slot_ids(n_layer: int) -> tuple[str, ...]:
    """Slot ids in action order: ``r0c{i}`` after block ``i``."""
    return tuple(f"r0c{i}" for i in range(n_layer))
