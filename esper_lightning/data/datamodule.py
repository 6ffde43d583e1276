"""CIFAR-10 as a ``LightningDataModule`` with epoch-seeded, worker-independent randomness."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from esper_lightning.data.cifar10 import (
    cifar10_present,
    download_cifar10,
    load_cifar10_subset,
)
from esper_lightning.data.files import check_bool, check_int, require_setup, resolve_data_dir
from esper_lightning.data.sampling import EpochSeededSampler, ResumableLoader
from esper_lightning.data.tensor_loader import (
    PAD,
    crop_flip,
    normalize,
    random_crop_flip_params,
)

__all__ = ["CIFAR10DataModule"]


class _Key(NamedTuple):
    """One training sample to fetch and how to augment it (offsets into the padded image)."""

    index: int
    dy: int = PAD
    dx: int = PAD
    flip: bool = False


class EpochSampler(EpochSeededSampler[_Key]):
    """Yield every index once per epoch, with its crop/flip drawn from ``rng_seed + epoch``.

    All randomness is drawn here, in the main process, from a fresh ``torch.Generator`` seeded
    with ``rng_seed + epoch``. Workers only apply the parameters they receive, so the batches are a
    function of ``(rng_seed, epoch)`` alone, whatever ``num_workers`` is. Lightning calls
    :meth:`set_epoch` at the start of every training epoch (see :class:`EpochSeededSampler`).

    Args:
        num_samples: Size of the dataset.
        rng_seed: Base seed.
        shuffle: Permute the order each epoch.
        augment: Draw random crop offsets and flips; otherwise the identity is passed on.

    Example:
        >>> sampler = EpochSampler(50_000, rng_seed=0)
        >>> sampler.set_epoch(3)
        >>> first = next(iter(sampler))  # _Key(index=..., dy=..., dx=..., flip=...)
    """

    def __init__(self, num_samples: int, rng_seed: int, shuffle: bool = True, augment: bool = True):
        super().__init__(num_samples, rng_seed)
        self.shuffle = shuffle
        self.augment = augment

    def epoch_rng_seed(self) -> int:
        # Added, not mixed (unlike the text sampler): runs already recorded must replay exactly.
        return self.rng_seed + self.epoch

    def __iter__(self) -> Iterator[_Key]:
        generator = self.generator()
        n = len(self)
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        if not self.augment:
            return iter([_Key(i) for i in order.tolist()])
        dy, dx, flip = random_crop_flip_params(n, generator)
        # Parameters follow the sample (drawn in sample order, looked up by index) so they do
        # not depend on where the sample lands in the permutation.
        columns = (order, dy[order], dx[order], flip[order])
        return iter([_Key(*row) for row in zip(*(c.tolist() for c in columns), strict=True)])


class _KeyedImages(Dataset[tuple[torch.Tensor, int, _Key]]):
    """uint8 images addressed by :class:`_Key` (or plain int); augmentation happens in collate."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key: int | _Key) -> tuple[torch.Tensor, int, _Key]:
        key = key if isinstance(key, _Key) else _Key(int(key))
        return self.images[key.index], int(self.labels[key.index]), key


