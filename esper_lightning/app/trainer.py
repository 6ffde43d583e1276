"""`PPOTrainer`: learn the lifecycle controller over a pool of Fabric environments.

One round = every env plays one episode of ``episode_length`` host epochs (a fresh host each; a
governor rollback ends an episode early and the env starts a new one), then one PPO update.
After every round the trainer logs to TensorBoard (scalars, and env 0's seed timeline as an
image), logs one INFO line on the ``esper_lightning`` logger, and writes an atomic checkpoint
holding everything needed to continue exactly (`app.checkpoint`), the TensorBoard version
included, so a resumed run keeps writing to the same ``version_N`` folder.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from tqdm.auto import tqdm

from esper_lightning.app.checkpoint import load_trainer, save_trainer, seed_run
from esper_lightning.app.config import PPORunConfig, check_hardware
from esper_lightning.app.metrics import RoundStats, mean, round_metrics
from esper_lightning.core.actions import Action
from esper_lightning.core.divergence import GovernorConfig
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.data import download_cifar10, load_cifar10_subset
from esper_lightning.data.cifar10 import cifar10_present
from esper_lightning.envs import EnvPool, EnvSpec, Observation, episode_rng_seed
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    PolicyConfig,
    PPOConfig,
    RewardConfig,
    RewardNormalizer,
    RolloutBuffer,
    RunningMeanStd,
    ValueNormalizer,
    compute_reward,
    encode_reports,
    make_optimizer,
    obs_dim,
    ppo_update,
)
from esper_lightning.rl.policy import ActOutput, Hidden
from esper_lightning.viz.timeline import log_timeline

log = logging.getLogger(__name__)
#: TensorBoard image tag of env 0's seed timeline, once per round.
TIMELINE_TAG = "morpho/timeline_env0"


@dataclass
class _Rollout:
    """What a round's collection carries from one step to the next."""

    round_index: int
    buffer: RolloutBuffer
    observations: list[Observation]
    hidden: Hidden
    starts: Tensor  # [n] bool: the next step starts an episode
    returns: list[float]  # running return of each env's current episode
    episodes: list[int]  # episodes each env began this round (restarts after rollbacks)
    raw_features: list[Tensor]  # unnormalised observations, for the normaliser's update


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
        check_hardware(config)
        self.config = config
        self.round = 0
        seed_run(config.rng_seed)
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
        #: TensorBoard version to write to (None: the next free one); a resume sets it.
        self.log_version: int | str | None = None
        if config.resume is not None:
            load_trainer(self, config.resume)
        self.pool = EnvPool(env_spec(config), *load_splits(config), config.env_devices)
        self.logger = TensorBoardLogger(config.logdir, name="ppo", version=self.log_version)

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
            start = time.perf_counter()
            stats = self.run_round(round_index)
            self.round = round_index + 1
            self.logger.log_metrics(round_metrics(stats), step=self.round)
            self._log_timeline()
            self.logger.save()
            _log_round(self.round, c.rounds, stats, time.perf_counter() - start)
            if c.save is not None:
                save_trainer(self, c.save)
            history.append(stats)
            bar.set_postfix(acc=f"{mean(stats.final_accuracies):.1f}",
                            ret=f"{mean(stats.returns):.2f}")
        self.logger.finalize("success")
        return history

    def _log_timeline(self) -> None:
        """Env 0's last episode as a seed-timeline image (the pool resets at the next round)."""
        engine = self.pool.envs[0].engine
        if engine is not None:
            log_timeline(self.logger.experiment, engine.timeline, self.round, TIMELINE_TAG,
                         slot_ids=engine.slot_ids, title=f"env 0, round {self.round}")

    def run_round(self, round_index: int) -> RoundStats:
        """Collect ``envs × episode_length`` transitions, then update the policy once."""
        stats = RoundStats()
        rollout = self._begin_round(round_index, stats)
        self.obs_rms.freeze()  # one normalisation for the whole rollout
        for t in range(self.config.episode_length):
            self._collect_step(rollout, t, stats)
        tick = time.perf_counter()
        self.obs_rms.unfreeze()
        self.obs_rms.update(torch.cat(rollout.raw_features))
        self.obs_rms.freeze()
        stats.ppo = ppo_update(self.policy, self.optimizer, rollout.buffer, self.ppo_config,
                               self.value_normalizer, self.reward_normalizer)
        stats.update_seconds = time.perf_counter() - tick
        return stats

    # --- collection ---------------------------------------------------------------------------
    def _begin_round(self, round_index: int, stats: RoundStats) -> _Rollout:
        n = self.config.envs
        start = time.perf_counter()
        seeds = [episode_rng_seed(self.config.rng_seed, round_index, i) for i in range(n)]
        observations = self.pool.reset(seeds)
        stats.env_seconds += time.perf_counter() - start
        return _Rollout(
            round_index=round_index,
            buffer=RolloutBuffer(n, self.config.episode_length, self.policy_config),
            observations=observations,
            hidden=self.policy.initial_state(n),
            starts=torch.ones(n, dtype=torch.bool),
            returns=[0.0] * n,
            episodes=[0] * n,
            raw_features=[],
        )

    def _collect_step(self, rollout: _Rollout, t: int, stats: RoundStats) -> None:
        """One decision per env, one epoch of training per env, one buffer row."""
        horizon = self.config.episode_length
        tick = time.perf_counter()
        reports = [o.report for o in rollout.observations]
        raw, obs, blueprints, masks = encode_reports(reports, self.obs_rms, horizon)
        rollout.raw_features.append(raw)
        out = self.policy.act(obs, blueprints, masks, rollout.hidden,
                              episode_starts=rollout.starts)
        actions = [Action.from_indices(row) for row in out.actions.tolist()]
        stats.controller_seconds += time.perf_counter() - tick
        tick = time.perf_counter()
        outcomes, next_obs = self.pool.step(actions)
        stats.env_seconds += time.perf_counter() - tick
        last = t == horizon - 1
        terminated = torch.tensor([o.rollback_reason is not None for o in next_obs])
        truncated = torch.tensor([last and o.rollback_reason is None for o in next_obs])
        rewards = self._rewards(rollout, reports, outcomes, next_obs, stats)
        rollout.buffer.add(
            obs=obs, blueprint_idx=blueprints, hidden=rollout.hidden, masks=masks,
            actions=out.actions, log_probs=out.log_probs, values=out.value, rewards=rewards,
            episode_starts=rollout.starts, terminated=terminated, truncated=truncated,
            bootstrap_values=self._bootstrap(next_obs, out) if last else None,
        )
        rollout.hidden, rollout.starts = out.hidden, terminated.clone()
        rollout.observations = self._finish_episodes(rollout, next_obs, terminated | truncated,
                                                     stats)
        stats.steps += len(actions)

    def _rewards(
        self, rollout: _Rollout, reports: list[Any], outcomes: list[Any],
        next_obs: list[Observation], stats: RoundStats,
    ) -> Tensor:
        rewards = torch.zeros(len(outcomes))
        for i, (before, outcome, after) in enumerate(zip(reports, outcomes, next_obs,
                                                         strict=True)):
            breakdown = compute_reward(
                before, outcome.executed, outcome.success, after.report, self.reward_config,
                terminal=after.report.epoch >= self.config.episode_length,
                rollback=after.rollback_reason is not None,
            )
            rewards[i] = breakdown.total
            rollout.returns[i] += breakdown.total
            stats.reward_sums.update(breakdown.as_dict())
            stats.ops[outcome.executed.op.name.lower()] += 1
        return rewards

    def _bootstrap(self, next_obs: list[Observation], out: ActOutput) -> Tensor:
        """V(s') of the states the round ends in (read only where an env is truncated)."""
        reports = [o.report for o in next_obs]
        _, obs, blueprints, masks = encode_reports(reports, self.obs_rms,
                                                   self.config.episode_length)
        return self.policy.act(obs, blueprints, masks, out.hidden, deterministic=True).value

    def _finish_episodes(
        self, rollout: _Rollout, observations: list[Observation], done: Tensor,
        stats: RoundStats,
    ) -> list[Observation]:
        """Book the finished episodes; envs stopped by the governor start a new one now."""
        observations = list(observations)
        for i in torch.nonzero(done).flatten().tolist():
            engine = self.pool.envs[i].engine
            assert engine is not None
            report, rollback = observations[i].report, observations[i].rollback_reason
            stats.events.update(engine.event_counts())
            full_length = report.epoch >= self.config.episode_length
            if full_length or rollback is not None:  # not a round-end cut
                stats.returns.append(rollout.returns[i])
            if full_length:
                stats.final_accuracies.append(report.val_accuracy or 0.0)
                stats.seed_params.append(float(report.seed_params))
            rollout.returns[i] = 0.0
            if rollback is not None:
                stats.rollbacks += 1
                rollout.episodes[i] += 1
                rng_seed = episode_rng_seed(self.config.rng_seed, rollout.round_index, i,
                                            rollout.episodes[i])
                observations[i] = self.pool.reset([rng_seed], which=[i])[0]
        return observations


