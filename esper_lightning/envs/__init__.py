"""RL environments: one Lightning Fabric host per env, driven in lockstep by a pool, on one of
the registered tasks (CIFAR-10 images or byte-level text).

The task descriptors (`esper_lightning.envs.task_specs`) are plain data; everything else is
imported on first use (PEP 562), so the command line reads the registered tasks before torch.
"""

from __future__ import annotations

from esper_lightning._lazy import lazy_exports
from esper_lightning.envs.task_specs import (
    TASKS,
    TaskSpec,
    register_task,
    task_class,
    task_names,
    task_spec,
    unregister_task,
)

#: The torch side, resolved lazily from its modules.
_LAZY = {
    **dict.fromkeys(("EnvSpec", "MorphogenesisEnv", "Observation", "Step",
                     "draw_budget_in_range", "draw_budget_scale", "smallest_budget_flops"),
                    "esper_lightning.envs.env"),
    **dict.fromkeys(("EnvPool", "episode_rng_seed"), "esper_lightning.envs.pool"),
    **dict.fromkeys(("CifarTask", "Task", "TextTask"), "esper_lightning.envs.tasks"),
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "TASKS",
    "CifarTask",
    "EnvPool",
    "EnvSpec",
    "MorphogenesisEnv",
    "Observation",
    "Step",
    "Task",
    "TaskSpec",
    "TextTask",
    "draw_budget_in_range",
    "draw_budget_scale",
    "episode_rng_seed",
    "register_task",
    "smallest_budget_flops",
    "task_class",
    "task_names",
    "task_spec",
    "unregister_task",
]
