"""Epoch-seeded samplers: the shared base and the mixed seeding rule."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from esper_lightning.data.sampling import EpochSeededSampler, mixed_rng_seed


class _Added(EpochSeededSampler[int]):
    def epoch_rng_seed(self) -> int:
        return self.rng_seed + self.epoch

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(len(self), generator=self.generator()).tolist())


def test_mixed_rng_seed_is_seed_sequence_and_not_a_sum() -> None:
    expected = int(np.random.SeedSequence([3, 5]).generate_state(1)[0])
    assert mixed_rng_seed(3, 5) == expected
    assert 0 <= expected < 2**32
    pairs = [(r, e) for r in range(4) for e in range(4)]
    assert len({mixed_rng_seed(r, e) for r, e in pairs}) == len(pairs)  # no (r+1, e) == (r, e+1)


def test_base_holds_epoch_length_and_seeds_per_epoch() -> None:
    sampler = _Added(12, rng_seed=4)
    assert len(sampler) == 12 and sampler.epoch == 0
    first = list(sampler)
    assert sorted(first) == list(range(12))
    assert list(sampler) == first  # no hidden state between passes
    sampler.set_epoch(1)
    assert sampler.epoch == 1 and list(sampler) != first
    assert list(sampler) == list(_Added(12, rng_seed=5))  # the subclass's rule: added
    reference = torch.randperm(12, generator=torch.Generator().manual_seed(5)).tolist()
    assert list(sampler) == reference


def test_a_sampler_without_a_rule_fails_loudly() -> None:
    class _NoRule(EpochSeededSampler[int]):
        def __iter__(self) -> Iterator[int]:
            return iter([self.generator().initial_seed()])

    with pytest.raises(NotImplementedError, match="_NoRule must define epoch_rng_seed"):
        list(_NoRule(1, rng_seed=0))
