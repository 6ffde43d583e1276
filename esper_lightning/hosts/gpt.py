"""`GPTHost`: a small byte-level GPT with a seed slot after every block, as a `LightningModule`.

The network follows nanoGPT: token and learned position embeddings, pre-norm blocks
(LayerNorm -> causal self-attention, LayerNorm -> 4x GELU MLP, both residual), a final LayerNorm
and an output head that shares its weight with the token embedding. Slots sit on the residual
stream ``[B, T, D]`` between blocks, so every transformer blueprint fits every slot.

Slot naming: ``r0c{i}`` is the slot right after block ``i`` (row 0 = "after a block", column =
block index), mirroring the CNN host, whose row 0 also follows each block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts.base import SlottedHost
from esper_lightning.hosts.presets import GPT_PRESETS as PRESETS
from esper_lightning.hosts.presets import GPTConfig, gpt_slot_ids

__all__ = ["PRESETS", "GPTConfig", "GPTHost", "gpt_slot_ids"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` attends to positions ``<= t`` only."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        dim = x.shape[-1]
        q, k, v = self.c_attn(x).split(dim, dim=-1)  # 3 x [B, T, D]
        # [B, T, D] -> [B, H, T, D / H]
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).flatten(2)  # [B, T, D]
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(D, 4D) -> GELU -> Linear(4D, D)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.c_proj(self.act(self.c_fc(x))))  # [B, T, D]


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(LN x)`` then ``x + mlp(LN x)``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))  # [B, T, D]


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
        preset: A name in :data:`PRESETS` (``"tiny"``, ``"small"``, ``"medium"``) or a
            :class:`GPTConfig`.
        slots: Which slot ids (``r0c{i}``: after block i) to create; all by default.
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
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self._build_slots(gpt_slot_ids(cfg.n_layer), slots, name,
                          lambda sid: SeedSlot(sid, channels=cfg.n_embd, topology="transformer"))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init_weights)
        # Residual projections scaled so the stream's variance does not grow with depth.
        for pname, p in self.named_parameters():
            if pname.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self._val_sums: Tensor | None = None
        # Token accuracy over flattened tokens: exact per-token means over the whole split.
        self.val_accuracy = MulticlassAccuracy(cfg.vocab_size, average="micro")
        self.test_accuracy = MulticlassAccuracy(cfg.vocab_size, average="micro")

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

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
        return self.head(self.ln_f(x))  # [B, T, V]

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
