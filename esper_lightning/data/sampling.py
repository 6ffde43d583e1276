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

from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

__all__ = ["EpochSeededSampler", "ResumableLoader", "mixed_rng_seed"]

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


class ResumableLoader(DataLoader):
    """A training `DataLoader` over an `EpochSeededSampler` that resumes mid-epoch exactly.

    Lightning saves a loader's ``state_dict()`` in its checkpoints and hands it back with
    ``load_state_dict`` before the resumed epoch starts (its ``_Stateful`` protocol); without
    it, a fit resumed from a mid-epoch checkpoint (``ModelCheckpoint(every_n_train_steps=...)``,
    a one-epoch language-model run) starts its epoch's batches over. Since every epoch's order
    is a function of ``(rng_seed, epoch)``, this loader only counts the batches it handed out
    and, resumed, skips that many of the same epoch before yielding again.

    Example:
        >>> class Ordered(EpochSeededSampler[int]):
        ...     def epoch_rng_seed(self) -> int:
        ...         return self.epoch
        ...     def __iter__(self):
        ...         return iter(torch.randperm(len(self), generator=self.generator()).tolist())
        >>> loader = ResumableLoader(list(range(8)), batch_size=2, sampler=Ordered(8, 0))
        >>> batches = iter(loader)
        >>> first = [next(batches).tolist() for _ in range(2)]
        >>> state = loader.state_dict()
        >>> again = ResumableLoader(list(range(8)), batch_size=2, sampler=Ordered(8, 0))
        >>> again.load_state_dict(state)
        >>> [b.tolist() for b in again] == [b.tolist() for b in batches]
        True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._yielded = 0  # batches handed out in the epoch now running
        self._skip = 0  # batches a resumed epoch skips

    def __iter__(self) -> Iterator[Any]:
        return self._batches()  # a generator: the sampler runs once its epoch is set

    def _batches(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        iterator = super().__iter__()
        for _ in range(skip):  # the same epoch's order: drawn again, handed out once
            next(iterator, None)
        self._yielded = skip
        for batch in iterator:
            self._yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """The batches of the running epoch handed out so far."""
        return {"batches": self._yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Skip ``state["batches"]`` batches of the next epoch this loader runs."""
        self._skip = int(state["batches"])
