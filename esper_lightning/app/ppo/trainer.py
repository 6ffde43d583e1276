"""`PPOTrainer`: learn the lifecycle controller over a pool of Fabric environments.

One round = every env plays one episode of ``episode_length`` host epochs (a fresh host each,
trained one epoch before its first decision; a governor rollback restores the env's last
snapshot, costs its penalty and the episode goes on, as in `esper-lightning compare`), then one
PPO update. After every round the trainer logs to TensorBoard (scalars, and env 0's seed
timeline as an image, against the env steps collected so far as CleanRL does; the round is
``charts/round``), logs one INFO line on the ``esper_lightning`` logger (the envs' engines log
one per lifecycle event, labelled with round and env), and writes an atomic checkpoint holding
everything needed to continue exactly (`app.ppo.checkpoint`), the TensorBoard version included, so a
resumed run keeps writing to the same ``version_N`` folder.

With ``ab`` set, one policy per reward mode learns side by side in the same pool: the envs are
split into equal groups that play the same episode seeds in lockstep, each group acting for and
rewarding its own policy, which has its own optimizer, normalisers, checkpoint and TensorBoard
run. Learning groups one after another would hand them different data and machine states.

Under a ddp strategy (`app.ppo.distributed` launches the processes; `app.ppo.ranks` says where one
stands) every process runs this trainer on its share of the envs with the same policy: episode
and action-sampling seeds come from the global env index, so the rollouts are those of one
process with every env, the update reduces over the ranks, and rank 0 logs and writes the
checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from tqdm.auto import tqdm

from esper_lightning.app.config import PPORunConfig, check_hardware
from esper_lightning.app.logs import label_engine
from esper_lightning.app.ppo.checkpoint import load_trainer, save_trainer, seed_run, start_from
from esper_lightning.app.ppo.learner import Learner
from esper_lightning.app.ppo.metrics import RoundStats, mean, merge_stats, round_metrics
from esper_lightning.app.ppo.paths import checkpoint_path, logger_name, refuse_overwrite
from esper_lightning.app.ppo.ranks import Ranks
from esper_lightning.app.task import env_spec, germinable_blueprints, load_splits, reward_config
from esper_lightning.core.actions import Action
from esper_lightning.core.report import EpochReport
from esper_lightning.envs import EnvPool, Observation, Step, episode_rng_seed
from esper_lightning.errors import ConfigError
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    PolicyConfig,
    PPOConfig,
    RewardNormalizer,
    RolloutBuffer,
    RunningMeanStd,
    ValueNormalizer,
    decisions_per_episode,
    encode_reports,
    make_optimizer,
    obs_dim,
    ppo_update,
    step_ends,
)
from esper_lightning.rl.distributions import MaskBatch
from esper_lightning.rl.policy import ActOutput, Hidden
from esper_lightning.viz.timeline import log_timeline

log = logging.getLogger(__name__)
#: TensorBoard image tag of a learner's first env's seed timeline, once per round.
TIMELINE_TAG = "morpho/timeline_env0"


def action_rng_seed(root: int, round_index: int, env_index: int) -> int:
    """The seed of one env's action-sampling stream in one round (apart from its episode seeds):
    an env samples the same actions however the envs are spread over processes."""
    return _round_stream(root, round_index, 1, env_index)


def minibatch_rng_seed(root: int, round_index: int) -> int:
    """The seed of one round's minibatch partition (`rl.ppo.minibatches`): every rank draws the
    same partition of all the envs, whatever else it drew before."""
    return _round_stream(root, round_index, 2)


def _round_stream(root: int, round_index: int, stream: int, *indices: int) -> int:
    sequence = np.random.SeedSequence([root, round_index, *indices], spawn_key=(stream,))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


@dataclass
class _Rollout:
    """What one learner's collection carries from one step to the next (per env of its group:
    index ``k`` is the k-th env of the learner's group)."""

    buffer: RolloutBuffer
    hidden: Hidden
    starts: Tensor  # [n] bool: the next step starts an episode
    returns: list[float]  # running return of each env's current episode
    decisions: list[int]  # decisions each env's current episode has taken
    generators: list[torch.Generator]  # each env's action-sampling stream this round
    ended: Tensor | None = None  # [n] bool: the last step ended or cut the episode
    raw_features: list[Tensor] = field(default_factory=list)  # for the normaliser's update
    stats: RoundStats = field(default_factory=RoundStats)


