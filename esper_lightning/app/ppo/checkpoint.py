"""Checkpoints of a PPO run and the random-number state that makes resuming exact.

A run is seeded once with Lightning's `seed_everything` (the initial policy comes from torch's
global generator). Every later draw comes from a stream keyed by the root seed and the round
(the policy's action sampling per env, the PPO minibatch partition, the envs' episodes), and
every checkpoint also stores the torch CPU and CUDA states, so a resumed run draws exactly the
numbers the uninterrupted run would have drawn.
The policy part of the checkpoint (what `PolicyController` needs) is defined in
`esper_lightning.rl.checkpoint`; this module adds the trainer's own state around it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from lightning.fabric.utilities.seed import seed_everything

from esper_lightning.app.config import PPORunConfig, compatibility_errors, config_differences
from esper_lightning.app.ppo.learner import Learner
from esper_lightning.errors import ConfigError
from esper_lightning.rl.checkpoint import (
    load_policy_weights,
    policy_entries,
    read_checkpoint,
    write_checkpoint,
)

log = logging.getLogger(__name__)


def seed_run(rng_seed: int) -> None:
    """Seed the global generators (Python, NumPy, torch CPU and CUDA) at the start of a run."""
    seed_everything(rng_seed, verbose=False)


def save_trainer(learner: Learner, round_index: int, path: str | os.PathLike[str],
                 run: PPORunConfig) -> None:
    """Write one policy's full training state atomically (`rl.checkpoint.write_checkpoint`):
    the policy's own configuration (``config``: what it was trained with), the whole run's
    (``run_config``: what ``--resume`` alone continues with, every A/B policy included) and
    what training it has cost (``training_cost``: rounds, episodes, their training FLOPs and
    the rounds' wall time, over every run that resumed it) and the command lines of those runs
    (``commands``)."""
    c = learner.config
    logger = learner.logger
    state = {
        "round": round_index,
        "config": c.to_dict(),
        "run_config": run.to_dict(),
        **policy_entries(learner.policy, learner.obs_rms, c.slots, c.episode_length,
                         c.heads == "compact", c.blueprints),
        "optimizer": learner.optimizer.state_dict(),
        "reward_normalizer": learner.reward_normalizer.state_dict(),
        "value_normalizer": learner.value_normalizer.state_dict(),
        # The TensorBoard version folder, so a resumed run continues the same run's charts.
        "log_version": None if logger is None else logger.version,
        "rng": rng_states(),
        "training_cost": dict(learner.cost),
        "commands": [list(c) for c in learner.commands],
    }
    write_checkpoint(state, path)


def load_trainer(learner: Learner, path: str | os.PathLike[str]) -> int:
    """Restore ``learner`` from a checkpoint of a compatible run (else `ConfigError`, also for a
    shipped policy, which has no training state, and for a run that already trained the rounds
    asked for); returns the round to continue from. The resumed run logs into the same
    TensorBoard version."""
    state = read_checkpoint(path)
    if "optimizer" not in state:  # a shipped policy: weights and normalisers, no training state
        raise ConfigError(f"checkpoint '{path}' holds a policy without its training state (a "
                          "shipped policy); start a new run from it with --init_policy")
    done, rounds = int(state["round"]), learner.config.rounds
    if done >= rounds:  # nothing would train: say so instead of exiting 0
        raise ConfigError(f"checkpoint '{path}' has trained {done} rounds already; pass "
                          f"--rounds N with N > {done} to continue it (got {rounds})")
    errors = compatibility_errors(state["config"], learner.config) + _resume_errors(
        state["config"], learner.config)
    if errors:
        raise ConfigError(
            f"checkpoint '{path}' comes from an incompatible config: {'; '.join(errors)}"
        )
    changed = config_differences(state["config"], learner.config)
    log.info("resuming '%s' after round %d with %s", path, state["round"],
             f"these changes: {', '.join(changed)}" if changed else "its configuration")
    load_policy_weights(learner.policy, state, f"checkpoint '{path}'")
    learner.optimizer.load_state_dict(state["optimizer"])
    # The loaded state carries the saved run's lr; the flags given override the checkpoint
    # (`PPORunConfig.resume`), so a new --learning_rate applies from the next update on.
    for group in learner.optimizer.param_groups:
        group["lr"] = learner.config.learning_rate
    learner.obs_rms.load_state_dict(state["obs_rms"])
    learner.reward_normalizer.load_state_dict(state["reward_normalizer"])
    learner.value_normalizer.load_state_dict(state["value_normalizer"])
    learner.log_version = state.get("log_version")  # absent in older checkpoints: a new one
    if "training_cost" in state:  # absent before it was recorded: counted from here on
        learner.cost.update(state["training_cost"])
    learner.commands[:0] = state.get("commands", [])  # the earlier runs' before this one's
    set_rng_states(state["rng"])
    return int(state["round"])


#: Settings a resumed run keeps besides `COMPATIBILITY_KEYS`: the reward normaliser's return
#: statistics are discounted with ``gamma`` (`rl.normalizers.RewardNormalizer`), so another
#: gamma cannot continue them.
RESUME_KEYS = ("gamma",)


def _resume_errors(saved: dict[str, Any], config: PPORunConfig) -> list[str]:
    """The `RESUME_KEYS` whose saved value differs from ``config`` (absent: not checked)."""
    now = config.to_dict()
    return [f"{key}={saved[key]!r} (now {now[key]!r})" for key in RESUME_KEYS
            if key in saved and saved[key] != now[key]]


#: What a policy must share with the run it starts (`start_from`): its observations, its heads.
_INIT_KEYS = ("task", "slots", "policy_hidden", "heads")


def start_from(config: PPORunConfig, policy: Any, obs_rms: Any) -> dict[str, Any]:
    """Start ``policy`` and ``obs_rms`` from the checkpoint ``config.init_policy`` (a
    curriculum: the blueprints it allows may differ). Refused in one line when the checkpoint
    was trained with another task, slots, policy width or action heads.

    Returns:
        What making the starting policy cost and the commands that made it (its
        ``training_cost``, empty when it predates the record, and ``commands``): the new run
        counts them as its own, so a curriculum's cost is the cost of all its stages.
    """
    path = str(config.init_policy)
    state = read_checkpoint(path)
    saved = {**state.get("config", {})}
    now = config.to_dict()
    differ = [f"{key}={saved.get(key)!r} (this run: {now[key]!r})" for key in _INIT_KEYS
              if saved.get(key) != now[key]]
    if differ:
        raise ConfigError(f"init_policy '{path}' was trained with {', '.join(differ)}; a run "
                          f"starts only from a policy of its own {', '.join(_INIT_KEYS)}")
    load_policy_weights(policy, state, f"init_policy '{path}'")
    if config.new_blueprint_share is not None:
        _blueprint_prior(config, policy, saved.get("blueprints"), path)
    obs_rms.load_state_dict(state["obs_rms"])
    log.info("the policy starts from '%s' (round %d of its run, trained with blueprints %s)",
             path, state.get("round", 0), saved.get("blueprints") or "all")
    return {"training_cost": dict(state.get("training_cost", {})),
            "commands": [list(c) for c in state.get("commands", [])]}


def _blueprint_prior(config: PPORunConfig, policy: Any, trained: Sequence[str] | None,
                     path: str) -> None:
    """Give the blueprints this run allows beyond ``trained`` (those the starting policy could
    choose) the probability ``config.new_blueprint_share`` together at a germination."""
    from esper_lightning.app.task import germinable_blueprints

    allowed = germinable_blueprints(config)
    new = [b for b in allowed if trained is not None and b not in trained]
    old = [b for b in allowed if b not in new]
    if not new or not old:
        raise ConfigError(f"new_blueprint_share: init_policy '{path}' was trained with "
                          f"blueprints {list(trained) if trained else 'all'} and this run allows "
                          f"{list(allowed)}, so no blueprint is new to it; accepted: a policy "
                          "trained on fewer blueprints, or new_blueprint_share null")
    policy.set_blueprint_prior(old, new, float(config.new_blueprint_share))


def rng_states() -> dict[str, Any]:
    """The torch generators' states (CPU, and each CUDA device when present)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(state: dict[str, Any]) -> None:
    """Restore what `rng_states` captured."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        # A machine with fewer GPUs than the one that saved: the devices it has.
        for index, cuda in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda, index)
