"""`PPOTrainer`: learn the lifecycle controller over a pool of Fabric environments.

One round = every env plays one episode of ``episode_length`` host epochs (a fresh host each, a
governor rollback ends an episode early and the env starts a new one), then one PPO update.
After every round the trainer logs to TensorBoard and writes an atomic checkpoint holding
everything needed to continue exactly: policy, Adam, normalisers, RNG state, round and config.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from tqdm.auto import tqdm

from esper_lightning.app.config import ConfigError, PPORunConfig, compatibility_errors
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.divergence import GovernorConfig
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.report import EpochReport
from esper_lightning.data import download_cifar10, load_cifar10
from esper_lightning.data.cifar10 import cifar10_present, subset_indices
from esper_lightning.envs import EnvPool, EnvSpec, Observation, env_seed
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    MaskBatch,
    PolicyConfig,
    PPOConfig,
    RewardConfig,
    RewardNormalizer,
    RolloutBuffer,
    RunningMeanStd,
    ValueNormalizer,
    compute_reward,
    make_optimizer,
    obs_dim,
    ppo_update,
)
from esper_lightning.rl.observations import batch_observations

CHECKPOINT_VERSION = 1


def encode_reports(
    reports: Sequence[EpochReport], obs_rms: RunningMeanStd, horizon: int
) -> tuple[Tensor, Tensor, Tensor, MaskBatch]:
    """Raw observations, normalised observations, blueprint indices and masks of a batch of
    reports: exactly what the policy sees, in training and in `PolicyController`."""
    batch = batch_observations(reports, horizon)
    return batch.features, obs_rms.normalize(batch.features).float(), batch.blueprint_idx, \
        batch.masks


@dataclass
class RoundStats:
    """What one round produced (logged under SPEC §11 tags)."""

    returns: list[float] = field(default_factory=list)  # per finished episode
    final_accuracies: list[float] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    reward_sums: Counter[str] = field(default_factory=Counter)
    seed_params: list[float] = field(default_factory=list)
    rollbacks: int = 0
    steps: int = 0
    env_seconds: float = 0.0
    controller_seconds: float = 0.0
    update_seconds: float = 0.0
    ppo: dict[str, float] = field(default_factory=dict)


class PPOTrainer:
    """Rounds of lockstep episodes and PPO updates, with checkpoints and TensorBoard.

    Args:
        config: the run (see `PPORunConfig`); data problems raise `DataError`, configuration
            problems (including an incompatible ``resume`` checkpoint) raise `ConfigError`.

    Example:
        >>> from esper_lightning.app.config import load_config
        >>> trainer = PPOTrainer(load_config("smoke", overrides={"data_dir": "data"}))
        >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(self, config: PPORunConfig) -> None:
        _check_hardware(config)
        self.config = config
        self.round = 0
        torch.manual_seed(config.seed)
        self.policy_config = PolicyConfig(n_slots=len(config.slots),
                                          hidden_dim=config.policy_hidden)
        self.policy = FactoredRecurrentActorCritic(self.policy_config)
        self.ppo_config = PPOConfig(
            learning_rate=config.learning_rate, gamma=config.gamma,
            gae_lambda=config.gae_lambda, n_epochs=config.ppo_epochs,
            minibatch_envs=min(config.minibatch_envs, config.envs),
        )
        self.optimizer = make_optimizer(self.policy, self.ppo_config)
        self.obs_rms = RunningMeanStd(shape=(obs_dim(len(config.slots)),))
        self.reward_normalizer = RewardNormalizer(config.gamma)
        self.value_normalizer = ValueNormalizer()
        self.reward_config = RewardConfig(mode=config.reward, gamma=config.gamma)
        if config.resume is not None:
            self.load_checkpoint(config.resume)
        self.pool = EnvPool(self._env_spec(), *self._load_data(), config.env_devices)
        self.logger = TensorBoardLogger(config.logdir, name="ppo")

    # --- setup --------------------------------------------------------------------------------
    def _env_spec(self) -> EnvSpec:
        c = self.config
        return EnvSpec(
            host_preset=c.host_preset, slots=c.slots, batch_size=c.batch_size, host_lr=c.host_lr,
            precision=c.precision, episode_length=c.episode_length, max_seeds=c.max_seeds,
            gate_config=GateConfig(min_training_epochs=c.min_training_epochs),
            governor=GovernorConfig(num_classes=10),
        )

    def _load_data(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        c = self.config
        if c.download and not cifar10_present(c.data_dir):
            download_cifar10(c.data_dir, progress=c.progress)
        splits = []
        for train, subset in ((True, c.train_subset), (False, c.val_subset)):
            images, labels = load_cifar10(c.data_dir, train)
            if subset is not None and subset < len(labels):
                keep = torch.as_tensor(subset_indices(len(labels), subset, c.seed))
                images, labels = images[keep], labels[keep]
            splits.append((images, labels))
        return splits[0], splits[1]

    # --- main loop ----------------------------------------------------------------------------
    def train(self) -> list[RoundStats]:
        """Run the remaining rounds; returns their stats."""
        c = self.config
        if self.round == 0:
            self.logger.log_hyperparams({k: str(v) if isinstance(v, list) else v
                                         for k, v in c.to_dict().items()})
        history = []
        bar = tqdm(range(self.round, c.rounds), initial=self.round, total=c.rounds,
                   desc="rounds", disable=not c.progress, dynamic_ncols=True)
        for round_index in bar:
            stats = self.run_round(round_index)
            self.round = round_index + 1
            self._log(stats)
            if c.save is not None:
                self.save_checkpoint(c.save)
            history.append(stats)
            bar.set_postfix(acc=f"{_mean(stats.final_accuracies):.1f}",
                            ret=f"{_mean(stats.returns):.2f}")
        self.logger.finalize("success")
        return history

    def run_round(self, round_index: int) -> RoundStats:
        """Collect ``envs × episode_length`` transitions, then update the policy once."""
        c, n, horizon = self.config, self.config.envs, self.config.episode_length
        stats = RoundStats()
        buffer = RolloutBuffer(n, horizon, self.policy_config)
        episodes = [0] * n
        returns = [0.0] * n
        start = time.perf_counter()
        observations = self.pool.reset([env_seed(c.seed, round_index, i) for i in range(n)])
        stats.env_seconds += time.perf_counter() - start
        hidden = self.policy.initial_state(n)
        starts = torch.ones(n, dtype=torch.bool)
        raw_log = []
        self.obs_rms.freeze()
        for t in range(horizon):
            tick = time.perf_counter()
            reports = [o.report for o in observations]
            raw, obs, blueprints, masks = encode_reports(reports, self.obs_rms, horizon)
            raw_log.append(raw)
            out = self.policy.act(obs, blueprints, masks, hidden, episode_starts=starts)
            actions = [Action.from_indices(row) for row in out.actions.tolist()]
            stats.controller_seconds += time.perf_counter() - tick
            tick = time.perf_counter()
            outcomes, next_obs = self.pool.step(actions)
            stats.env_seconds += time.perf_counter() - tick
            last = t == horizon - 1
            terminated = torch.tensor([o.rollback is not None for o in next_obs])
            truncated = torch.tensor([last and o.rollback is None for o in next_obs])
            rewards = torch.zeros(n)
            for i, (before, outcome, after) in enumerate(zip(reports, outcomes, next_obs,
                                                             strict=True)):
                # An env restarted after a rollback is cut at the round's end before reaching
                # max epochs: truncated (bootstrapped) but not an episode end.
                breakdown = compute_reward(
                    before, outcome.executed, outcome.success, after.report, self.reward_config,
                    terminal=after.report.epoch >= horizon, rollback=after.rollback is not None,
                )
                rewards[i] = breakdown.total
                returns[i] += breakdown.total
                stats.reward_sums.update(breakdown.as_dict())
                stats.ops[outcome.executed.op.name.lower()] += 1
            bootstrap = None
            if last:
                next_reports = [o.report for o in next_obs]
                _, next_o, next_bp, next_masks = encode_reports(next_reports, self.obs_rms,
                                                                horizon)
                bootstrap = self.policy.act(next_o, next_bp, next_masks, out.hidden,
                                            deterministic=True).value
            buffer.add(obs=obs, blueprint_idx=blueprints, hidden=hidden, masks=masks,
                       actions=out.actions, log_probs=out.log_probs, values=out.value,
                       rewards=rewards, episode_starts=starts, terminated=terminated,
                       truncated=truncated, bootstrap_values=bootstrap)
            hidden, starts = out.hidden, terminated.clone()
            observations = self._finish_episodes(next_obs, terminated | truncated, stats,
                                                 returns, episodes, round_index)
            stats.steps += n
        tick = time.perf_counter()
        self.obs_rms.unfreeze()
        self.obs_rms.update(torch.cat(raw_log))
        self.obs_rms.freeze()
        stats.ppo = ppo_update(self.policy, self.optimizer, buffer, self.ppo_config,
                               self.value_normalizer, self.reward_normalizer)
        stats.update_seconds = time.perf_counter() - tick
        return stats

    def _finish_episodes(
        self,
        observations: list[Observation],
        done: Tensor,
        stats: RoundStats,
        returns: list[float],
        episodes: list[int],
        round_index: int,
    ) -> list[Observation]:
        """Book the finished episodes; envs stopped by the governor start a new one now."""
        observations = list(observations)
        for i in torch.nonzero(done).flatten().tolist():
            engine = self.pool.envs[i].engine
            assert engine is not None
            report = observations[i].report
            stats.events.update(e.kind for e in engine.events)
            full_length = report.epoch >= self.config.episode_length
            if full_length or observations[i].rollback is not None:  # not a round-end cut
                stats.returns.append(returns[i])
            if full_length:
                stats.final_accuracies.append(report.val_accuracy or 0.0)
                stats.seed_params.append(float(report.seed_params))
            returns[i] = 0.0
            if observations[i].rollback is not None:
                stats.rollbacks += 1
                episodes[i] += 1
                seed = env_seed(self.config.seed, round_index, i, episodes[i])
                observations[i] = self.pool.reset([seed], which=[i])[0]
        return observations

    # --- logging ------------------------------------------------------------------------------
    def _log(self, stats: RoundStats) -> None:
        env_epochs = stats.steps
        total = stats.env_seconds + stats.controller_seconds + stats.update_seconds
        metrics = {
            "charts/episodic_return": _mean(stats.returns),
            "charts/final_accuracy": _mean(stats.final_accuracies),
            "charts/env_epochs_per_sec": env_epochs / max(stats.env_seconds, 1e-9),
            "charts/controller_share": (stats.controller_seconds + stats.update_seconds)
            / max(total, 1e-9),
            "morpho/seeds_germinated": float(stats.events["germinated"]),
            "morpho/seeds_fossilized": float(stats.events["fossilized"]),
            "morpho/seeds_pruned": float(stats.events["pruned"]),
            "morpho/seed_params": _mean(stats.seed_params),
            "governor/rollbacks": float(stats.rollbacks),
        }
        for op in LifecycleOp:
            name = op.name.lower()
            metrics[f"actions/{name}"] = stats.ops[name] / max(stats.steps, 1)
        for component, value in stats.reward_sums.items():
            metrics[f"rewards/{component}"] = value / max(stats.steps, 1)
        for key, value in stats.ppo.items():
            metrics[f"losses/{key}"] = value
        self.logger.log_metrics(metrics, step=self.round)
        self.logger.save()

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "round": self.round,
            "config": self.config.to_dict(),
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_rms": self.obs_rms.state_dict(),
            "reward_normalizer": self.reward_normalizer.state_dict(),
            "value_normalizer": self.value_normalizer.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": _numpy_state(),
                "python": _python_state(),
            },
        }

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a crash mid-write never leaves a truncated checkpoint."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.checkpoint(), tmp)
        os.replace(tmp, path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        state = read_checkpoint(path)
        errors = compatibility_errors(state["config"], self.config)
        if errors:
            raise ConfigError(
                f"checkpoint '{path}' comes from an incompatible config: {'; '.join(errors)}"
            )
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.obs_rms.load_state_dict(state["obs_rms"])
        self.reward_normalizer.load_state_dict(state["reward_normalizer"])
        self.value_normalizer.load_state_dict(state["value_normalizer"])
        torch.set_rng_state(state["rng"]["torch"])
        _set_numpy_state(state["rng"]["numpy"])
        random.setstate(_to_tuple(state["rng"]["python"]))
        self.round = int(state["round"])


def _check_hardware(config: PPORunConfig) -> None:
    cuda = [d for d in config.env_devices if d.startswith("cuda")]
    if cuda and not torch.cuda.is_available():
        raise ConfigError(f"device {cuda[0]!r} requested but CUDA is not available; use cpu")
    for device in cuda:
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r} does not exist; this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    if config.precision == "16-mixed" and not cuda:
        raise ConfigError("precision '16-mixed' needs CUDA devices; on cpu use bf16-mixed or "
                          "32-true")


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a PPO checkpoint safely (``weights_only=True``); bad files raise `ConfigError`."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint '{path}' does not exist") from None
    except Exception as err:  # unpickling errors of any kind mean "not our checkpoint"
        reason = str(err).splitlines()[0][:120]
        raise ConfigError(f"cannot read checkpoint '{path}': {reason}") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        raise ConfigError(f"'{path}' is not an esper-lightning PPO checkpoint (version "
                          f"{CHECKPOINT_VERSION})")
    return state


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def _numpy_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"name": name, "keys": torch.as_tensor(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _set_numpy_state(state: dict[str, Any]) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["name"], keys, state["pos"], state["has_gauss"], state["cached"]))


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _to_tuple(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
