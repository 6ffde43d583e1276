"""The runs' presets (``--preset``): named sets of values a configuration starts from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from esper_lightning.app.config.checks import check_choice
from esper_lightning.app.config.layers import ConfigT, from_mapping, read_config_file
from esper_lightning.app.config.ppo import PPORunConfig
from esper_lightning.app.config.task import TaskConfig

PRESETS: dict[str, dict[str, Any]] = {
    # Seconds-to-minutes on 2 CPU cores: proves the loop end to end, learns nothing.
    "smoke": {
        "envs": 2, "rounds": 2, "episode_length": 4, "train_subset": 512, "val_subset": 256,
        "batch_size": 64, "slots": ("r0c1", "r0c2"), "min_training_epochs": 1,
        "policy_hidden": 32, "ppo_epochs": 2, "minibatch_envs": 1,
    },
    # Learning on the CIFAR-10 subset in under an hour on 2 CPU cores (sized from measurements,
    # docs/evidence.md): cheap epochs (1,000 training / 500 validation images), 16 episodes per
    # update, the compact action space, a larger step guarded by the whole-batch KL stop.
    "cpu": {
        "envs": 16, "rounds": 36, "episode_length": 12, "batch_size": 128,
        "train_subset": 1000, "val_subset": 500, "slots": ("r0c1", "r0c2"),
        "min_training_epochs": 2, "policy_hidden": 64, "heads": "compact",
        "learning_rate": 1e-3, "target_kl": 0.02, "ppo_epochs": 4, "minibatch_envs": 4,
    },
    # Full CIFAR-10 on one GPU. Not measured (no GPU was available): 32 envs in lockstep on
    # one device, bf16, longer episodes and the default incubation.
    "gpu": {
        "envs": 32, "rounds": 200, "episode_length": 30, "batch_size": 256,
        "slots": ("r0c0", "r0c1", "r0c2"), "min_training_epochs": 5, "device": "cuda",
        "precision": "bf16-mixed", "policy_hidden": 128, "minibatch_envs": 8,
        "learning_rate": 5e-4,
    },
    # The language-model task in seconds on 2 CPU cores (tiny GPT, 32-token blocks).
    "lm-smoke": {
        "task": "lm", "envs": 2, "rounds": 2, "episode_length": 4, "train_subset": 64,
        "val_subset": 16, "batch_size": 16, "block_size": 32, "slots": ("r0c0", "r0c1"),
        "min_training_epochs": 1, "policy_hidden": 32, "ppo_epochs": 2, "minibatch_envs": 1,
    },
    # The language-model task sized for a CPU: an episode of the tiny GPT on 1,280 random
    # 64-byte blocks per epoch is about a minute on one thread (docs/evidence.md).
    "lm-cpu": {
        "task": "lm", "envs": 4, "rounds": 20, "episode_length": 20, "train_subset": 1280,
        "val_subset": 256, "batch_size": 32, "block_size": 64, "slots": ("r0c0", "r0c1"),
        "min_training_epochs": 2, "policy_hidden": 64, "ppo_epochs": 4, "minibatch_envs": 2,
    },
    # Growth at equal compute (sized by a pilot on Shakespeare, docs/evidence.md): a one-block
    # GPT of width 32 (4 heads, 32-byte blocks, batch 32) whose growth slot r1c0 deepens it to
    # four blocks in one decision (host grow4; static = S1, born:4 = S4), against a budget of
    # 6,000 training steps of the four-block host (6,000 x 402,653,184 FLOPs, about 17,500
    # steps of the one-block host), spent in 20 equal slices; WSD schedule (3 % warmup, linear
    # decay to 0 over the last 20 %); 8e-3 is the one-block host's tuned learning rate
    # (--arm_lr sets another per arm). Validation: the first 1,024 blocks (32 KB) of the
    # held-out tail.
    "lm-grow": {
        "task": "lm", "host_preset": "grow4", "slots": ("r1c0",), "block_size": 32,
        "batch_size": 32, "val_subset": 1024, "episode_length": 20, "host_lr": 8e-3,
        "budget_flops": 6000 * 402_653_184.0,  # FlopMeter: w32l4, batch 32, 32 tokens
        "lr_schedule": "wsd", "warmup_fraction": 0.03,
        "decay_fraction": 0.2, "min_training_epochs": 2, "envs": 4, "rounds": 20,
        "policy_hidden": 64, "ppo_epochs": 4, "minibatch_envs": 2,
    },
    # Learning *when* to grow, on 2 CPU cores (sized by a pilot, docs/evidence.md): the one-block
    # GPT of lm-grow growing to two blocks (host grow2), against budgets that vary by episode,
    # 0.5, 1 or 2 x 2,000 steps of the two-block host (2,000 x 226,492,416 FLOPs). In the pilot
    # the best growth time moves with the budget (at 0.5: late or never; at 2: early), so a
    # fixed schedule cannot be right at every budget and a policy that reads the budget can.
    # Ten slices per episode (a decision every tenth of the budget); the terminal reward pays
    # the final validation loss (outcome bits), with no parameter price: the budget already
    # charges the grown block its FLOPs. 16 episodes per update, about 35 s each on one thread.
    "lm-grow-cpu": {
        "task": "lm", "host_preset": "grow2", "slots": ("r1c0",), "block_size": 32,
        "batch_size": 32, "val_subset": 256, "episode_length": 10, "host_lr": 4e-3,
        "budget_flops": 2000 * 226_492_416.0,  # FlopMeter: w32l2, batch 32, 32 tokens
        "budget_scales": (0.5, 1.0, 2.0), "lr_schedule": "wsd", "warmup_fraction": 0.03,
        "decay_fraction": 0.2, "min_training_epochs": 1, "param_cost": 0.0, "outcome": "bits",
        "envs": 16, "rounds": 12, "policy_hidden": 64, "heads": "compact",
        "learning_rate": 1e-3, "target_kl": 0.02, "ppo_epochs": 4, "minibatch_envs": 4,
    },
    # Several growth decisions under budgets no episode shares (issue: a learned controller
    # on unseen budgets): the one-block GPT of width 32 growing to two blocks in r1c0 and to
    # four in r1c1 (host grow124), each episode's budget drawn log-uniformly from 0.25-4 x
    # 1,500 steps of the four-block host (1,500 x 402,653,184 FLOPs: 0.125-2 x the frontier's
    # base budget), a decision every twentieth of the budget, WSD, the final loss as the
    # terminal reward. compare evaluates it at --budget_scales (it groups episodes by budget).
    "lm-grow124-cpu": {
        "task": "lm", "host_preset": "grow124", "slots": ("r1c0", "r1c1"), "block_size": 32,
        "batch_size": 32, "val_subset": 256, "episode_length": 20, "host_lr": 4e-3,
        "budget_flops": 1500 * 402_653_184.0,  # FlopMeter: w32l4, batch 32, 32 tokens
        "budget_range": (0.25, 4.0), "lr_schedule": "wsd", "warmup_fraction": 0.03,
        "decay_fraction": 0.2, "min_training_epochs": 1, "param_cost": 0.0, "outcome": "bits",
        "envs": 16, "rounds": 20, "policy_hidden": 64, "heads": "compact",
        "learning_rate": 1e-3, "target_kl": 0.02, "ppo_epochs": 4, "minibatch_envs": 4,
    },
}


def preset_values(preset: str, cls: type[TaskConfig] = PPORunConfig) -> dict[str, Any]:
    """The values a preset sets that ``cls`` has (a compare uses a PPO preset's task part)."""
    check_choice("preset", preset, tuple(PRESETS))
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in PRESETS[preset].items() if k in known}


def load_config(
    preset: str | None = None,
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    cls: type[ConfigT] = PPORunConfig,  # type: ignore[assignment]
) -> ConfigT:
    """Defaults, then preset, then file, then overrides; each layer strict."""
    config = cls()
    if preset is not None:
        config = from_mapping(preset_values(preset, cls), config)
    if path is not None:
        config = from_mapping(read_config_file(path), config)
    return from_mapping(overrides or {}, config)
