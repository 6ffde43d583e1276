"""From a `TaskConfig` to what the env pool needs: the shared env settings and the data."""

from __future__ import annotations

from torch import Tensor

from esper_lightning.app.config import TaskConfig
from esper_lightning.core.divergence import GovernorConfig
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.data import download_cifar10, load_cifar10_subset
from esper_lightning.data.cifar10 import cifar10_present
from esper_lightning.envs import EnvSpec

Split = tuple[Tensor, Tensor]


def env_spec(task: TaskConfig, on_rollback: str = "end") -> EnvSpec:
    """The settings every env of the task's pool shares (`EnvSpec.on_rollback` explains the
    two rollback modes: learning ends the episode, evaluating restores and goes on)."""
    return EnvSpec(
        host_preset=task.host_preset, slots=task.slots, batch_size=task.batch_size,
        host_lr=task.host_lr, precision=task.precision, episode_length=task.episode_length,
        max_seeds=task.max_seeds,
        gate_config=GateConfig(min_training_epochs=task.min_training_epochs),
        governor=GovernorConfig(num_classes=10), on_rollback=on_rollback,
    )


def load_splits(task: TaskConfig, progress: bool = True) -> tuple[Split, Split]:
    """The task's training and validation images (downloaded first when asked to)."""
    if task.download and not cifar10_present(task.data_dir):
        download_cifar10(task.data_dir, progress=progress)
    train = load_cifar10_subset(task.data_dir, True, task.train_subset, task.rng_seed,
                                at_most=True)
    val = load_cifar10_subset(task.data_dir, False, task.val_subset, task.rng_seed, at_most=True)
    return train, val
