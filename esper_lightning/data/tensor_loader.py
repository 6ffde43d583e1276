"""A device-resident CIFAR loader: no workers, no per-sample Python, exact resume.

CIFAR-10 is 150 MB as uint8, so the whole split fits on any accelerator. Keeping it there and
doing the shuffle, crop, flip and normalisation as a handful of batched tensor ops removes the
host-to-device copy and the DataLoader machinery from the training step, which matters when many
small models train side by side (one loader per environment).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from esper_lightning.data.cifar10 import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    load_cifar10_subset,
)
from esper_lightning.data.files import check_int

__all__ = [
    "PAD",
    "TensorLoader",
    "channel_stats",
    "crop_flip",
    "normalize",
    "random_crop_flip_params",
]

PAD = 4
"""Zero padding, in pixels, of the random crop (the standard CIFAR recipe)."""


def channel_stats(device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10 mean and std as float32 ``[1, 3, 1, 1]`` tensors on ``device``."""
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
    return mean, std


def normalize(
    images: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """Map uint8 ``[B, 3, H, W]`` images to float32, scaled to [0, 1] then standardised per channel.

    A zero pixel becomes ``-mean / std``, which is how crop padding looks after normalisation.

    Args:
        images: uint8 images.
        stats: ``(mean, std)`` from :func:`channel_stats` on the images' device. Pass them in a
            loop: building them per call costs a host-to-device copy on accelerators.
    """
    mean, std = stats if stats is not None else channel_stats(images.device)
    return images.float().div_(255.0).sub_(mean).div_(std)


def random_crop_flip_params(
    n: int, generator: torch.Generator, pad: int = PAD
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw per-sample crop offsets in ``[0, 2 * pad]`` and flip flags on ``generator``'s device.

    Returns:
        ``(dy, dx, flip)``: int64 ``[n]``, int64 ``[n]`` and bool ``[n]``. An offset of ``pad``
        is the un-shifted image.
    """
    device = generator.device
    offsets = torch.randint(0, 2 * pad + 1, (2, n), generator=generator, device=device)
    flip = torch.rand(n, generator=generator, device=device) < 0.5
    return offsets[0], offsets[1], flip


def crop_flip(
    images: torch.Tensor,
    dy: torch.Tensor,
    dx: torch.Tensor,
    flip: torch.Tensor,
    pad: int = PAD,
) -> torch.Tensor:
    """Zero-pad by ``pad``, crop back to ``H x W`` at ``(dy, dx)`` and mirror where ``flip``.

    Crop and flip are a single gather, so the batch is touched once whatever its size.

    Args:
        images: ``[B, C, H, W]`` of any dtype (uint8 keeps the gather cheap).
        dy: Row offsets into the padded image, ``[B]`` in ``[0, 2 * pad]``.
        dx: Column offsets into the padded image, ``[B]`` in ``[0, 2 * pad]``.
        flip: Bool ``[B]``; ``True`` mirrors that sample left-right.
        pad: Padding on each side.

    Returns:
        A new ``[B, C, H, W]`` tensor of the same dtype.
    """
    b, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (pad, pad, pad, pad))
    rows = dy.to(device).view(b, 1) + torch.arange(h, device=device)
    cols = torch.arange(w, device=device).expand(b, w)
    # Flipping the crop reads the window right-to-left: column j comes from w - 1 - j.
    cols = torch.where(flip.to(device).view(b, 1), w - 1 - cols, cols) + dx.to(device).view(b, 1)
    batch = torch.arange(b, device=device).view(b, 1, 1, 1)
    channel = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[batch, channel, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]


class TensorLoader:
    """Iterate normalised (and optionally augmented) CIFAR batches held entirely on one device.

    The uint8 images are copied to ``device`` once. Each ``iter()`` is an epoch: the loader's own
    ``torch.Generator`` (on ``device``) draws a fresh permutation and all crop/flip parameters for
    the epoch up front, then batches are gathered, augmented and normalised on the fly as float32.
    Because the generator is touched only at the start of an epoch, :meth:`state_dict` captured at
    any point (even mid-epoch) resumes the exact same batch stream.

    Args:
        images_uint8: uint8 ``[N, 3, H, W]`` images.
        labels: Integer ``[N]`` class labels (stored as int64).
        batch_size: Samples per batch.
        device: Where the data, the generator and the batches live.
        shuffle: New random order every epoch; otherwise file order.
        augment: Random crop (zero padding 4) and horizontal flip.
        drop_last: Drop the final short batch.
        rng_seed: Seed of the loader's generator; different seeds give different orders.

    Example:
        >>> import tempfile
        >>> from esper_lightning.data import write_cifar10_fixture
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = write_cifar10_fixture(tmp, n_train=64, n_test=32)
        ...     loader = TensorLoader.from_cifar10(root, train=True, batch_size=16)  # or "cuda"
        >>> batches = iter(loader)
        >>> x, y = next(batches)
        >>> x.shape, x.dtype, y.dtype
        (torch.Size([16, 3, 32, 32]), torch.float32, torch.int64)
        >>> state = loader.state_dict()  # mid-epoch: one batch yielded
        >>> rest = [y for _, y in batches]
        >>> loader.load_state_dict(state)  # resumes the identical stream
        >>> [torch.equal(y, again) for (_, y), again in zip(loader, rest, strict=True)]
        [True, True, True]
    """

    def __init__(
        self,
        images_uint8: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        device: str | torch.device = "cpu",
        shuffle: bool = True,
        augment: bool = True,
        drop_last: bool = False,
        rng_seed: int = 0,
    ) -> None:
        _check_data(images_uint8, labels)
        check_int("batch_size", batch_size, 1)
        self.device = torch.device(device)
        self.images = images_uint8.to(self.device).contiguous()
        self.labels = labels.to(self.device, torch.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.augment = augment
        self.drop_last = drop_last
        self._stats = channel_stats(self.device)
        self.generator = torch.Generator(device=self.device)
        self.rng_seed = rng_seed
        self.generator.manual_seed(rng_seed)
        self.epoch = 0
        # Generator state at the start of the epoch in progress and batches it has yielded; set
        # only while an iteration is active (identified by `_active`).
        self._epoch_state: torch.Tensor | None = None
        self._position = 0
        self._active: object | None = None
        # (epoch-start generator state, batch to resume at), set by load_state_dict mid-epoch.
        self._resume: tuple[torch.Tensor, int] | None = None

    @classmethod
    def from_cifar10(
        cls,
        data_dir: str | os.PathLike[str] | None,
        train: bool,
        batch_size: int,
        device: str | torch.device = "cpu",
        subset: int | None = None,
        **kwargs: Any,
    ) -> TensorLoader:
        """Load a CIFAR-10 split with :func:`load_cifar10` and wrap it.

        ``subset`` keeps the first ``subset`` images after a shuffle seeded with ``rng_seed`` (from
        ``kwargs``, default 0). Remaining ``kwargs`` go to the constructor; evaluation loaders
        usually want ``shuffle=False, augment=False``.
        """
        images, labels = load_cifar10_subset(data_dir, train, subset, kwargs.get("rng_seed", 0))
        return cls(images, labels, batch_size, device=device, **kwargs)

    def __len__(self) -> int:
        """Number of batches per epoch."""
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        """Number of images held by the loader."""
        return len(self.labels)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield one epoch of ``(float32 images [B, 3, H, W], int64 labels [B])``.

        Starting a new iteration always starts a new epoch, except right after
        :meth:`load_state_dict` restored a mid-epoch state: then the restored epoch continues.
        """
        token = object()
        self._active = token
        if self._resume is None:
            self._epoch_state, start = self.generator.get_state(), 0
        else:
            (self._epoch_state, start), self._resume = self._resume, None
            self.generator.set_state(self._epoch_state)
        order, params = self._draw_epoch()
        self._position = start
        try:
            for index in range(start, len(self)):
                self._position = index + 1
                batch_idx = order[index * self.batch_size : (index + 1) * self.batch_size]
                yield self._batch(batch_idx, params)
        finally:
            # Also runs when a loop breaks early: an abandoned epoch still counts as consumed,
            # matching the generator, which already drew the whole epoch. The token stops a
            # stale iterator, closed late, from clobbering a newer epoch.
            if self._active is token:
                self._active, self._epoch_state, self._position = None, None, 0
                self.epoch += 1

    def _draw_epoch(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        n = self.num_samples
        if self.shuffle:
            order = torch.randperm(n, generator=self.generator, device=self.device)
        else:
            order = torch.arange(n, device=self.device)
        params = random_crop_flip_params(n, self.generator) if self.augment else None
        return order, params

    def _batch(
        self, idx: torch.Tensor, params: tuple[torch.Tensor, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        images = self.images[idx]
        if params is not None:
            # Parameters are indexed by sample, so a sample's augmentation ignores batch layout.
            dy, dx, flip = (p[idx] for p in params)
            images = crop_flip(images, dy, dx, flip)
        return normalize(images, self._stats), self.labels[idx]

    def reseed(self, rng_seed: int) -> None:
        """Restart the random stream from ``rng_seed``; the next ``iter()`` is a fresh epoch."""
        self.rng_seed = rng_seed
        self.generator.manual_seed(rng_seed)
        self._active, self._epoch_state, self._position, self._resume = None, None, 0, None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact batch stream, mid-epoch included.

        Mid-epoch, ``generator`` is the state from the start of the epoch and ``position`` the
        number of batches already yielded; the restored loader replays the epoch's draws and
        resumes at the next batch. Generator states are device-specific: restore onto a loader
        on the same device type.
        """
        if self._resume is not None:  # restored mid-epoch and not iterated yet
            generator_state, position = self._resume
            epoch = self.epoch
        elif self._epoch_state is not None and self._position < len(self):
            generator_state, epoch, position = self._epoch_state, self.epoch, self._position
        else:
            # After the last batch the epoch is over even if the loop has not yet seen
            # StopIteration: the draws are done, so the current state starts the next epoch.
            active = self._epoch_state is not None
            generator_state, epoch, position = (
                self.generator.get_state(),
                self.epoch + int(active),
                0,
            )
        return {
            "rng_seed": self.rng_seed,
            "epoch": epoch,
            "generator": generator_state.clone(),
            "position": position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the next ``iter()`` continues from there."""
        position = int(state.get("position", 0))
        if not 0 <= position <= len(self):
            raise ValueError(f"position {position} is outside 0..{len(self)} batches")
        generator_state = state["generator"].detach().cpu().clone()
        self.generator.set_state(generator_state)
        self.rng_seed, self.epoch = int(state["rng_seed"]), int(state["epoch"])
        self._active, self._epoch_state, self._position = None, None, 0
        self._resume = (generator_state, position) if position else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self.num_samples}, batch_size={self.batch_size}, "
            f"device={self.device}, shuffle={self.shuffle}, augment={self.augment}, "
            f"drop_last={self.drop_last}, rng_seed={self.rng_seed})"
        )


def _check_data(images: torch.Tensor, labels: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(
            f"images_uint8 must be a uint8 [N, 3, H, W] tensor, got {_describe(images)}"
        )
    if images.shape[1] != 3:
        raise ValueError(f"images_uint8 must have 3 channels, got shape {tuple(images.shape)}")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or len(labels) != len(images):
        raise ValueError(
            f"labels must be a 1-D tensor with one label per image ({len(images)}), got "
            f"{_describe(labels)}"
        )
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
