"""`PPORunConfig`: a run that learns the lifecycle controller (``esper-lightning ppo``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from esper_lightning.app.config.checks import (
    check_choice,
    check_device,
    check_positive,
    check_range,
)
from esper_lightning.app.config.choices import REWARD_MODES, STRATEGIES, StrategyName
from esper_lightning.app.config.task import TaskConfig
from esper_lightning.errors import ConfigError


@dataclass(frozen=True)
class PPORunConfig(TaskConfig):
    """A run that learns the lifecycle controller with PPO (``esper-lightning ppo``).

    Args:
        envs: parallel environments (host models) per round.
        rounds: PPO rounds; each is ``envs`` episodes of ``episode_length`` epochs + 1 update.
        logdir: TensorBoard root (Lightning layout: ``<logdir>/ppo/version_N``).
        save: checkpoint path written atomically after every round (null: no checkpoint). A
            run refuses a path that already holds a file unless it resumes from that file or
            ``overwrite`` is set.
        resume: checkpoint to continue from (the same TensorBoard run continues). On the
            command line the run takes the checkpoint's configuration; flags given override it.
        overwrite: let a run replace the file at ``save`` that it did not resume from.
        init_policy: a PPO checkpoint, or a policy shipped from one (``esper-lightning
            ship``), whose policy weights and observation normaliser the new policy starts
            from (a curriculum: a policy trained with blueprints [block_identity] starting a
            run that allows every blueprint); its slots, policy_hidden and heads must be this
            run's. The policy optimizer, the reward and value normalisers and the rounds
            start afresh. A resumed run takes its weights from the resumed checkpoint.
        new_blueprint_share: with ``init_policy`` trained on fewer blueprints than this run
            allows, the probability the blueprints it could not choose start with together (an
            action prior, set on the blueprint head's bias; the rest stays on those it was
            trained with). Its blueprint head never learned (a single allowed blueprint gets
            no gradient), so without it (null) a germination picks among all of them near
            uniformly from the first round.
        policy_hidden: width of the policy's feature MLP and LSTM.
        learning_rate: Adam step size of the policy.
        ppo_epochs: passes over each round's rollout.
        minibatch_envs: env sequences per PPO minibatch; it divides envs (with ab: each
            policy's envs).
        gae_lambda: GAE lambda.
        target_kl: stop a PPO update after an epoch whose KL on the whole batch exceeds this.
        heads: action space the policy learns: full (all eight heads) or compact (op, slot and
            blueprint; the other heads keep their defaults).
        ab: reward modes to train side by side, one policy each, in one pool (the envs split
            evenly, the same episode seeds in every group); empty: one policy on ``reward``.
        progress: show a progress bar.
        strategy: auto (one process) or data-parallel processes with one env pool each (DD-PPO,
            docs/scaling.md): ddp (Fabric starts ``devices`` processes per node, or joins the
            ones torchrun or SLURM started), ddp_spawn or ddp_fork (processes started from
            this one, on one node). ``envs`` and ``minibatch_envs`` count every process's envs.
        num_nodes: machines of a ddp run.
    """

    envs: int = 4
    rounds: int = 20
    logdir: str = "runs"
    save: str | None = None
    resume: str | None = None
    overwrite: bool = False
    init_policy: str | None = None
    new_blueprint_share: float | None = None
    policy_hidden: int = 128
    learning_rate: float = 3e-4
    ppo_epochs: int = 4
    minibatch_envs: int = 2
    gae_lambda: float = 0.95
    target_kl: float = 0.02
    heads: Literal["full", "compact"] = "full"
    ab: tuple[str, ...] = ()
    progress: bool = True
    strategy: StrategyName = "auto"
    num_nodes: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, ("envs", "rounds", "policy_hidden", "ppo_epochs", "minibatch_envs"))
        check_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
        for name in ("learning_rate", "target_kl"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        check_choice("heads", self.heads, ("full", "compact"))
        if self.new_blueprint_share is not None:
            if not 0.0 < self.new_blueprint_share < 1.0:
                raise ConfigError(f"new_blueprint_share must be in (0, 1), got "
                                  f"{self.new_blueprint_share}")
            if self.init_policy is None:  # a resumed curriculum keeps its init_policy
                raise ConfigError("new_blueprint_share sets the prior of a policy started from "
                                  "init_policy; accepted: with init_policy, or null")
        for mode in self.ab:
            check_choice("ab reward", mode, REWARD_MODES)
        if len(set(self.ab)) != len(self.ab) or len(self.ab) == 1:
            raise ConfigError(f"ab needs two or more different reward modes, got {list(self.ab)}")
        if self.ab and self.envs % len(self.ab):
            raise ConfigError(f"envs={self.envs} does not split evenly into {len(self.ab)} "
                              f"groups for ab={list(self.ab)}")
        self._check_processes()
        self._check_minibatches()

    def _check_devices(self) -> None:
        check_choice("strategy", self.strategy, STRATEGIES)
        counts = [d for d in self.devices if d.isdigit()]
        if self.strategy == "auto":
            if counts:
                raise ConfigError(f"devices={list(self.devices)} is a process count, which needs "
                                  f"--strategy ddp; with strategy auto list one device per env "
                                  f"(cpu, cuda, cuda:N)")
            super()._check_devices()
            return
        check_device(self.device)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"with strategy {self.strategy}, device is cpu or cuda (each "
                              f"process takes cuda:<local rank>), got {self.device!r}")
        if len(self.devices) > 1 or len(counts) != len(self.devices) or "0" in counts:
            raise ConfigError(f"with strategy {self.strategy}, devices is the number of "
                              f"processes per node (one device each), e.g. --devices 2; got "
                              f"{list(self.devices)}")

    def _check_processes(self) -> None:
        check_positive(self, ("num_nodes",))
        if self.num_nodes > 1 and self.strategy != "ddp":
            raise ConfigError(f"num_nodes={self.num_nodes} needs strategy ddp (torchrun or SLURM "
                              f"start the processes of every node), got {self.strategy}")
        if self.strategy == "auto":
            return
        if self.ab:
            raise ConfigError(f"ab={list(self.ab)} cannot be combined with strategy "
                              f"{self.strategy}; run one ddp run per reward mode")
        world = self.world_size
        if self.envs % world:
            raise ConfigError(f"envs={self.envs} does not split evenly over {world} processes "
                              f"(devices x num_nodes); use a multiple of {world}")

    def _check_minibatches(self) -> None:
        """A minibatch is a whole number of each policy's env sequences, and every minibatch of
        an epoch has as many (a smaller last one would weigh its steps more)."""
        envs = self.envs // len(self.reward_modes)
        if envs % self.minibatch_envs == 0:
            return
        whose = f"envs={envs}" if not self.ab else (
            f"the {envs} envs of each policy (envs={self.envs}, ab={list(self.ab)})")
        divisors = ", ".join(str(d) for d in range(1, envs + 1) if envs % d == 0)
        raise ConfigError(f"minibatch_envs={self.minibatch_envs} does not divide {whose}; "
                          f"accepted: {divisors}")

    @property
    def world_size(self) -> int:
        """Processes of the run: ``devices`` (a count) times ``num_nodes`` under ddp, else 1."""
        if self.strategy == "auto":
            return 1
        return (int(self.devices[0]) if self.devices else 1) * self.num_nodes

    @property
    def reward_modes(self) -> tuple[str, ...]:
        """One policy is learned per mode: ``ab``, or just ``reward``."""
        return self.ab or (self.reward,)

    def learner_config(self, mode: str) -> PPORunConfig:
        """What one policy of an A/B run was trained with: its reward mode and its share of the
        envs (so its checkpoint reads like a run of its own)."""
        if not self.ab:
            return self
        return dataclasses.replace(self, reward=mode, envs=self.envs // len(self.ab), ab=())

    @property
    def env_devices(self) -> tuple[str, ...]:
        if self.strategy != "auto":  # each process puts its envs on its own device
            return (self.device,) * self.envs
        return self.devices_for(self.envs)


