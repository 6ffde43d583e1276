"""Checkpoints of a PPO run and the random-number state that makes resuming exact.

A run is seeded once with Lightning's `seed_everything`. The only global generators the run
draws from are torch's (the policy's action sampling and the PPO minibatch shuffle; envs and
loaders use their own seeded generators), so every checkpoint stores the torch CPU and CUDA
states, and a resumed run draws exactly the numbers the uninterrupted run would have drawn.
The policy part of the checkpoint (what `PolicyController` needs) is defined in
`esper_lightning.rl.checkpoint`; this module adds the trainer's own state around it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.seed import seed_everything

from esper_lightning.app.config import compatibility_errors
from esper_lightning.errors import ConfigError
from esper_lightning.rl.checkpoint import policy_entries, read_checkpoint, write_checkpoint

if TYPE_CHECKING:
    from esper_lightning.app.trainer import PPOTrainer


def seed_run(rng_seed: int) -> None:
    """Seed the global generators (Python, NumPy, torch CPU and CUDA) at the start of a run."""
    seed_everything(rng_seed, verbose=False)


def save_trainer(trainer: PPOTrainer, path: str | os.PathLike[str]) -> None:
    """Write the trainer's full state atomically (see `rl.checkpoint.write_checkpoint`)."""
    c = trainer.config
    state = {
        "round": trainer.round,
        "config": c.to_dict(),
        **policy_entries(trainer.policy, trainer.obs_rms, c.slots, c.episode_length),
        "optimizer": trainer.optimizer.state_dict(),
        "reward_normalizer": trainer.reward_normalizer.state_dict(),
        "value_normalizer": trainer.value_normalizer.state_dict(),
        "rng": rng_states(),
        # The TensorBoard version folder, so a resumed run continues the same run's charts.
        "log_version": trainer.logger.version,
    }
    write_checkpoint(state, path)


def load_trainer(trainer: PPOTrainer, path: str | os.PathLike[str]) -> None:
    """Restore ``trainer`` from a checkpoint of a compatible run (else `ConfigError`)."""
    state = read_checkpoint(path)
    errors = compatibility_errors(state["config"], trainer.config)
    if errors:
        raise ConfigError(
            f"checkpoint '{path}' comes from an incompatible config: {'; '.join(errors)}"
        )
    trainer.policy.load_state_dict(state["policy"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.obs_rms.load_state_dict(state["obs_rms"])
    trainer.reward_normalizer.load_state_dict(state["reward_normalizer"])
    trainer.value_normalizer.load_state_dict(state["value_normalizer"])
    set_rng_states(state["rng"])
    trainer.round = int(state["round"])
    trainer.log_version = state.get("log_version")  # absent in older checkpoints: a new one


def rng_states() -> dict[str, Any]:
    """The torch generators' states (CPU, and each CUDA device when present)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(state: dict[str, Any]) -> None:
    """Restore what `rng_states` captured."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