class _Acted(NamedTuple):
    """One learner's decision step: the reports it saw and what `policy.act` produced."""

    reports: list[EpochReport]
    actions: list[Action]
    obs: Tensor
    blueprint_idx: Tensor
    masks: MaskBatch
    out: ActOutput


class PPOTrainer:
    """Rounds of lockstep episodes and PPO updates, with checkpoints and TensorBoard.

    Args:
        config: the run (see `PPORunConfig`); data problems raise `DataError`, configuration
            problems (including an incompatible ``resume`` checkpoint) raise `ConfigError`.
        ranks: this process of a data-parallel run (`app.ppo.distributed.launch_ppo` builds it);
            None: one process.
        command: the command line that started it (the CLI passes it), saved in the
            checkpoint's ``commands``.

    Example:
        One round on a tiny generated CIFAR-10 (point ``data_dir`` at the real one instead):

        >>> import tempfile
        >>> from esper_lightning.app.config import load_config
        >>> from esper_lightning.data import write_cifar10_fixture
        >>> folder = tempfile.TemporaryDirectory()
        >>> data = write_cifar10_fixture(f"{folder.name}/cifar", n_train=80, n_test=40)
        >>> config = load_config("smoke", overrides={
        ...     "data_dir": str(data), "logdir": f"{folder.name}/logs", "progress": False,
        ...     "envs": 2, "minibatch_envs": 2, "episode_length": 3, "rounds": 1})
        >>> history = PPOTrainer(config).train()
        >>> len(history), history[0].steps  # one round of 2 envs x 2 decisions
        (1, 4)
        >>> folder.cleanup()
    """

    def __init__(self, config: PPORunConfig, ranks: Ranks | None = None,
                 command: Sequence[str] = ()) -> None:
        self.ranks = ranks = ranks or Ranks()
        if ranks.world_size != config.world_size:
            raise ConfigError(f"{ranks.world_size} processes run a config for "
                              f"{config.world_size} (devices x num_nodes); pass the same counts "
                              f"to the launcher and to esper-lightning")
        devices = config.env_devices if ranks.world_size == 1 else (ranks.device,)
        check_hardware(config, devices)
        refuse_overwrite(config)
        self.config = config
        self.round = 0
        seed_run(config.rng_seed)  # the same on every rank: the same initial policy
        self.local_envs = config.envs // ranks.world_size
        self.env_offset = ranks.rank * self.local_envs  # global index of this rank's env 0
        self.ppo_config = PPOConfig(
            learning_rate=config.learning_rate, gamma=config.gamma,
            gae_lambda=config.gae_lambda, n_epochs=config.ppo_epochs,
            minibatch_envs=config.minibatch_envs,  # of every rank's envs (`rl.ppo.minibatches`)
            target_kl=config.target_kl,
        )
        self.policy_config = PolicyConfig(n_slots=len(config.slots),
                                          hidden_dim=config.policy_hidden)
        self.learners = [self._learner(mode, k) for k, mode in enumerate(config.reward_modes)]
        for learner in self.learners:  # none from Python: nothing a shell could rerun
            if command:
                learner.commands.append(list(command))
        if config.resume is not None:
            for learner in self.learners:
                self.round = load_trainer(learner, self.checkpoint_path(config.resume, learner))
        self.first_round = self.round  # where this process starts: 0, or a resumed run's round
        pool_devices = config.env_devices if ranks.world_size == 1 else devices * self.local_envs
        self.pool = EnvPool(env_spec(config), *load_splits(config, config.progress),
                            pool_devices)
        for learner in self.learners if ranks.is_zero else ():  # rank 0 logs
            # Its folder appears with the first round's metrics: a run that fails before leaves
            # no empty version_N behind. No hp_metric: there is no single number to rank by.
            learner.logger = TensorBoardLogger(config.logdir, name=learner.logger_name,
                                               version=learner.log_version,
                                               default_hp_metric=False)

    def _learner(self, mode: str, group: int) -> Learner:
        config = self.config.learner_config(mode)
        policy = FactoredRecurrentActorCritic(self.policy_config)
        obs_rms = RunningMeanStd(shape=(obs_dim(len(config.slots)),))
        earlier = None
        if config.init_policy is not None and config.resume is None:
            earlier = start_from(config, policy, obs_rms)
        n = config.envs // self.ranks.world_size
        learner = Learner(
            config=config, envs=list(range(group * n, (group + 1) * n)), policy=policy,
            optimizer=make_optimizer(policy, self.ppo_config),
            obs_rms=obs_rms,
            reward_normalizer=RewardNormalizer(config.gamma),
            value_normalizer=ValueNormalizer(),
            reward_config=reward_config(config, mode),
            logger_name=logger_name(self.config, mode),
        )
        if earlier is not None:  # a curriculum costs all its stages
            learner.cost.update(earlier["training_cost"])
            learner.commands[:0] = earlier["commands"]
        return learner

    def checkpoint_path(self, path: str, learner: Learner) -> Path:
        """``path`` itself, or ``<stem>.<mode><suffix>`` for each policy of an A/B run."""
        return checkpoint_path(path, self.config, learner.name)

    @property
    def decisions_per_episode(self) -> int:
        """The first epoch trains before the first decision, as in a Trainer."""
        return decisions_per_episode(self.config.episode_length)

    # --- main loop ----------------------------------------------------------------------------
    def train(self) -> list[RoundStats]:
        """Run the remaining rounds; returns the first policy's stats per round (every
        policy's are in ``learner.history``)."""
        c = self.config
        bar = tqdm(range(self.round, c.rounds), initial=self.round, total=c.rounds,
                   desc="rounds", disable=not (c.progress and self.ranks.is_zero),
                   dynamic_ncols=True)
        for round_index in bar:
            start = time.perf_counter()
            stats = [merge_stats(self.ranks.gather(s)) for s in self.run_round(round_index)]
            self.round = round_index + 1
            for learner, learner_stats in zip(self.learners, stats, strict=True):
                self._finish_round(learner, learner_stats, time.perf_counter() - start)
            bar.set_postfix(acc=f"{mean(stats[0].final_accuracies):.1f}",
                            ret=f"{mean(stats[0].returns):.2f}")
        for learner in self.learners:
            if learner.logger is not None:
                learner.logger.finalize("success")
        return self.learners[0].history

    def _finish_round(self, learner: Learner, stats: RoundStats, seconds: float) -> None:
        learner.history.append(stats)
        cost = learner.cost
        cost["rounds"] += 1
        cost["episodes"] += len(stats.returns)
        cost["train_flops"] += sum(stats.train_flops)
        cost["wall_seconds"] += seconds
        if learner.logger is None:  # not rank 0
            return
        first = self.round == self.first_round + 1  # this process's first round
        if first:  # this process's settings, a resumed run's too
            # hparams.yaml keeps real lists: it can be fed back with --config
            learner.logger.log_hyperparams(learner.config.to_dict())
        learning_rate = float(learner.optimizer.param_groups[0]["lr"])
        learner.logger.log_metrics(
            round_metrics(stats, self.round, learning_rate, germinable_blueprints(learner.config)),
            step=self.global_step(learner))
        self._log_timeline(learner)
        learner.logger.save()
        if first and self.first_round:  # resumed; the folder exists now
            # The logger writes hparams.yaml only where there is none: a resumed run's settings.
            save_hparams_to_yaml(Path(learner.logger.log_dir) / "hparams.yaml",
                                 learner.logger.hparams)
        ops = " ".join(f"{name}={count}" for name, count in sorted(stats.ops.items()))
        group = f" [{learner.name}]" if self.config.ab else ""
        log.info("round %d/%d%s: final accuracy %.2f%%, return %.3f, ops %s, %.1f s",
                 self.round, self.config.rounds, group, mean(stats.final_accuracies),
                 mean(stats.returns), ops or "none", seconds)
        if self.config.save is not None:
            save_trainer(learner, self.round, self.checkpoint_path(self.config.save, learner),
                         self.config)

    def global_step(self, learner: Learner) -> int:
        """Env steps (decisions) ``learner`` has collected after the rounds done: the x axis of
        its TensorBoard charts, CleanRL's ``global_step`` (the round is ``charts/round``)."""
        return self.round * learner.config.envs * self.decisions_per_episode

    def _log_timeline(self, learner: Learner) -> None:
        """The learner's first env's last episode as a seed-timeline image."""
        engine = self.pool.envs[learner.envs[0]].engine
        if engine is not None and learner.logger is not None:
            log_timeline(learner.logger.experiment, engine.timeline, self.global_step(learner),
                         TIMELINE_TAG, slot_ids=engine.slot_ids,
                         title=f"env 0, round {self.round}")

    def run_round(self, round_index: int) -> list[RoundStats]:
        """Collect one episode per env (``decisions_per_episode`` steps), then update every
        policy once on its own envs' transitions."""
        rollouts = self._begin_round(round_index)
        for learner in self.learners:
            learner.obs_rms.freeze()  # one normalisation for the whole rollout
        observations = self._reset_pool(round_index, rollouts)
        for t in range(self.decisions_per_episode):
            observations = self._collect_step(rollouts, observations,
                                              last=t == self.decisions_per_episode - 1)
        for learner, rollout in zip(self.learners, rollouts, strict=True):
            self._update(learner, rollout, round_index)
        return [rollout.stats for rollout in rollouts]

    # --- collection ---------------------------------------------------------------------------
    def _begin_round(self, round_index: int) -> list[_Rollout]:
        rollouts = []
        for learner in self.learners:
            n = len(learner.envs)
            generators = [  # the k-th env of every A/B group samples from the same stream
                torch.Generator().manual_seed(
                    action_rng_seed(self.config.rng_seed, round_index, self.env_offset + k))
                for k in range(n)
            ]
            rollouts.append(_Rollout(
                buffer=RolloutBuffer(n, self.decisions_per_episode, self.policy_config),
                hidden=learner.policy.initial_state(n), starts=torch.ones(n, dtype=torch.bool),
                returns=[0.0] * n, decisions=[0] * n, generators=generators,
            ))
        return rollouts

    def _reset_pool(self, round_index: int, rollouts: list[_Rollout]) -> list[Observation]:
        """Every group plays the same episode seeds: the k-th env of each group gets seed k
        (of a data-parallel rank: its global index)."""
        start = time.perf_counter()
        group = len(self.learners[0].envs)
        seeds = [episode_rng_seed(self.config.rng_seed, round_index, self.env_offset + i % group)
                 for i in range(len(self.pool))]
        rewards = [None] * len(self.pool)  # each env's steps reward its policy's reward mode
        for learner in self.learners:
            for i in learner.envs:
                rewards[i] = learner.reward_config
        observations = self.pool.reset(seeds, rewards=rewards)
        for learner in self.learners:  # every event line says which round, env and policy
            for k, i in enumerate(learner.envs):
                label_engine(self.pool.envs[i].engine, learner.logger_name,
                             round=round_index + 1, env=self.env_offset + k)
        for rollout in rollouts:  # the lockstep time is shared evenly between the groups
            rollout.stats.env_seconds += (time.perf_counter() - start) / len(rollouts)
        return observations

    def _collect_step(
        self, rollouts: list[_Rollout], observations: list[Observation], last: bool,
    ) -> list[Observation]:
        """One decision per env, one epoch of training per env (all groups in lockstep)."""
        actions: list[Action] = [Action()] * len(self.pool)
        acted = []
        for learner, rollout in zip(self.learners, rollouts, strict=True):
            tick = time.perf_counter()
            step = self._act(learner, rollout, [observations[i].report for i in learner.envs])
            for i, action in zip(learner.envs, step.actions, strict=True):
                actions[i] = action
            acted.append(step)
            rollout.stats.controller_seconds += time.perf_counter() - tick
        tick = time.perf_counter()
        steps = self.pool.step(actions)
        env_seconds = (time.perf_counter() - tick) / len(self.learners)
        for learner, rollout, acting in zip(self.learners, rollouts, acted, strict=True):
            rollout.stats.env_seconds += env_seconds
            self._store(learner, rollout, acting, [steps[i] for i in learner.envs], last)
            self._finish_episodes(learner, rollout, steps)
        return [step.observation for step in steps]

    def _act(self, learner: Learner, rollout: _Rollout, reports: list[EpochReport]) -> _Acted:
        raw, obs, blueprints, masks = encode_reports(
            reports, learner.obs_rms, self.config.episode_length, self.config.heads == "compact")
        rollout.raw_features.append(raw)
        out = learner.policy.act(obs, blueprints, masks, rollout.hidden,
                                 episode_starts=rollout.starts, generators=rollout.generators)
        actions = [Action.from_indices(row) for row in out.actions.tolist()]
        return _Acted(reports, actions, obs, blueprints, masks, out)

    def _store(self, learner: Learner, rollout: _Rollout, acting: _Acted, steps: list[Step],
               last: bool) -> None:
        """The envs' rewards and episode ends (truncated where the rollout stops mid-episode,
        `rl.episodes.step_ends`) as one buffer row."""
        after = [step.observation for step in steps]
        rollout.stats.rollbacks += sum(o.rollback_reason is not None for o in after)
        ends = step_ends([step.terminated for step in steps], rollout_over=last)
        rewards = torch.tensor([step.reward.total for step in steps])
        for k, step in enumerate(steps):
            rollout.decisions[k] += 1
            rollout.returns[k] += step.reward.total
            rollout.stats.reward_sums.update(step.reward.as_dict())
            rollout.stats.ops[step.outcome.executed.op.name.lower()] += 1
        out = acting.out
        bootstrap = self._bootstrap(learner, after, out.hidden) if ends.truncated.any() else None
        rollout.buffer.add(
            obs=acting.obs, blueprint_idx=acting.blueprint_idx, hidden=rollout.hidden,
            masks=acting.masks, actions=out.actions, log_probs=out.log_probs, values=out.value,
            rewards=rewards, episode_starts=rollout.starts, terminated=ends.terminated,
            truncated=ends.truncated, bootstrap_values=bootstrap,
        )
        rollout.hidden, rollout.starts = out.hidden, ends.terminated.clone()
        rollout.stats.steps += len(after)
        rollout.ended = ends.terminated | ends.truncated

    def _bootstrap(self, learner: Learner, after: list[Observation], hidden: Hidden) -> Tensor:
        """V(s') of the states a rollout is cut in (read only where an env is truncated)."""
        _, obs, blueprints, masks = encode_reports(
            [o.report for o in after], learner.obs_rms, self.config.episode_length,
            self.config.heads == "compact")
        return learner.policy.act(obs, blueprints, masks, hidden, deterministic=True).value

    def _finish_episodes(self, learner: Learner, rollout: _Rollout, steps: list[Step]) -> None:
        """Book the episodes that reached their last decision (a rollout is whole episodes)."""
        stats = rollout.stats
        assert rollout.ended is not None
        for k in torch.nonzero(rollout.ended).flatten().tolist():
            i = learner.envs[k]
            report, engine = steps[i].observation.report, self.pool.envs[i].engine
            assert engine is not None and rollout.decisions[k] >= self.decisions_per_episode
            stats.events.update(engine.event_counts())
            stats.germinated.update(e.blueprint for e in engine.events if e.kind == "germinated")
            stats.returns.append(rollout.returns[k])
            stats.final_accuracies.append(report.val_accuracy or 0.0)
            stats.seed_params.append(float(report.seed_params))
            stats.train_flops.append(report.train_flops)
            rollout.returns[k], rollout.decisions[k] = 0.0, 0

    # --- update -------------------------------------------------------------------------------
    def _update(self, learner: Learner, rollout: _Rollout, round_index: int) -> None:
        tick = time.perf_counter()
        learner.obs_rms.unfreeze()
        all_reduce = self.ranks.all_reduce_hook()  # the identity on one process
        learner.obs_rms.update(torch.cat(rollout.raw_features), all_reduce)
        learner.obs_rms.freeze()
        shuffle = torch.Generator().manual_seed(minibatch_rng_seed(self.config.rng_seed,
                                                                   round_index))
        rollout.stats.ppo = ppo_update(
            learner.policy, learner.optimizer, rollout.buffer, self.ppo_config,
            learner.value_normalizer, learner.reward_normalizer, all_reduce,
            rank=self.ranks.rank, world_size=self.ranks.world_size, generator=shuffle)
        rollout.stats.update_seconds = time.perf_counter() - tick
