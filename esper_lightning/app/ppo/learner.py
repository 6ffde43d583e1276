"""`Learner`: one policy being learned by the PPO trainer and everything that belongs to it.

Its own module, so that the trainer, which drives learners, and the checkpoints, which save and
restore them (`app.ppo.checkpoint`), both import it and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from lightning.pytorch.loggers import TensorBoardLogger

from esper_lightning.app.config import PPORunConfig
from esper_lightning.app.ppo.metrics import RoundStats
from esper_lightning.rl.normalizers import RewardNormalizer, RunningMeanStd, ValueNormalizer
from esper_lightning.rl.policy import FactoredRecurrentActorCritic
from esper_lightning.rl.rewards import RewardConfig


@dataclass
class Learner:
    """One policy being learned and everything that belongs to it.

    With ``ab`` set the trainer holds one per reward mode; otherwise exactly one.
    """

    config: PPORunConfig  # the run as this policy sees it (its reward mode, its envs)
    envs: list[int]  # pool indices of the envs it acts for
    policy: FactoredRecurrentActorCritic
    optimizer: torch.optim.Optimizer
    obs_rms: RunningMeanStd
    reward_normalizer: RewardNormalizer
    value_normalizer: ValueNormalizer
    reward_config: RewardConfig
    logger_name: str
    log_version: int | str | None = None  # TensorBoard version (None: the next free one)
    logger: TensorBoardLogger | None = None
    history: list[RoundStats] = field(default_factory=list)
    #: What training it has cost so far, every round of every run that resumed it (and of the
    #: policy it started from, ``init_policy``): episodes
    #: played, their training FLOPs, the wall time of its rounds (a lookup's tuning cost is
    #: set against it: `esper_lightning.app.compare.lookup`).
    cost: dict[str, float] = field(default_factory=lambda: {
        "rounds": 0, "episodes": 0, "train_flops": 0.0, "wall_seconds": 0.0})
    #: The command lines of the runs that trained it, first to last (a resumed run adds its
    #: own): what reproduces a shipped policy.
    commands: list[list[str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.config.reward
