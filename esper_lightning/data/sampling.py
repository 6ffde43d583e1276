"""Samplers whose every epoch is a function of ``(rng_seed, epoch)`` alone.

The randomness of a training epoch is drawn in the main process from a fresh ``torch.Generator``
seeded per epoch, so batches do not depend on ``num_workers``, on persistent workers or on how
much of the previous epoch was consumed. Each sampler states its own rule for turning
``(rng_seed, epoch)`` into the generator's seed.

Example:
    >>> class Shuffled(EpochSeededSampler[int]):
    ...     def epoch_rng_seed(self) -> int:
    ...         return self.rng_seed + self.epoch
    ...     def __iter__(self):
    ...         return iter(torch.randperm(len(self), generator=self.generator()).tolist())
    >>> sampler = Shuffled(10, rng_seed=0)
    >>> sampler.set_epoch(2)
    >>> sorted(sampler) == list(range(10))
    True
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["EpochSeededSampler", "mixed_rng_seed"]

_T = TypeVar("_T")


def mixed_rng_seed(rng_seed: int, epoch: int) -> int:
    """A 32-bit seed that mixes ``rng_seed`` and ``epoch`` (numpy's ``SeedSequence``).

    Mixed rather than added, so ``(rng_seed, epoch + 1)`` never replays ``(rng_seed + 1, epoch)``.

    Example:
        >>> mixed_rng_seed(0, 1) != mixed_rng_seed(1, 0)
        True
    """
    return int(np.random.SeedSequence([rng_seed, epoch]).generate_state(1)[0])


class EpochSeededSampler(Sampler[_T]):
    """Base of the epoch-seeded samplers: holds ``rng_seed``, ``epoch`` and the epoch's length.

    Lightning calls :meth:`set_epoch` at the start of every training epoch (as for a
    ``DistributedSampler``); outside Lightning, call it yourself or every pass repeats epoch 0.
    A subclass defines :meth:`epoch_rng_seed` (its seeding rule) and ``__iter__``, which draws from
    :meth:`generator`.

    Args:
        length: Items yielded per epoch.
        rng_seed: Base seed.

    Example:
        See the module docs.
    """

    def __init__(self, length: int, rng_seed: int) -> None:
        self.length = length
        self.rng_seed = rng_seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose draw the next ``iter()`` produces."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def epoch_rng_seed(self) -> int:
        """The generator seed of the current epoch; each subclass states its rule."""
        raise NotImplementedError(f"{type(self).__name__} must define epoch_rng_seed()")

    def generator(self) -> torch.Generator:
        """A fresh CPU generator seeded with :meth:`epoch_rng_seed`."""
        return torch.Generator().manual_seed(self.epoch_rng_seed())
