"""`EnvPool`: many `MorphogenesisEnv`s driven in lockstep from one thread.

The inverted loop: for each batch index, every env takes its optimizer step (each inside its own
CUDA stream, so the GPU overlaps them), instead of one env finishing its epoch before the next
starts. Streams are synchronised once per env per epoch, in `observe`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from esper_lightning.core.actions import Action
from esper_lightning.core.engine import StepOutcome
from esper_lightning.envs.env import EnvSpec, MorphogenesisEnv, Observation


def episode_rng_seed(root: int, round_index: int, env_index: int, episode: int = 0) -> int:
    """Deterministic, well-mixed random-number seed of one episode from (root rng seed, round,
    env index, episode within the round)."""
    sequence = np.random.SeedSequence([root, round_index, env_index, episode])
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


class EnvPool:
    """Lockstep pool of environments.

    Args:
        spec: settings shared by every env.
        train, val: uint8 images and labels (each env copies them to its device once).
        devices: one device per env (``["cpu", "cpu"]``, ``["cuda:0", "cuda:1"]``, ...).

    Example:
        >>> pool = EnvPool(EnvSpec(), train, val, ["cpu", "cpu"])  # doctest: +SKIP
        >>> observations = pool.reset([1, 2])  # doctest: +SKIP
        >>> observations = pool.step([Action(), Action()])  # doctest: +SKIP
    """

    def __init__(
        self,
        spec: EnvSpec,
        train: tuple[Tensor, Tensor],
        val: tuple[Tensor, Tensor],
        devices: Sequence[str],
    ) -> None:
        if not devices:
            raise ValueError("an env pool needs at least one device")
        self.spec = spec
        self.envs = [MorphogenesisEnv(i, spec, train, val, d) for i, d in enumerate(devices)]

    def __len__(self) -> int:
        return len(self.envs)

    def reset(
        self, episode_rng_seeds: Sequence[int], which: Sequence[int] | None = None
    ) -> list[Observation]:
        """Fresh hosts for the envs in ``which`` (all by default), measured before training."""
        indices = range(len(self.envs)) if which is None else which
        for i, rng_seed in zip(indices, episode_rng_seeds, strict=True):
            self.envs[i].reset(rng_seed)
        for i in indices:
            self.envs[i].validate()
        return [self.envs[i].observe(trained=False) for i in indices]

    def step(self, actions: Sequence[Action]) -> tuple[list[StepOutcome], list[Observation]]:
        """Apply one action per env, train every env for one epoch in lockstep, validate."""
        outcomes = [env.execute(a) for env, a in zip(self.envs, actions, strict=True)]
        self.train_epoch()
        for env in self.envs:
            env.validate()
        return outcomes, [env.observe() for env in self.envs]

    def train_epoch(self) -> None:
        counts = [env.start_epoch() for env in self.envs]
        for batch in range(max(counts)):
            for env, count in zip(self.envs, counts, strict=True):
                if batch < count:
                    env.train_batch()


__all__ = ["EnvPool", "EnvSpec", "MorphogenesisEnv", "episode_rng_seed"]
