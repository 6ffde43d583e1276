"""`EnvPool`: many `MorphogenesisEnv`s driven in lockstep from one thread.

The inverted loop: for each batch index, every env takes its optimizer step, instead of one env
finishing its epoch before the next starts. On request each CUDA env steps on a stream of its own
(``cuda_streams=True``, synchronised once per env per epoch, in `observe`); off by default,
since the streams were measured slower on the hosts these envs train (`MorphogenesisEnv`).
Under a compute budget an epoch is a slice of FLOPs (`MorphogenesisEnv`): an env whose slice is
spent waits while the others finish theirs (a host that grew takes fewer, dearer batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from esper_lightning.core.actions import Action
from esper_lightning.envs.env import EnvSpec, MorphogenesisEnv, Observation, Step
from esper_lightning.rl.rewards import RewardConfig


def episode_rng_seed(root: int, round_index: int, env_index: int, episode: int = 0) -> int:
    """Deterministic, well-mixed random-number seed of one episode from (root rng seed, round,
    env index, episode within the round)."""
    sequence = np.random.SeedSequence([root, round_index, env_index, episode])
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


class EnvPool:
    """Lockstep pool of environments.

    Args:
        spec: settings shared by every env.
        train: the task's training data (`Task.load` of ``spec.task``; each env copies it to
            its device once).
        val: the task's validation data (as ``train``).
        devices: one device per env (``["cpu", "cpu"]``, ``["cuda:0", "cuda:1"]``, ...).
        test: the task's test split (`Task.load_test`), for final tables (`test`); None: the
            pool never reads one (PPO training).
        cuda_streams: each env's kernels on a CUDA stream of its own (every device must be
            CUDA; off by default, `MorphogenesisEnv` says why). Reachable from Python only:
            `compare` and `PPOTrainer` build their pools with the default.

    Example:
        >>> pool = EnvPool(EnvSpec(), train, val, ["cpu", "cpu"])  # doctest: +SKIP
        >>> observations = pool.reset([1, 2])  # doctest: +SKIP
        >>> steps = pool.step([Action(), Action()])  # doctest: +SKIP
        >>> steps[0].reward.total, steps[0].terminated  # doctest: +SKIP
    """

    def __init__(
        self,
        spec: EnvSpec,
        train: Any,
        val: Any,
        devices: Sequence[str],
        test: Any = None,
        cuda_streams: bool = False,
    ) -> None:
        if not devices:
            raise ValueError("an env pool needs at least one device")
        self.spec = spec
        self.envs = [MorphogenesisEnv(i, spec, train, val, d, test, cuda_streams)
                     for i, d in enumerate(devices)]

    def __len__(self) -> int:
        return len(self.envs)

    def reset(
        self,
        episode_rng_seeds: Sequence[int],
        which: Sequence[int] | None = None,
        implants: Sequence[Sequence[tuple[str, str]]] | None = None,
        host_lrs: Sequence[float | None] | None = None,
        rewards: Sequence[RewardConfig | None] | None = None,
    ) -> list[Observation]:
        """Fresh hosts for the envs in ``which`` (all by default), each trained for its first
        epoch before the first observation — the first decision comes after one epoch, as in a
        Trainer. ``implants[k]``: born-grown seeds of the k-th env; ``host_lrs[k]``: its
        learning rate, ``rewards[k]`` what its steps reward, None for the spec's
        (`MorphogenesisEnv.reset`)."""
        indices = list(range(len(self.envs)) if which is None else which)
        implants = [()] * len(indices) if implants is None else implants
        host_lrs = [None] * len(indices) if host_lrs is None else host_lrs
        rewards = [None] * len(indices) if rewards is None else rewards
        for i, rng_seed, grown, lr, reward in zip(indices, episode_rng_seeds, implants, host_lrs,
                                                  rewards, strict=True):
            self.envs[i].reset(rng_seed, grown, lr, reward)
        envs = [self.envs[i] for i in indices]
        self.train_epoch(envs)
        for env in envs:
            env.validate()
        return [env.observe() for env in envs]

    def step(self, actions: Sequence[Action], which: Sequence[int] | None = None) -> list[Step]:
        """Execute one action per env of ``which`` (all by default), train those envs for one
        epoch in lockstep, validate them; each env's `Step`: its next observation, reward and
        episode end."""
        envs = self.envs if which is None else [self.envs[i] for i in which]
        outcomes = [env.execute(a) for env, a in zip(envs, actions, strict=True)]
        self.train_epoch(envs)
        for env in envs:
            env.validate()
        return [env.finish_step(outcome) for env, outcome in zip(envs, outcomes, strict=True)]

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

    def test(self, which: Sequence[int]) -> list[tuple[float, float]]:
        """``(loss, accuracy %)`` of each env in ``which`` on the test split, as it is now (the
        end of an episode, for final tables)."""
        return [self.envs[i].test() for i in which]


__all__ = ["EnvPool", "EnvSpec", "MorphogenesisEnv", "Observation", "Step", "episode_rng_seed"]
