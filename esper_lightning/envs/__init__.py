"""RL environments: one Lightning Fabric host per env, driven in lockstep by a pool."""

from esper_lightning.envs.env import EnvSpec, MorphogenesisEnv, Observation
from esper_lightning.envs.pool import EnvPool, episode_rng_seed

__all__ = ["EnvPool", "EnvSpec", "MorphogenesisEnv", "Observation", "episode_rng_seed"]
