"""From a `TaskConfig` to what the env pool needs: the task, the shared env settings, the data."""

from __future__ import annotations

import math
from typing import Any

import torch

from esper_lightning.app.config.task import TaskConfig, smallest_budget_scale
from esper_lightning.core.divergence import GovernorConfig
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.envs import EnvSpec, smallest_budget_flops
from esper_lightning.envs.task_specs import task_class
from esper_lightning.envs.tasks import Task
from esper_lightning.errors import ConfigError
from esper_lightning.rl.rewards import RewardConfig, RewardMode
from esper_lightning.schedule import LRSchedule


def make_task(task: TaskConfig) -> Task:
    """The `Task` registered as ``task.task`` (`envs.task_specs.task_class`), with the run's
    data settings (`Task.configured`: CIFAR subsets, or the language model's block size,
    training blocks per epoch and validation blocks).

    Raises:
        ValueError: a name no task is registered under (one line naming those that are).
    """
    return task_class(task.task).configured(
        host_preset=str(task.host_preset), train_subset=task.train_subset,
        val_subset=task.val_subset, block_size=task.block_size)


def env_spec(task: TaskConfig) -> EnvSpec:
    """The settings every env of the task's pool shares (the budget in FLOPs: `budget_flops`).

    Raises:
        ConfigError: a budget whose slice per epoch is smaller than one training batch of the
            static host.
    """
    played = make_task(task)
    schedule = LRSchedule(task.lr_schedule, task.warmup_fraction, task.decay_fraction,
                          task.min_lr_ratio)
    allowed_blueprints(task)  # the names checked against the task's slots, in one line
    return EnvSpec(
        host_preset=task.host_preset, slots=task.slots, batch_size=task.batch_size,
        host_lr=task.host_lr, precision=task.precision, episode_length=task.episode_length,
        seeding=seeding_config(task), governor=GovernorConfig(num_classes=played.num_classes),
        task=played, budget_flops=budget_flops(task), lr_schedule=schedule,
        budget_scales=task.budget_scales, budget_range=task.budget_range,
        reward=reward_config(task),
    )


def seeding_config(task: TaskConfig) -> SeedingConfig:
    """How seeds grow in the task's envs (`core.seeding.SeedingConfig`, which checks it): the
    task's ``blueprints``, ``max_seeds``, ``blend_gradient``, ``layer_scale_init`` and
    ``min_training_epochs`` as G2's threshold, the rest at its defaults. Here, not on
    `TaskConfig`: the core imports torch, and the parse must not."""
    return SeedingConfig(
        blueprints=task.blueprints, max_seeds=task.max_seeds,
        gate_config=GateConfig(min_training_epochs=task.min_training_epochs),
        blend_gradient=task.blend_gradient, layer_scale_init=task.layer_scale_init)


def reward_config(task: TaskConfig, mode: str | None = None) -> RewardConfig:
    """What a step of the task's envs rewards (`rl.rewards`): the configured reward mode (or
    ``mode``, a policy's of an A/B run), discount, parameter cost and outcome."""
    return RewardConfig(mode=RewardMode(mode or task.reward), gamma=task.gamma,
                        param_cost=task.param_cost, outcome=task.outcome)


def allowed_blueprints(task: TaskConfig) -> tuple[str, ...] | None:
    """The blueprints a controller may germinate: ``task.blueprints`` (null: every blueprint
    of the task's slots, None).

    Raises:
        ConfigError: a name that is no blueprint of the task's slots (one line with those that
            are).
    """
    if task.blueprints is None:
        return None
    accepted = make_task(task).blueprints()
    for name in task.blueprints:
        if name not in accepted:
            raise ConfigError(f"unknown blueprint {name!r} for the slots of task {task.task!r}; "
                              f"accepted: {', '.join(accepted)}")
    return task.blueprints


def germinable_blueprints(task: TaskConfig) -> tuple[str, ...]:
    """Every blueprint a controller may germinate, by name: `allowed_blueprints`, or (null)
    every blueprint of the task's slots."""
    return allowed_blueprints(task) or tuple(make_task(task).blueprints())


def static_step_flops(task: TaskConfig) -> int:
    """Training FLOPs of one batch of the static host: ``host_preset`` with no seed, at
    ``batch_size`` (measured on meta tensors; the host is drawn from a forked generator, so
    nothing else's random numbers change)."""
    played = make_task(task)
    with torch.random.fork_rng(devices=[]):
        host = played.make_host(str(task.host_preset), task.slots or (), float(task.host_lr or 0))
    return FlopMeter().training_step(host, played.example_batch(task.batch_size))


def budget_flops(task: TaskConfig) -> float | None:
    """The episode budget in FLOPs: ``budget_flops``, or ``budget_steps`` static-host steps
    (`static_step_flops`); None without a budget. With ``budget_scales`` it is the base budget
    that each episode's scale multiplies.

    Raises:
        ConfigError: a budget that gives an epoch less than one batch of the static host, at
            the smallest scale (one line with the smallest budget accepted).
    """
    if not task.budgeted:
        return None
    step = static_step_flops(task)
    budget = task.budget_flops if task.budget_flops is not None else step * task.budget_steps
    epochs, scale = task.episode_length, smallest_budget_scale(task)
    least = smallest_budget_flops(step, epochs)
    if budget * scale < least:
        given = (f"budget_flops={budget:g}" if task.budget_flops is not None
                 else f"budget_steps={task.budget_steps}")
        if task.budget_scales is not None or task.budget_range is not None:
            given += f" at its smallest scale {scale:g}"
        raise ConfigError(f"{given} gives each of the episode's {epochs} epochs less than one "
                          f"training batch of the static host ({step:,} FLOPs); accepted: at "
                          f"least {math.ceil(least / scale)} FLOPs (budget_steps >= "
                          f"{math.ceil(epochs / scale)})")
    return float(budget)


def load_splits(task: TaskConfig, progress: bool = True) -> tuple[Any, Any]:
    """The task's training and validation data (downloaded first when asked to).

    Raises:
        DataError: training data of which an epoch holds no batch (`Task.check_train_split`:
            a loader drops its last short batch, so the run would train on none).
    """
    played = make_task(task)
    train, val = played.load(task.data_dir, download=task.download, progress=progress,
                             rng_seed=task.rng_seed)
    played.check_train_split(train, task.batch_size)
    return train, val