def _log_round(round_number: int, rounds: int, stats: RoundStats, seconds: float) -> None:
    ops = " ".join(f"{name}={count}" for name, count in sorted(stats.ops.items()))
    log.info("round %d/%d: final accuracy %.2f%%, return %.3f, ops %s, %.1f s", round_number,
             rounds, mean(stats.final_accuracies), mean(stats.returns), ops or "none", seconds)


def env_spec(config: PPORunConfig) -> EnvSpec:
    """The settings every env of the run's pool shares."""
    c = config
    return EnvSpec(
        host_preset=c.host_preset, slots=c.slots, batch_size=c.batch_size, host_lr=c.host_lr,
        precision=c.precision, episode_length=c.episode_length, max_seeds=c.max_seeds,
        gate_config=GateConfig(min_training_epochs=c.min_training_epochs),
        governor=GovernorConfig(num_classes=10),
    )


def load_splits(config: PPORunConfig) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The run's training and validation images (downloaded first when asked to)."""
    c = config
    if c.download and not cifar10_present(c.data_dir):
        download_cifar10(c.data_dir, progress=c.progress)
    train = load_cifar10_subset(c.data_dir, True, c.train_subset, c.rng_seed, at_most=True)
    val = load_cifar10_subset(c.data_dir, False, c.val_subset, c.rng_seed, at_most=True)
    return train, val
