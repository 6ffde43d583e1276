"""Where a PPO run saves its checkpoints, and what it must not replace.

Torch-free: ``esper-lightning ppo`` refuses a ``--save`` that would replace an earlier run's
checkpoint before torch and Lightning load (`refuse_overwrite` is the command's check), so the
refusal comes back at once; the trainer checks again for a run started from Python.
"""

from __future__ import annotations

import os
from pathlib import Path

from esper_lightning.app.config import PPORunConfig, TaskConfig, policy_checkpoint
from esper_lightning.errors import ConfigError

__all__ = ["checkpoint_path", "logger_name", "refuse_overwrite"]


def checkpoint_path(path: str | os.PathLike[str], config: PPORunConfig, mode: str) -> Path:
    """Where the policy of reward mode ``mode`` is saved: ``path`` itself, or
    `policy_checkpoint` (``<stem>.<mode><suffix>``) for each policy of an A/B run."""
    return policy_checkpoint(path, mode) if config.ab else Path(path)


def logger_name(config: PPORunConfig, mode: str) -> str:
    """The TensorBoard run (under ``logdir``) of the policy of reward mode ``mode``: ``ppo``, or
    ``ppo-<mode>`` for each policy of an A/B run."""
    return f"ppo-{mode}" if config.ab else "ppo"


def refuse_overwrite(config: TaskConfig) -> None:
    """Refuse (`ConfigError`) a run whose checkpoints would replace files it does not resume
    from, unless ``overwrite`` is set: re-running a command must not destroy what the first run
    made.

    Example:
        >>> import tempfile
        >>> from esper_lightning.app.config import PPORunConfig
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "ckpt.pt").write_bytes(b"an earlier run")
        14
        >>> refuse_overwrite(PPORunConfig(save=str(folder / "ckpt.pt")))
        Traceback (most recent call last):
        ...
        esper_lightning.errors.ConfigError: save '...ckpt.pt' already exists; pass --resume ...
    """
    assert isinstance(config, PPORunConfig)
    if config.save is None:
        return
    for mode in config.reward_modes:  # never writable, --overwrite or not
        if checkpoint_path(config.save, config, mode).is_dir():
            raise ConfigError(f"save '{checkpoint_path(config.save, config, mode)}' is a folder; "
                              f"accepted: a file path such as "
                              f"{Path(config.save) / 'ckpt.pt'}")
    if config.overwrite:
        return
    for mode in config.reward_modes:
        target = checkpoint_path(config.save, config, mode)
        if not target.exists():
            continue
        if config.resume is None:
            raise ConfigError(f"save '{target}' already exists; pass --resume {config.save} to "
                              f"continue that run, --overwrite to replace it, or another --save "
                              f"path")
        source = checkpoint_path(config.resume, config, mode)
        if source.resolve() != target.resolve():
            raise ConfigError(f"save '{target}' already exists and is not the checkpoint this "
                              f"run resumes ('{source}'); pass --overwrite to replace it, or "
                              f"another --save path")
