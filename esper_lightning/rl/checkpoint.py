"""The policy inside a PPO checkpoint: what a training run writes and `PolicyController` reads.

A checkpoint is a plain dict saved with `torch.save` and read with ``weights_only=True``. The
training application adds its own entries (optimizer, normalisers of rewards and values, RNG
states, round, full config); this module owns the entries needed to *act*: the policy weights,
its sizes and action space (head sizes, and the blueprint name of each blueprint-head index), the
observation normaliser, the layout of the observations it reads (`OBSERVATION_VERSION`), the slot
ids it was trained for and the horizon its observations were scaled with.

A policy acts, or resumes training, only on the observation layout it was trained on: one of
another version is refused in one line (its first layer has another width).

A policy acts in a run only if that run's action space fits it: the blueprint indices it shares
with this process's blueprint table must name the same blueprints (checked on loading), and every
blueprint the run allows must have a head entry (`check_blueprints`). A policy trained before a
blueprint was registered therefore still acts in runs that do not allow the new blueprint.

A policy trained with a subset of the blueprints (the run's ``blueprints``) germinates only
those wherever it acts (``allowed_blueprints``, `PolicyBundle.playable`): the head entries of
the others never learned anything, so letting it choose them would play untrained logits.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_lightning.blueprints import BUILTIN_TABLE, blueprint_table
from esper_lightning.errors import ConfigError
from esper_lightning.rl.normalizers import RunningMeanStd
from esper_lightning.rl.observations import BASE_DIM, OBSERVATION_VERSION, SLOT_DIM, obs_dim
from esper_lightning.rl.policy import FactoredRecurrentActorCritic, PolicyConfig

#: Version 2 added the action space (``head_sizes``, ``blueprints``) and the sizes besides the
#: hidden width (``policy_head_hidden``, ``blueprint_embed_dim``); version 3 the observation
#: layout (``observation_version``; versions 1 and 2 read observation version 1).
CHECKPOINT_VERSION = 3
#: Version 1 stored no action space: its blueprint head was always the 13 entries of the
#: built-in table of the time, so reading it back is exact.
VERSION_1_BLUEPRINTS: tuple[str | None, ...] = (None, *BUILTIN_TABLE[:12])


@dataclass
class PolicyBundle:
    """Everything needed to act like the trained policy.

    Attributes:
        policy: the actor-critic in eval mode.
        obs_rms: the frozen observation normaliser of the run.
        slot_ids: slots the policy was trained for, in action order.
        horizon: episode length its observations were scaled with.
        compact: trained on the compact action space (op, slot, blueprint).
        source: what the policy is called in error messages (``policy 'runs/ckpt.pt'``).
        allowed_blueprints: the blueprints its training run allowed, when that was a subset
            (None: whatever each run allows).
    """

    policy: FactoredRecurrentActorCritic
    obs_rms: RunningMeanStd
    slot_ids: tuple[str, ...]
    horizon: int
    compact: bool = False
    source: str = "the policy"
    allowed_blueprints: tuple[str, ...] | None = None

    @property
    def blueprints(self) -> tuple[str | None, ...]:
        """The blueprint name of each index of the policy's blueprint head."""
        return self.policy.config.blueprints

    def playable(self, allowed: Sequence[str]) -> tuple[str, ...]:
        """The blueprints it germinates in a run that allows ``allowed``: those it was
        trained with, in the run's order."""
        trained = self.allowed_blueprints
        return tuple(allowed) if trained is None else tuple(n for n in allowed if n in trained)


#: The entries `policy_entries` writes and `load_policy` reads: what acting needs of a
#: checkpoint (what ``esper-lightning ship`` keeps).
POLICY_ENTRY_KEYS = ("policy", "policy_hidden", "policy_head_hidden", "blueprint_embed_dim",
                     "head_sizes", "blueprints", "obs_rms", "observation_version", "slot_ids",
                     "horizon", "compact", "allowed_blueprints")


