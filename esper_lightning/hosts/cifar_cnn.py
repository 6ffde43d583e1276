"""`CifarCNNHost`: a small CIFAR-10 CNN with seed slots, as a `LightningModule`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from esper_lightning.core.slots import SeedSlot
from esper_lightning.hosts.base import SlottedHost
from esper_lightning.hosts.presets import PRESETS, slot_ids


class ConvBlock(nn.Module):
    """Conv (no bias) -> norm -> activation."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d,
        act_layer: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False
        )
        self.norm = norm_layer(out_channels)
        self.act = act_layer()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.conv(x)))


class CifarCNNHost(SlottedHost):
    """CIFAR-10 CNN whose blocks are followed by seed slots.

    Slot ``r0c{i}`` sits after block i (before its pool) and ``r1c{i}`` after pool i. Forward order
    interleaves them: block 0, r0c0, pool, r1c0, block 1, r0c1, ...

    Args:
        preset: ``"baseline"`` (channels 8/16/32), ``"impaired"`` (77 params) or ``"scale"``
            (5 blocks).
        slots: which slot ids to create; all by default. Slots not listed are absent.
        lr, momentum, weight_decay: host SGD settings.
        norm_layer, act_layer: block normalisation and activation.

    Example:
        >>> host = CifarCNNHost("baseline", slots=["r0c1"])
        >>> host(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        preset: str = "baseline",
        slots: Sequence[str] | None = None,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d,
        act_layer: Callable[[], nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__()
        if preset not in PRESETS:
            raise ValueError(f"unknown host preset {preset!r}; accepted: {', '.join(PRESETS)}")
        self.save_hyperparameters(ignore=["norm_layer", "act_layer"])
        self.config = cfg = PRESETS[preset]
        widths = [cfg.base_channels * 2**i for i in range(cfg.n_blocks)]
        self.blocks = nn.ModuleList(
            ConvBlock(c_in, c_out, cfg.kernel_size, norm_layer, act_layer)
            for c_in, c_out in zip([3, *widths[:-1]], widths, strict=True)
        )
        self.pool = nn.MaxPool2d(2)
        self._build_slots(slot_ids(cfg.n_blocks), slots, preset,
                          lambda sid: SeedSlot(sid, widths[int(sid[3:])]))
        self.head = nn.Linear(widths[-1], cfg.num_classes)
        # Exact epoch accuracies (correct / samples over the whole split), synced across
        # processes; their states are not part of the state_dict.
        self.val_accuracy = MulticlassAccuracy(cfg.num_classes, average="micro")
        self.test_accuracy = MulticlassAccuracy(cfg.num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, 3, H, W] -> logits [B, num_classes]
        for i, block in enumerate(self.blocks):
            x = self._slot(f"r0c{i}", block(x))
            x = self.pool(x)
            x = self._slot(f"r1c{i}", x)
        return self.head(x.mean(dim=(2, 3)))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        # The epoch mean (the controller reads it, as the env reports it), not the last step.
        self.log("train_loss", loss, prog_bar=True, on_step=False, on_epoch=True)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log("train_acc", acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.val_accuracy.update(logits, y)
        self.log("val_acc", self.val_accuracy, prog_bar=True)  # computed at epoch end

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("test_loss", F.cross_entropy(logits, y))
        self.test_accuracy.update(logits, y)
        self.log("test_acc", self.test_accuracy)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        return torch.optim.SGD(
            [{"params": self.host_parameters(), "name": "host"}],
            lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay,
        )
