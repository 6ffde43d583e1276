"""RL environments: one Lightning Fabric host per env, driven in lockstep by a pool, on one of
the registered tasks (CIFAR-10 images or byte-level text)."""

from esper_lightning.envs.env import (
    EnvSpec,
    MorphogenesisEnv,
    Observation,
    Step,
    draw_budget_in_range,
    draw_budget_scale,
    smallest_budget_flops,
)
from esper_lightning.envs.pool import EnvPool, episode_rng_seed
from esper_lightning.envs.tasks import TASKS, CifarTask, Task, TextTask

__all__ = [
    "TASKS",
    "CifarTask",
    "EnvPool",
    "EnvSpec",
    "MorphogenesisEnv",
    "Observation",
    "Step",
    "Task",
    "TextTask",
    "draw_budget_in_range",
    "draw_budget_scale",
    "episode_rng_seed",
    "smallest_budget_flops",
]