def policy_entries(
    policy: FactoredRecurrentActorCritic,
    obs_rms: RunningMeanStd,
    slot_ids: tuple[str, ...],
    horizon: int,
    compact: bool = False,
    allowed_blueprints: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The checkpoint entries `load_policy` reads back (``allowed_blueprints``: the training
    run's subset of blueprints, None for all)."""
    entries = {
        "policy": policy.state_dict(),
        "policy_hidden": policy.config.hidden_dim,
        "policy_head_hidden": policy.config.head_hidden_dim,
        "blueprint_embed_dim": policy.config.blueprint_embed_dim,
        "head_sizes": dict(policy.config.head_sizes),
        "blueprints": list(policy.config.blueprints),
        "obs_rms": obs_rms.state_dict(),
        "observation_version": OBSERVATION_VERSION,
        "slot_ids": list(slot_ids),
        "horizon": int(horizon),
        "compact": bool(compact),
        "allowed_blueprints": None if allowed_blueprints is None else list(allowed_blueprints),
    }
    assert tuple(entries) == POLICY_ENTRY_KEYS  # one list of what a policy is, kept in step
    return entries


def load_policy(state: dict[str, Any], source: str = "the policy") -> PolicyBundle:
    """Rebuild the policy and its observation normaliser from a read checkpoint.

    Raises:
        ConfigError: when the checkpoint's policy reads another observation layout, or its
            action space does not fit this process (head sizes of another version, or a
            blueprint index that names another blueprint here).
    """
    check_observation(state, source)
    slot_ids = tuple(state["slot_ids"])
    config = PolicyConfig(
        n_slots=len(slot_ids),
        hidden_dim=int(state["policy_hidden"]),
        head_hidden_dim=int(state["policy_head_hidden"]),
        blueprint_embed_dim=int(state["blueprint_embed_dim"]),
        blueprints=tuple(state["blueprints"]),
    )
    _check_action_space(state, config, source)
    policy = FactoredRecurrentActorCritic(config)
    policy.load_state_dict(state["policy"])
    policy.eval()
    obs_rms = RunningMeanStd(shape=(obs_dim(len(slot_ids)),))
    obs_rms.load_state_dict(state["obs_rms"])
    obs_rms.freeze()
    allowed = state.get("allowed_blueprints")  # absent before subsets: all
    return PolicyBundle(policy, obs_rms, slot_ids, int(state["horizon"]), bool(state["compact"]),
                        source, None if allowed is None else tuple(allowed))


def load_policy_file(path: str | os.PathLike[str]) -> PolicyBundle:
    """`read_checkpoint` then `load_policy`, naming the file in every error."""
    return load_policy(read_checkpoint(path), source=f"policy '{path}'")


def load_policy_weights(
    policy: FactoredRecurrentActorCritic, state: dict[str, Any], source: str
) -> None:
    """Load a checkpoint's policy weights into ``policy`` (a resumed run's, built for this
    process's blueprint table).

    Raises:
        ConfigError: when the checkpoint's policy reads another observation layout, or its
            blueprint head is not the policy's.
    """
    check_observation(state, source)
    saved = tuple(state["blueprints"])
    if saved != policy.config.blueprints:
        raise ConfigError(f"{source} has the blueprint head {_names(saved)}; this run builds "
                          f"{_names(policy.config.blueprints)}")
    policy.load_state_dict(state["policy"])


def check_observation(state: dict[str, Any], source: str) -> None:
    """Refuse a checkpoint whose policy was trained on another observation layout
    (`OBSERVATION_VERSION`; a checkpoint of version 1 or 2 read observation version 1).

    Raises:
        ConfigError: naming the version the policy reads and the one this release builds.
    """
    saved = state.get("observation_version", 1)
    if saved != OBSERVATION_VERSION:
        raise ConfigError(
            f"{source} reads observation version {saved!r}; this release builds version "
            f"{OBSERVATION_VERSION} ({BASE_DIM} + {SLOT_DIM} features per slot, docs/rl.md "
            f"section 1), which it was not trained on: train the policy again with this release"
        )


def check_blueprints(bundle: PolicyBundle, allowed: Sequence[str]) -> None:
    """Refuse a run that allows a blueprint the policy has no head entry for (of those it
    plays, `PolicyBundle.playable`).

    Raises:
        ConfigError: naming the blueprints the policy knows and those the run adds.
    """
    unknown = [name for name in bundle.playable(allowed) if name not in bundle.blueprints]
    if unknown:
        raise ConfigError(
            f"{bundle.source} knows the blueprints {_names(bundle.blueprints)}; this run also "
            f"allows {', '.join(unknown)}: leave them out of the run's blueprints or train a "
            f"policy with them registered"
        )


def _check_action_space(state: dict[str, Any], config: PolicyConfig, source: str) -> None:
    saved = state.get("head_sizes")
    if saved is not None and dict(saved) != config.head_sizes:
        raise ConfigError(f"{source} has the action heads {dict(saved)}; this version builds "
                          f"{config.head_sizes} for its slots and blueprints")
    here = blueprint_table()
    for index, (name, ours) in enumerate(zip(config.blueprints, here, strict=False)):
        if name != ours:
            raise ConfigError(
                f"{source} has blueprint {name!r} at index {index}; this process has {ours!r} "
                f"there: register blueprints in the order of the policy's training run"
            )


def _names(blueprints: Sequence[str | None]) -> str:
    return "[" + ", ".join(name or "none" for name in blueprints) + "]"


#: What a refusal of a file that is no PPO checkpoint says is expected instead.
EXPECTED = "expected a PPO checkpoint written by esper-lightning ppo --save"


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a PPO checkpoint safely (``weights_only=True``).

    A version-1 checkpoint comes back with the action space it implies (`VERSION_1_BLUEPRINTS`).

    Raises:
        ConfigError: one complete line naming the file, what is wrong with it (missing, a
            folder, empty, truncated, not a torch file, holding objects, another version) and
            what is expected.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"checkpoint '{path}' does not exist")
    if path.is_dir():
        raise ConfigError(f"checkpoint '{path}' is a folder; {EXPECTED}")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickles on stderr
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any failure to unpickle means "not a readable checkpoint"
        raise ConfigError(f"cannot read checkpoint '{path}': {_unreadable(path, err)}; "
                          f"{EXPECTED}") from None
    version = state.get("version") if isinstance(state, dict) else None
    if version is None:
        held = "a dict without a version" if isinstance(state, dict) else (
            f"a {type(state).__name__}")
        raise ConfigError(f"'{path}' is not an esper-lightning PPO checkpoint (a torch file "
                          f"holding {held}); {EXPECTED}")
    if version not in range(1, CHECKPOINT_VERSION + 1):
        raise ConfigError(f"'{path}' is not an esper-lightning PPO checkpoint of version 1 to "
                          f"{CHECKPOINT_VERSION}, the versions this release reads (its version "
                          f"is {version!r})")
    if version == 1:  # every version-1 policy had the default sizes besides the hidden width
        defaults = PolicyConfig(n_slots=1)
        state = {**state, "blueprints": list(VERSION_1_BLUEPRINTS),
                 "policy_head_hidden": defaults.head_hidden_dim,
                 "blueprint_embed_dim": defaults.blueprint_embed_dim}
    return state


def _unreadable(path: Path, err: Exception) -> str:
    """Why ``torch.load`` failed on ``path``, in a few words (torch's own messages run over
    several lines or stop mid-word)."""
    with path.open("rb") as file:
        head = file.read(4)
    if not head:
        return "the file is empty"
    if head == b"PK\x03\x04":  # torch.save writes a zip archive
        if not zipfile.is_zipfile(path):
            return "the file is truncated or damaged (its zip archive does not read to the end)"
        return "it holds objects other than tensors and plain values"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    return "it is not a file written by torch.save"


def write_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write atomically (temporary file, then rename): a crash mid-write never leaves a
    truncated checkpoint, and the previous one stays intact until the new one is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({**state, "version": CHECKPOINT_VERSION}, tmp)
    os.replace(tmp, path)