class _Collate:
    """Stack samples, apply their crop/flip as one batched gather, then normalise.

    A module-level class (not a closure) so it pickles into worker processes.
    """

    def __init__(self, augment: bool) -> None:
        self.augment = augment

    def __call__(
        self, samples: Sequence[tuple[torch.Tensor, int, _Key]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([s[0] for s in samples])
        labels = torch.tensor([s[1] for s in samples], dtype=torch.int64)
        if self.augment:
            dy = torch.tensor([s[2].dy for s in samples])
            dx = torch.tensor([s[2].dx for s in samples])
            flip = torch.tensor([s[2].flip for s in samples])
            images = crop_flip(images, dy, dx, flip)
        return normalize(images), labels


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 from the standard ``cifar-10-batches-py`` files, held in memory as uint8.

    Training batches are randomly cropped (4-pixel zero padding) and horizontally flipped, then
    normalised with :data:`CIFAR10_MEAN` / :data:`CIFAR10_STD`. The official test batch is cut
    in two halves (`cifar10.held_out_half`): validation reads the first, test the second, both
    normalised only, in file order.

    Reproducibility: the training order *and* every crop/flip are drawn from a
    ``torch.Generator`` seeded with ``rng_seed + epoch`` by the loader's sampler, whose
    ``set_epoch`` Lightning calls at the start of each training epoch (under DDP too: Lightning's
    ``DistributedSamplerWrapper`` forwards it). Batches are therefore a function of
    ``(rng_seed, epoch)`` only, for any ``num_workers``, and a resumed run replays the same epochs.
    Outside a Trainer, call ``loader.sampler.set_epoch(epoch)`` before each pass.

    Args:
        data_dir: Folder containing ``cifar-10-batches-py/`` (or that folder itself); ``None``
            means :func:`default_data_dir` (``$ESPER_DATA_DIR`` or
            ``~/.cache/esper_lightning/data``).
        download: Let :meth:`prepare_data` download CIFAR-10 when it is missing.
        batch_size: Samples per batch for every loader.
        subset: Keep this many training images (the first ones after a shuffle seeded with
            ``rng_seed``); ``None`` keeps all.
        val_subset: Same for the validation half (the test half is used whole).
        num_workers: DataLoader worker processes (0 loads in the main process).
        rng_seed: Base seed of the subset selection, order and augmentation.
        augment: Random crop and flip for training batches.
        pin_memory: Pin host memory of batches for faster transfer to a GPU.

    Example:
        >>> import tempfile
        >>> from esper_lightning.data import write_cifar10_fixture
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = write_cifar10_fixture(tmp, n_train=64, n_test=32)  # or download=True
        ...     dm = CIFAR10DataModule(root, batch_size=16, subset=48)
        ...     dm.setup("fit")
        ...     x, y = next(iter(dm.train_dataloader()))
        ...     x.shape, y.shape, len(dm.train_dataloader()), len(dm.val_dataloader())
        (torch.Size([16, 3, 32, 32]), torch.Size([16]), 3, 1)

        A Trainer calls ``prepare_data`` and ``setup`` itself:
        ``L.Trainer(max_epochs=10).fit(model, datamodule=dm)``.
    """

    num_classes: int = 10

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        download: bool = False,
        batch_size: int = 128,
        subset: int | None = None,
        val_subset: int | None = None,
        num_workers: int = 0,
        rng_seed: int = 0,
        augment: bool = True,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        check_int("batch_size", batch_size, 1)
        check_int("subset", subset, 1, allow_none=True)
        check_int("val_subset", val_subset, 1, allow_none=True)
        check_int("num_workers", num_workers, 0)
        check_int("rng_seed", rng_seed, 0)
        flags = {"download": download, "augment": augment, "pin_memory": pin_memory}
        for name, flag in flags.items():
            check_bool(name, flag)
        if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
            raise ValueError(f"data_dir must be a path or None, got {data_dir!r}")
        self.data_dir = resolve_data_dir(data_dir)
        self.download = download
        self.batch_size = batch_size
        self.subset = subset
        self.val_subset = val_subset
        self.num_workers = num_workers
        self.rng_seed = rng_seed
        self.augment = augment
        self.pin_memory = pin_memory
        self.train_set: _KeyedImages | None = None
        self.val_set: _KeyedImages | None = None
        self.test_set: _KeyedImages | None = None

    def prepare_data(self) -> None:
        """Download CIFAR-10 if ``download=True`` and it is not already in ``data_dir``."""
        if self.download and not cifar10_present(self.data_dir):
            download_cifar10(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        """Load the splits the stage needs (once; later calls reuse them).

        Raises:
            DataError: The data is missing or corrupt.
            ValueError: ``subset`` or ``val_subset`` exceeds the split size.
        """
        if stage in (None, "fit") and self.train_set is None:
            self.train_set = self._load("train", subset=self.subset)
        if self.val_set is None:
            self.val_set = self._load("validation", subset=self.val_subset)
        if stage in (None, "test") and self.test_set is None:
            self.test_set = self._load("test", subset=None)

    def _load(self, part: str, subset: int | None) -> _KeyedImages:
        images, labels = load_cifar10_subset(self.data_dir, part, subset, self.rng_seed)
        return _KeyedImages(images.contiguous(), labels)

    def _loader(self, dataset: _KeyedImages, sampler: Sampler[Any], augment: bool) -> DataLoader:
        # An epoch-seeded sampler's loader resumes mid-epoch exactly (`ResumableLoader`).
        loader = ResumableLoader if isinstance(sampler, EpochSeededSampler) else DataLoader
        return loader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=_Collate(augment),
            pin_memory=self.pin_memory,
            # Safe to keep workers alive: they hold no randomness, the sampler feeds it per epoch.
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        """Shuffled, augmented, normalised training batches; see the class docs on seeding."""
        dataset = require_setup(self.train_set, "train_dataloader")
        sampler = EpochSampler(len(dataset), self.rng_seed, shuffle=True, augment=self.augment)
        return self._loader(dataset, sampler, self.augment)

    def val_dataloader(self) -> DataLoader:
        """The validation half of the official test batch, normalised, in file order."""
        dataset = require_setup(self.val_set, "val_dataloader")
        return self._loader(dataset, SequentialSampler(dataset), augment=False)

    def test_dataloader(self) -> DataLoader:
        """The test half of the official test batch, normalised, in file order (final tables
        only; ``setup("test")`` loads it)."""
        dataset = require_setup(self.test_set, "test_dataloader")
        return self._loader(dataset, SequentialSampler(dataset), augment=False)

    def state_dict(self) -> dict[str, Any]:
        """The settings that decide which samples are seen in which order."""
        return {"rng_seed": self.rng_seed, "subset": self.subset, "val_subset": self.val_subset}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Warn when resuming with settings that change the data stream of the checkpoint.

        Lightning restores datamodule state after ``setup``, so the checkpoint's values cannot
        be applied any more; a mismatch means the resumed run is not an exact continuation.
        """
        current = self.state_dict()
        changed = {k: v for k, v in state_dict.items() if k in current and current[k] != v}
        if changed:
            now = ", ".join(f"{k}={current[k]!r}" for k in changed)
            saved = ", ".join(f"{k}={v!r}" for k, v in changed.items())
            rank_zero_warn(
                f"CIFAR10DataModule resumed with {now} but the checkpoint used {saved}; the data "
                "stream differs from the original run. Pass the checkpoint's values to resume "
                "exactly."
            )
