"""Typed, strict configuration of a PPO controller-training run.

A run's configuration is built in layers: the preset, then an optional JSON/YAML file, then
command-line flags. Every layer is checked strictly: an unknown key, a wrong type or an
out-of-range value raises `ConfigError` with a one-line message naming the bad value and what
is accepted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from esper_lightning.errors import ConfigError
from esper_lightning.hosts import PRESETS as HOST_PRESETS
from esper_lightning.hosts import slot_ids
from esper_lightning.rl.rewards import RewardMode

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


@dataclass(frozen=True)
class PPORunConfig:
    """Everything a `PPOTrainer` run needs.

    Attributes:
        data_dir: folder with ``cifar-10-batches-py/`` (None: ``$ESPER_DATA_DIR`` or the cache).
        download: download CIFAR-10 when missing.
        envs: parallel environments (host models) per round.
        rounds: PPO rounds; each is ``envs`` episodes of ``episode_length`` epochs + 1 update.
        episode_length: host epochs per episode (one RL step = one epoch).
        slots: enabled slot ids of the host, in action order.
        host_preset: ``baseline``, ``impaired`` or ``scale``.
        reward: reward mode (``shaped``, ``simplified``, ``sparse``).
        device: device of every env when ``devices`` is empty (``cpu``, ``cuda``, ``cuda:1``).
        devices: one device per env, cycled when shorter than ``envs``.
        precision: ``32-true``, ``bf16-mixed`` or ``16-mixed`` (per-env GradScaler).
        logdir: TensorBoard root (Lightning layout: ``<logdir>/ppo/version_N``).
        save: checkpoint path written atomically after every round (None: no checkpoint).
        resume: checkpoint to continue from.
        rng_seed: root random-number seed; every episode's seed derives from (rng_seed, round,
            env index), the data subsets from rng_seed.
        batch_size: host training batch size.
        train_subset, val_subset: at most this many images of the training/test split (None:
            all).
        host_lr: host SGD learning rate.
        max_seeds: seeds present at once per host (None: unlimited).
        policy_hidden: width of the policy's feature MLP and LSTM.
        learning_rate: Adam step size of the policy.
        ppo_epochs: passes over each round's rollout.
        minibatch_envs: env sequences per PPO minibatch.
        gamma, gae_lambda: discount and GAE lambda.
        min_training_epochs: G2 incubation epochs (default 10; short episodes need fewer).
        progress: show a progress bar.
    """

    data_dir: str | None = None
    download: bool = False
    envs: int = 4
    rounds: int = 20
    episode_length: int = 20
    slots: tuple[str, ...] = ("r0c0", "r0c1", "r0c2")
    host_preset: str = "baseline"
    reward: str = "shaped"
    device: str = "cpu"
    devices: tuple[str, ...] = ()
    precision: str = "32-true"
    logdir: str = "runs"
    save: str | None = None
    resume: str | None = None
    rng_seed: int = 0
    batch_size: int = 128
    train_subset: int | None = None
    val_subset: int | None = None
    host_lr: float = 0.01
    max_seeds: int | None = None
    policy_hidden: int = 128
    learning_rate: float = 3e-4
    ppo_epochs: int = 4
    minibatch_envs: int = 2
    gamma: float = 0.995
    gae_lambda: float = 0.95
    min_training_epochs: int = 10
    progress: bool = True

    def __post_init__(self) -> None:
        _check_positive(self, ("envs", "rounds", "episode_length", "batch_size",
                               "policy_hidden", "ppo_epochs", "minibatch_envs"))
        _check_optional_positive(self, ("train_subset", "val_subset", "max_seeds"))
        if self.min_training_epochs < 0:
            raise ConfigError(f"min_training_epochs must be >= 0, got {self.min_training_epochs}")
        _check_choice("host_preset", self.host_preset, tuple(HOST_PRESETS))
        _check_choice("reward", self.reward, tuple(m.value for m in RewardMode))
        _check_choice("precision", self.precision, PRECISIONS)
        for device in (self.device, *self.devices):
            _check_device(device)
        accepted = slot_ids(HOST_PRESETS[self.host_preset].n_blocks)
        if not self.slots:
            raise ConfigError(f"slots must name at least one slot; accepted: {', '.join(accepted)}")
        for slot in self.slots:
            _check_choice("slot", slot, accepted)
        if len(set(self.slots)) != len(self.slots):
            raise ConfigError(f"slots lists a slot twice: {', '.join(self.slots)}")
        for name, low, high in (("gamma", 0.0, 1.0), ("gae_lambda", 0.0, 1.0)):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"{name} must be in [{low}, {high}], got {value}")
        for name in ("learning_rate", "host_lr"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def env_devices(self) -> tuple[str, ...]:
        devices = self.devices or (self.device,)
        return tuple(devices[i % len(devices)] for i in range(self.envs))


    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def replace(self, **changes: Any) -> PPORunConfig:
        return from_mapping(changes, base=self)


#: Fields that shape the policy or the task: a checkpoint only resumes with equal values.
COMPATIBILITY_KEYS = (
    "slots", "host_preset", "reward", "episode_length", "policy_hidden", "envs",
    "min_training_epochs", "max_seeds",
)

PRESETS: dict[str, dict[str, Any]] = {
    # Seconds-to-minutes on 2 CPU cores: proves the loop end to end, learns nothing.
    "smoke": {
        "envs": 2, "rounds": 2, "episode_length": 4, "train_subset": 512, "val_subset": 256,
        "batch_size": 64, "slots": ("r0c1", "r0c2"), "min_training_epochs": 1,
        "policy_hidden": 32, "ppo_epochs": 2, "minibatch_envs": 1,
    },
    # Real learning on the CIFAR-10 subset (4,660 / 846 images) in about an hour on 2 cores.
    "cpu": {
        "envs": 4, "rounds": 30, "episode_length": 15, "batch_size": 128,
        "slots": ("r0c1", "r0c2"), "min_training_epochs": 3, "policy_hidden": 64,
        "ppo_epochs": 4, "minibatch_envs": 2,
    },
    # Full CIFAR-10 on a GPU: longer episodes, the default incubation.
    "gpu": {
        "envs": 8, "rounds": 100, "episode_length": 50, "batch_size": 256,
        "slots": ("r0c0", "r0c1", "r0c2"), "min_training_epochs": 10, "device": "cuda",
        "precision": "bf16-mixed", "policy_hidden": 128, "minibatch_envs": 4,
    },
}


def from_mapping(values: Mapping[str, Any], base: PPORunConfig | None = None) -> PPORunConfig:
    """Apply ``values`` on top of ``base`` (defaults if None); unknown keys are errors."""
    known = {f.name: f for f in fields(PPORunConfig)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(known)}"
        )
    coerced = {name: _coerce(name, value, known[name].default) for name, value in values.items()}
    try:
        return dataclasses.replace(base or PPORunConfig(), **coerced)
    except TypeError as err:
        raise ConfigError(str(err)) from None


def load_config(
    preset: str | None = None,
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> PPORunConfig:
    """Preset, then file, then overrides; each layer strict."""
    config = PPORunConfig()
    if preset is not None:
        _check_choice("preset", preset, tuple(PRESETS))
        config = from_mapping(PRESETS[preset], config)
    if path is not None:
        config = from_mapping(read_config_file(path), config)
    return from_mapping(overrides or {}, config)


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file '{path}': {err.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # any parser error is a user mistake in the file
        reason = str(err).splitlines()[0]
        raise ConfigError(f"cannot parse config file '{path}': {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
    return data


def compatibility_errors(saved: Mapping[str, Any], config: PPORunConfig) -> list[str]:
    """The compatibility keys whose saved value differs from ``config``."""
    current = config.to_dict()
    return [
        f"{key}={saved.get(key)!r} (now {current[key]!r})"
        for key in COMPATIBILITY_KEYS
        if _plain(saved.get(key)) != current[key]
    ]


# --- checking ---------------------------------------------------------------------------------
def _coerce(name: str, value: Any, default: Any) -> Any:
    if name in ("slots", "devices"):
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{name} must be a list of strings, got {value!r}")
        return tuple(str(v) for v in value)
    expected = type(default) if default is not None else None
    if name in ("data_dir", "save", "resume"):
        expected = str
    if name in ("train_subset", "val_subset", "max_seeds"):
        expected = int
    if value is None:
        if default is None:
            return None
        raise ConfigError(f"{name} must not be null")
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is not None and (not isinstance(value, expected) or
                                 (expected is int and isinstance(value, bool))):
        raise ConfigError(f"{name} must be a {expected.__name__}, got {value!r}")
    return value


def _check_positive(config: PPORunConfig, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")


def _check_optional_positive(config: PPORunConfig, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1 or null, got {value}")


def _check_choice(name: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ConfigError(f"unknown {name} {value!r}; accepted: {', '.join(accepted)}")


def check_hardware(config: PPORunConfig) -> None:
    """Refuse devices and precisions this machine cannot run (one-line `ConfigError`)."""
    cuda = [d for d in config.env_devices if d.startswith("cuda")]
    if cuda and not torch.cuda.is_available():
        raise ConfigError(f"device {cuda[0]!r} requested but CUDA is not available; use cpu")
    for device in cuda:
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r} does not exist; this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    if config.precision == "16-mixed" and not cuda:
        raise ConfigError("precision '16-mixed' needs CUDA devices; on cpu use bf16-mixed or "
                          "32-true")


def _check_device(device: str) -> None:
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ConfigError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
