"""The policy inside a PPO checkpoint: what a training run writes and `PolicyController` reads.

A checkpoint is a plain dict saved with `torch.save` and read with ``weights_only=True``. The
training application adds its own entries (optimizer, normalisers of rewards and values, RNG
states, round, full config); this module owns the entries needed to *act*: the policy weights,
its sizes, the observation normaliser, the slot ids it was trained for and the horizon its
observations were scaled with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_lightning.errors import ConfigError
from esper_lightning.rl.normalizers import RunningMeanStd
from esper_lightning.rl.observations import obs_dim
from esper_lightning.rl.policy import FactoredRecurrentActorCritic, PolicyConfig

CHECKPOINT_VERSION = 1


@dataclass
class PolicyBundle:
    """Everything needed to act like the trained policy.

    Attributes:
        policy: the actor-critic in eval mode.
        obs_rms: the frozen observation normaliser of the run.
        slot_ids: slots the policy was trained for, in action order.
        horizon: episode length its observations were scaled with.
        compact: trained on the compact action space (op, slot, blueprint).
    """

    policy: FactoredRecurrentActorCritic
    obs_rms: RunningMeanStd
    slot_ids: tuple[str, ...]
    horizon: int
    compact: bool = False


def policy_entries(
    policy: FactoredRecurrentActorCritic,
    obs_rms: RunningMeanStd,
    slot_ids: tuple[str, ...],
    horizon: int,
    compact: bool = False,
) -> dict[str, Any]:
    """The checkpoint entries `load_policy` reads back."""
    return {
        "policy": policy.state_dict(),
        "policy_hidden": policy.config.hidden_dim,
        "obs_rms": obs_rms.state_dict(),
        "slot_ids": list(slot_ids),
        "horizon": int(horizon),
        "compact": bool(compact),
    }


def load_policy(state: dict[str, Any]) -> PolicyBundle:
    """Rebuild the policy and its observation normaliser from a read checkpoint."""
    slot_ids = tuple(state["slot_ids"])
    config = PolicyConfig(n_slots=len(slot_ids), hidden_dim=int(state["policy_hidden"]))
    policy = FactoredRecurrentActorCritic(config)
    policy.load_state_dict(state["policy"])
    policy.eval()
    obs_rms = RunningMeanStd(shape=(obs_dim(len(slot_ids)),))
    obs_rms.load_state_dict(state["obs_rms"])
    obs_rms.freeze()
    return PolicyBundle(policy, obs_rms, slot_ids, int(state["horizon"]), bool(state["compact"]))


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a PPO checkpoint safely (``weights_only=True``); bad files raise `ConfigError`."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint '{path}' does not exist") from None
    except Exception as err:  # unpickling errors of any kind mean "not our checkpoint"
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise ConfigError(f"cannot read checkpoint '{path}': {reason}") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        raise ConfigError(f"'{path}' is not an esper-lightning PPO checkpoint (version "
                          f"{CHECKPOINT_VERSION})")
    return state


def write_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write atomically (temporary file, then rename): a crash mid-write never leaves a
    truncated checkpoint, and the previous one stays intact until the new one is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"version": CHECKPOINT_VERSION, **state}, tmp)
    os.replace(tmp, path)
