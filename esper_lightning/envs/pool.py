"""`EnvPool`: many `MorphogenesisEnv`s driven in lockstep from one thread.

The inverted loop: for each batch index, every env takes its optimizer step (each inside its own
CUDA stream, so the GPU overlaps them), instead of one env finishing its epoch before the next
starts. Streams are synchronised once per env per epoch, in `observe`. Under a compute budget
an epoch is a slice of FLOPs (`MorphogenesisEnv`): an env whose slice is spent waits while the
others finish theirs (a host that grew takes fewer, dearer batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

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
        train, val: the task's training and validation data (`Task.load` of
            ``spec.task``; each env copies them to its device once).
        devices: one device per env (``["cpu", "cpu"]``, ``["cuda:0", "cuda:1"]``, ...).

    Example:
        >>> pool = EnvPool(EnvSpec(), train, val, ["cpu", "cpu"])  # doctest: +SKIP
        >>> observations = pool.reset([1, 2])  # doctest: +SKIP
        >>> observations = pool.step([Action(), Action()])  # doctest: +SKIP
    """

    def __init__(
        self,
        spec: EnvSpec,
        train: Any,
        val: Any,
        devices: Sequence[str],
    ) -> None:
        if not devices:
            raise ValueError("an env pool needs at least one device")
        self.spec = spec
        self.envs = [MorphogenesisEnv(i, spec, train, val, d) for i, d in enumerate(devices)]

    def __len__(self) -> int:
        return len(self.envs)

    def reset(
        self,
        episode_rng_seeds: Sequence[int],
        which: Sequence[int] | None = None,
        implants: Sequence[Sequence[tuple[str, str]]] | None = None,
        host_lrs: Sequence[float | None] | None = None,
    ) -> list[Observation]:
        """Fresh hosts for the envs in ``which`` (all by default), each trained for its first
        epoch before the first observation — the first decision comes after one epoch, as in a
        Trainer. ``implants[k]``: born-grown seeds of the k-th env; ``host_lrs[k]``: its
        learning rate, None for the spec's (`MorphogenesisEnv.reset`)."""
        indices = list(range(len(self.envs)) if which is None else which)
        implants = [()] * len(indices) if implants is None else implants
        host_lrs = [None] * len(indices) if host_lrs is None else host_lrs
        for i, rng_seed, grown, lr in zip(indices, episode_rng_seeds, implants, host_lrs,
                                          strict=True):
            self.envs[i].reset(rng_seed, grown, lr)
        envs = [self.envs[i] for i in indices]
        self.train_epoch(envs)
        for env in envs:
            env.validate()
        return [env.observe() for env in envs]

    def step(
        self, actions: Sequence[Action], which: Sequence[int] | None = None
    ) -> tuple[list[StepOutcome], list[Observation]]:
        """Execute one action per env of ``which`` (all by default), train those envs for one
        epoch in lockstep, validate them."""
        envs = self.envs if which is None else [self.envs[i] for i in which]
        outcomes = [env.execute(a) for env, a in zip(envs, actions, strict=True)]
        self.train_epoch(envs)
        for env in envs:
            env.validate()
        return outcomes, [env.observe() for env in envs]

    def train_epoch(self, envs: Sequence[MorphogenesisEnv] | None = None) -> None:
        """One training epoch of ``envs`` (all by default): for each batch index, each env
        whose epoch is still open (`MorphogenesisEnv.epoch_open`)."""
        training = list(self.envs if envs is None else envs)
        for env in training:
            env.start_epoch()
        while training:
            training = [env for env in training if env.epoch_open()]
            for env in training:
                env.train_batch()


__all__ = ["EnvPool", "EnvSpec", "MorphogenesisEnv", "episode_rng_seed"]
