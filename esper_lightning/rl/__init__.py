"""Reinforcement learning of the lifecycle controller: observations, masks and distributions,
the recurrent factored actor-critic, the rollout buffer with GAE, PPO, rewards and normalisers.

See ``docs/rl.md`` for every feature, mask rule, hyper-parameter, reward formula and metric.
"""

from esper_lightning.rl.buffer import RolloutBuffer, compute_gae
from esper_lightning.rl.checkpoint import (
    PolicyBundle,
    check_blueprints,
    check_observation,
    load_policy,
    load_policy_file,
    load_policy_weights,
    policy_entries,
    read_checkpoint,
    write_checkpoint,
)
from esper_lightning.rl.distributions import (
    RELEVANCE,
    MaskBatch,
    MaskedCategorical,
    fit_blueprint_head,
    stack_masks,
)
from esper_lightning.rl.episodes import StepEnds, decisions_per_episode, is_terminal, step_ends
from esper_lightning.rl.normalizers import RewardNormalizer, RunningMeanStd, ValueNormalizer
from esper_lightning.rl.observations import (
    BASE_DIM,
    OBSERVATION_VERSION,
    SLOT_DIM,
    ObservationBatch,
    batch_observations,
    blueprint_indices,
    build_observation,
    encode_reports,
    obs_dim,
)
from esper_lightning.rl.policy import (
    ActOutput,
    Evaluation,
    FactoredRecurrentActorCritic,
    PolicyConfig,
)
from esper_lightning.rl.ppo import PPOConfig, explained_variance, make_optimizer, ppo_update
from esper_lightning.rl.rewards import (
    RewardBreakdown,
    RewardConfig,
    RewardMode,
    compute_reward,
)

__all__ = [
    "BASE_DIM",
    "OBSERVATION_VERSION",
    "RELEVANCE",
    "SLOT_DIM",
    "ActOutput",
    "Evaluation",
    "FactoredRecurrentActorCritic",
    "MaskBatch",
    "MaskedCategorical",
    "ObservationBatch",
    "PPOConfig",
    "PolicyBundle",
    "PolicyConfig",
    "RewardBreakdown",
    "RewardConfig",
    "RewardMode",
    "RewardNormalizer",
    "RolloutBuffer",
    "RunningMeanStd",
    "StepEnds",
    "ValueNormalizer",
    "batch_observations",
    "blueprint_indices",
    "build_observation",
    "check_blueprints",
    "check_observation",
    "compute_gae",
    "compute_reward",
    "decisions_per_episode",
    "encode_reports",
    "explained_variance",
    "fit_blueprint_head",
    "is_terminal",
    "load_policy",
    "load_policy_file",
    "load_policy_weights",
    "make_optimizer",
    "obs_dim",
    "policy_entries",
    "ppo_update",
    "read_checkpoint",
    "stack_masks",
    "step_ends",
    "write_checkpoint",
]
