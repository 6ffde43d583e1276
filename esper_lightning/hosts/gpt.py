"""`GPTHost`: a small byte-level GPT with a seed slot after every block, as a `LightningModule`.

The network follows nanoGPT: token and learned position embeddings, pre-norm blocks
(`blueprints.block.Block`: LayerNorm -> causal self-attention, LayerNorm -> 4x GELU MLP, both
residual), a final LayerNorm and an output head that shares its weight with the token embedding.
Slots sit on the residual stream ``[B, T, D]`` between blocks, so every transformer blueprint
fits every slot.

Slot naming: ``r0c{i}`` is the slot right after block ``i`` (row 0 = "after a block", column =
block index), mirroring the CNN host, whose row 0 also follows each block. A host with growth
slots (`GPTConfig.growth_slots`) has ``r1c0, r1c1, ...`` in sequence after the last block's
slot: growth slots (`blueprints.growth`), where a growth seed (``block_copy``, ...) adds
`GPTConfig.growth_depth` new blocks on top (``grow4``: 1 block and one growth slot ``r1c0``
whose seed is 3 blocks, so it grows to 4 in one step; ``grow4x1``: the same growth in three
slots of one block; ``grow2``: 1 block growing to 2).

New blocks are made from the blocks before the slot in the forward, those grown in an earlier
growth slot included, so growth chains: on ``grow4x1`` a ``block_copy`` in ``r1c1`` copies the
block grown in ``r1c0`` when there is one, else block 0. ``block_random`` initialises a new
block as the host initialises its own (GPT-2's init, residual projections scaled for the
grown depth).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from esper_lightning.blueprints.block import (
    Block,
    init_block,
    init_gpt_weights,
    init_residual_projections,
)
from esper_lightning.blueprints.growth import GrowthSite
from esper_lightning.core.depth import present_blocks
from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts.base import SlottedHost
from esper_lightning.hosts.presets import GPT_PRESETS as PRESETS
from esper_lightning.hosts.presets import GPTConfig, gpt_slot_ids

__all__ = ["PRESETS", "GPTConfig", "GPTHost", "gpt_slot_ids"]


def _resolve_config(preset: str | GPTConfig) -> tuple[str, GPTConfig]:
    if isinstance(preset, GPTConfig):
        return "custom", preset
    if preset not in PRESETS:
        raise ValueError(f"unknown GPT preset {preset!r}; accepted: {', '.join(PRESETS)}")
    return preset, PRESETS[preset]


class GPTHost(SlottedHost):
    """Byte-level GPT language model whose blocks are each followed by a seed slot.

    Forward maps token ids ``[B, T]`` (``T <= block_size``) to next-token logits
    ``[B, T, vocab_size]``. Batches are ``(x, y)`` with ``y`` the next tokens of ``x``; the loss
    is the cross-entropy over every token. Validation logs ``val_loss`` (mean per token),
    ``val_acc`` (next-token accuracy in [0, 1]) and ``val_ppl`` (``exp(val_loss)``), all
    token-weighted over the whole validation epoch.

    Args:
        preset: A name in :data:`PRESETS` (``"tiny"``, ``"small"``, ``"medium"``; ``"grow4"``,
            ``"grow4x1"``, ``"grow2"``, ``"w32l1"``, ``"w32l2"``, ``"w32l4"``) or a
            :class:`GPTConfig`.
        slots: Which slot ids (``r0c{i}``: after block i; ``r1c{k}``: growth slot k) to
            create; all by default.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay, applied to the weight matrices of the blocks only
            (not to biases, norms or embeddings).
        betas: AdamW betas.

    Example:
        >>> host = GPTHost("tiny", slots=["r0c1"])
        >>> host(torch.zeros(2, 16, dtype=torch.long)).shape
        torch.Size([2, 16, 256])
    """

    def __init__(
        self,
        preset: str | GPTConfig = "tiny",
        slots: Sequence[str] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
    ) -> None:
        super().__init__()
        name, cfg = _resolve_config(preset)
        self.save_hyperparameters()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias, depth=cfg.max_depth)
            for _ in range(cfg.n_layer)
        )
        # A growth slot's site and place: new blocks on top of the stack, chained in order.
        growth = {slot_id: {"growth": GrowthSite(blocks, partial(self.blocks_before, slot_id),
                                                 init=partial(init_block, depth=cfg.max_depth)),
                            "growth_place": {"stack": "blocks", "after": cfg.n_layer - 1,
                                             "order": order}}
                  for order, (slot_id, blocks) in enumerate(zip(
                      cfg.growth_slot_ids, cfg.growth_depths, strict=True), 1)}
        self._build_slots(cfg.slot_ids, slots, name, lambda sid: SeedSlot(
            sid, channels=cfg.n_embd, topology="transformer", **growth.get(sid, {})))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(init_gpt_weights)
        # Residual projections scaled so the stream's variance does not grow with depth (the
        # depth the host can grow to: a grown host is initialised like one born that deep).
        init_residual_projections(self, cfg.max_depth)
        self._val_sums: Tensor | None = None
        # Token accuracy over flattened tokens: exact per-token means over the whole split.
        self.val_accuracy = MulticlassAccuracy(cfg.vocab_size, average="micro")
        self.test_accuracy = MulticlassAccuracy(cfg.vocab_size, average="micro")

    def forward(self, idx: Tensor) -> Tensor:
        # idx: long [B, T] -> logits [B, T, vocab_size]
        if idx.dim() != 2:
            raise ValueError(f"GPTHost expects token ids [B, T], got shape {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(
                f"sequence length {t} exceeds block_size {self.config.block_size}; "
                f"use at most {self.config.block_size} tokens"
            )
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # [B, T, D]
        for i, block in enumerate(self.blocks):
            x = self._slot(f"r0c{i}", block(x))
        for k in range(self.config.growth_slots):
            x = self._slot(f"r1c{k}", x)
        return self.head(self.ln_f(x))  # [B, T, V]

    def blocks_before(self, slot_id: str) -> list[Block]:
        """The blocks before growth slot ``slot_id`` in the forward: the host's, then those the
        earlier growth slots grew (what a growth seed there is made from)."""
        blocks = list(self.blocks)
        growth = self.config.growth_slot_ids
        for earlier in (s for s in growth[:growth.index(slot_id)] if s in self.slots):
            blocks.extend(present_blocks(self.slots[earlier]))
        return blocks

    # --- steps --------------------------------------------------------------------------------
    def _token_loss(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Mean cross-entropy over all tokens, with the flattened logits and targets."""
        x, y = batch
        logits = self(x)  # [B, T, V]
        flat = logits.reshape(-1, logits.shape[-1])  # [B*T, V]
        targets = y.reshape(-1)  # [B*T]
        return F.cross_entropy(flat, targets), flat, targets

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss, _, _ = self._token_loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(2, device=self.device, dtype=torch.float64)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss, flat, targets = self._token_loss(batch)
        if self._val_sums is None:
            raise RuntimeError("validation_step outside a validation epoch")
        # Sums stay on the device (no host sync per batch); the ratio once per epoch, so the
        # loss is an exact per-token mean and the perplexity is exp of that mean.
        n = targets.numel()
        self._val_sums[0] += loss.detach().double() * n
        self._val_sums[1] += n
        self.val_accuracy.update(flat, targets)

    def on_validation_epoch_end(self) -> None:
        if self._val_sums is None:
            return
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")
        self._val_sums = None
        if float(sums[1]) == 0:
            return
        loss = (sums[0] / sums[1]).float()
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", self.val_accuracy.compute(), prog_bar=True)
        self.log("val_ppl", loss.exp())
        self.val_accuracy.reset()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss, flat, targets = self._token_loss(batch)
        self.log("test_loss", loss, batch_size=targets.numel())
        self.test_accuracy.update(flat, targets)
        self.log("test_acc", self.test_accuracy)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        no_decay = {id(self.tok_emb.weight), id(self.pos_emb.weight)}
        params = self.host_parameters()
        decay = [p for p in params if p.dim() >= 2 and id(p) not in no_decay]
        decay_ids = {id(p) for p in decay}
        rest = [p for p in params if id(p) not in decay_ids]
        # Seed groups mirror these two: matrices decayed, vectors exempt (core.optim).
        groups = [
            {"params": decay, "weight_decay": hp.weight_decay, "name": "host/decay"},
            {"params": rest, "weight_decay": 0.0, "name": "host/no_decay"},
        ]
        return torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas))

