"""From a `TaskConfig` to what the env pool needs: the task, the shared env settings, the data."""

from __future__ import annotations

from typing import Any

from esper_lightning.app.config import TaskConfig
from esper_lightning.core.divergence import GovernorConfig
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.data import DataError
from esper_lightning.envs import EnvSpec
from esper_lightning.envs.tasks import CifarTask, Task, TextTask
from esper_lightning.hosts import GPT_PRESETS


def make_task(task: TaskConfig) -> Task:
    """The `Task` of ``task.task`` with its data settings: CIFAR subsets, or the language
    model's block size (the GPT preset's when null), training blocks per epoch
    (``train_subset``) and validation blocks (``val_subset``)."""
    if task.task == "lm":
        block_size = task.block_size or GPT_PRESETS[str(task.host_preset)].block_size
        return TextTask(block_size=block_size, train_blocks=task.train_subset,
                        val_blocks=task.val_subset)
    return CifarTask(train_subset=task.train_subset, val_subset=task.val_subset)


def env_spec(task: TaskConfig) -> EnvSpec:
    """The settings every env of the task's pool shares."""
    played = make_task(task)
    return EnvSpec(
        host_preset=task.host_preset, slots=task.slots, batch_size=task.batch_size,
        host_lr=task.host_lr, precision=task.precision, episode_length=task.episode_length,
        max_seeds=task.max_seeds,
        gate_config=GateConfig(min_training_epochs=task.min_training_epochs),
        blend_gradient=task.blend_gradient, layer_scale_init=task.layer_scale_init,
        governor=GovernorConfig(num_classes=played.num_classes), task=played,
    )


def load_splits(task: TaskConfig, progress: bool = True) -> tuple[Any, Any]:
    """The task's training and validation data (downloaded first when asked to).

    Raises:
        DataError: CIFAR training images fewer than one batch (an epoch drops its last short
            batch, so it would train on none; the language model's blocks per epoch are checked
            with the configuration).
    """
    train, val = make_task(task).load(task.data_dir, download=task.download, progress=progress,
                                      rng_seed=task.rng_seed)
    if task.task == "cifar" and len(train[1]) < task.batch_size:
        raise DataError(f"the training split holds {len(train[1])} images (train_subset="
                        f"{task.train_subset}), fewer than batch_size={task.batch_size}: an "
                        f"epoch would train on no batch; lower batch_size or use more images")
    return train, val
