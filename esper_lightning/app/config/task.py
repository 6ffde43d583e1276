"""`TaskConfig`: the task every env plays (data, host, slots, episode length, reward, budget)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from esper_lightning.app.config.checks import (
    check_choice,
    check_device,
    check_optional_positive,
    check_positive,
    check_range,
    check_slots,
    plain,
)
from esper_lightning.app.config.choices import (
    BLEND_GRADIENTS,
    OUTCOME_EPOCHS,
    OUTCOMES,
    PRECISIONS,
    REWARD_MODES,
    BlendGradientName,
    HostPresetName,
    LRScheduleName,
    OutcomeName,
    PrecisionName,
    RewardName,
    TaskName,
)
from esper_lightning.app.config.layers import from_mapping
from esper_lightning.envs.task_specs import TaskSpec, task_names, task_spec
from esper_lightning.errors import ConfigError
from esper_lightning.schedule import schedule_error

ConfigT = TypeVar("ConfigT", bound="TaskConfig")


@dataclass(frozen=True)
class TaskConfig:
    """The task every env plays: one host trained for one episode on one dataset.

    The defaults of ``host_preset``, ``slots`` and ``host_lr`` follow the task (null: the
    task's own); a layer that changes the task also moves the ones still at the old task's
    default.

    Args:
        data_dir: cifar: folder with ``cifar-10-batches-py/``; lm: a text file, or a folder
            with ``TinyStories-valid.txt`` or a single ``*.txt`` file (null: ``$ESPER_DATA_DIR``
            or the cache).
        task: what the hosts learn, a registered task (`envs.task_specs`): cifar (CifarCNNHost
            on CIFAR-10 images) or lm (GPTHost predicting the next byte of a text; accuracy is
            next-token accuracy).
        download: download the data when missing (cifar: CIFAR-10; lm: the TinyStories
            validation split).
        episode_length: host epochs per episode (one RL step = one epoch).
        slots: enabled slot ids of the host, in action order (null: cifar r0c0 r0c1 r0c2; lm
            r0c0 r0c1).
        host_preset: the host network (cifar: baseline, impaired, scale; lm: tiny, small,
            medium, grow4 (1 block and one growth slot r1c0 whose block seed is 3 blocks),
            grow4x1 (growth slots r1c0-r1c2 of one block each), grow2 (1 block growing to 2),
            grow124 (1 block growing to 2 in r1c0, then to 4 in r1c1), grow2-w64 and
            grow124-w64 (the same at width 64), w32l1, w32l2, w32l4; null: baseline / tiny).
        reward: reward mode the controller's return is computed with.
        gamma: discount of the return (and of the reward's potential-based shaping).
        param_cost: outcome points charged per host-sized amount of seed parameters (the
            outcome is the mean validation accuracy of the last 3 epochs minus this cost).
        outcome: what the PPO terminal reward pays: accuracy (that outcome) or bits (−100 ×
            the final validation loss in bits per token, minus the same cost: what compare
            judges a budgeted language-model run by, final_bits).
        device: device of every env when ``devices`` is empty (cpu, cuda, cuda:N).
        devices: one device per env, cycled when shorter than the pool (ppo with a ddp
            strategy: the number of processes per node, e.g. 2).
        precision: host training precision (16-mixed gives each env its own GradScaler).
        rng_seed: root random-number seed: episodes and data subsets derive from it.
        batch_size: host training batch size.
        train_subset: cifar: at most this many training images (null: all); lm: training
            blocks per epoch (null: about one pass over the text).
        val_subset: cifar: at most this many validation images; lm: at most this many
            validation blocks (null: all).
        host_lr: host learning rate (cifar: SGD, lm: AdamW; null: 0.01 / 0.001).
        max_seeds: seeds present at once per host, null: unlimited (`SeedingConfig.max_seeds`,
            where the seeding options are documented; `app.task.seeding_config` builds one from
            these keys).
        blueprints: the blueprints a controller may germinate, a subset of those of the task's
            slots, null: all of them (`SeedingConfig.blueprints`), e.g. block_identity alone
            for a policy that learns only when to grow. A policy trained with a subset plays
            only that subset wherever it is evaluated (`PolicyController`).
        min_training_epochs: epochs a seed incubates before it may blend: G2's threshold of
            the seeding's gate_config (`SeedingConfig.gate_config`).
        blend_gradient: through (null: the default) or detached (`SeedingConfig.blend_gradient`;
            docs/evidence.md measures both).
        block_size: lm only: tokens per block (null: the GPT preset's block_size).
        layer_scale_init: initial LayerScale gain of a new seed, null: the blueprints' own
            (`SeedingConfig.layer_scale_init`; docs/evidence.md measures 1.0).
        budget_flops: compute budget of each episode in training FLOPs (host and every seed,
            forward and backward, measured): the episode's episode_length epochs each spend an
            equal slice of it, so a bigger host trains fewer batches per epoch (null: no
            budget; an epoch is a pass over the training data or train_subset). A layer that
            sets budget_flops clears budget_steps, and the other way round.
        budget_steps: the budget in training steps of the static host (host_preset with no
            seed, one batch of batch_size; the lm task: of block_size tokens), converted to
            FLOPs when the envs are built.
        budget_scales: budgets that vary by episode: each episode draws its budget as one of
            these multiples of the base budget (budget_flops or budget_steps), uniformly, from
            its own rng seed, so episode i has the same budget for every controller of a
            comparison and a PPO run replays its rollouts; the policy observes log2 of the
            scale. Each scale once, any order (kept sorted). Null: every episode gets the base
            budget.
        budget_range: budgets that vary continuously: each episode draws its budget
            log-uniformly from [LOW, HIGH] (multiples of the base budget, e.g. 0.25 4) with its
            own rng seed, so no two episodes share one; the policy observes log2 of the scale.
            Instead of budget_scales (a layer that sets one clears the other). compare refuses
            it, since it groups episodes by budget: compare at budget_scales.
        lr_schedule: host and seed learning-rate schedule over the fraction of the episode
            spent (of the budget, or of the planned batches without one): constant, wsd
            (warmup, stable, linear decay) or cosine; each arm's decay ends exactly at its
            budget.
        warmup_fraction: share of the episode warming up linearly from 0 (wsd, cosine).
        decay_fraction: share at the end decaying to min_lr_ratio (null: 0.2 for wsd, all
            after the warmup for cosine).
        min_lr_ratio: the last learning rate as a share of the base one (wsd, cosine).
    """

    data_dir: str | None = None
    task: TaskName = "cifar"
    download: bool = False
    episode_length: int = 20
    slots: tuple[str, ...] | None = None
    host_preset: HostPresetName | None = None
    reward: RewardName = "shaped"
    gamma: float = 0.995
    param_cost: float = 1.0
    outcome: OutcomeName = "accuracy"
    device: str = "cpu"
    devices: tuple[str, ...] = ()
    precision: PrecisionName = "32-true"
    rng_seed: int = 0
    batch_size: int = 128
    train_subset: int | None = None
    val_subset: int | None = None
    host_lr: float | None = None
    max_seeds: int | None = None
    blueprints: tuple[str, ...] | None = None
    min_training_epochs: int = 10
    blend_gradient: BlendGradientName | None = None
    block_size: int | None = None
    layer_scale_init: float | None = None
    budget_flops: float | None = None
    budget_steps: int | None = None
    budget_scales: tuple[float, ...] | None = None
    budget_range: tuple[float, ...] | None = None
    lr_schedule: LRScheduleName = "constant"
    warmup_fraction: float = 0.0
    decay_fraction: float | None = None
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        check_choice("task", self.task, task_names())
        resolve_task_defaults(self)
        check_positive(self, ("batch_size",))
        if self.episode_length < OUTCOME_EPOCHS:  # before a generic >= 1 names the wrong bound
            raise ConfigError(f"episode_length must be >= {OUTCOME_EPOCHS} (the outcome averages "
                              f"the last {OUTCOME_EPOCHS} epochs), got {self.episode_length}")
        check_optional_positive(self, ("train_subset", "val_subset", "max_seeds"))
        if self.min_training_epochs < 0:
            raise ConfigError(f"min_training_epochs must be >= 0, got {self.min_training_epochs}")
        if self.host_preset not in self.task_spec.presets:
            raise ConfigError(f"unknown host_preset {self.host_preset!r} for task {self.task!r}; "
                              f"accepted: {', '.join(self.task_spec.presets)}")
        check_choice("reward", self.reward, REWARD_MODES)
        check_choice("outcome", self.outcome, OUTCOMES)
        check_choice("precision", self.precision, PRECISIONS)
        if self.blend_gradient is not None:
            check_choice("blend_gradient", self.blend_gradient, BLEND_GRADIENTS)
        self._check_devices()
        check_slots(self.slots, self.task_spec.slot_ids(self.host_preset))
        check_blueprint_names(self)
        check_range("gamma", self.gamma, 0.0, 1.0)
        if self.param_cost < 0:
            raise ConfigError(f"param_cost must be >= 0, got {self.param_cost}")
        if self.host_lr <= 0:  # type: ignore[operator]  # resolved above
            raise ConfigError(f"host_lr must be > 0, got {self.host_lr}")
        check_block_size(self)
        if self.layer_scale_init is not None and not self.layer_scale_init >= 0:
            raise ConfigError(f"layer_scale_init must be >= 0 or null, got "
                              f"{self.layer_scale_init}")
        check_budget(self)
        check_budget_scales(self)
        check_budget_range(self)
        problem = schedule_error(self.lr_schedule, self.warmup_fraction, self.decay_fraction,
                                 self.min_lr_ratio)
        if problem is not None:
            raise ConfigError(problem)

    @property
    def budgeted(self) -> bool:
        """Whether episodes run under a compute budget."""
        return self.budget_flops is not None or self.budget_steps is not None

    @property
    def task_spec(self) -> TaskSpec:
        """The descriptor of ``task``: its presets, slots, defaults and capabilities."""
        return task_spec(self.task)

    def _check_devices(self) -> None:
        for device in (self.device, *self.devices):
            check_device(device)

    def devices_for(self, n_envs: int) -> tuple[str, ...]:
        """The device of each of ``n_envs`` envs (``devices`` cycled, else ``device``)."""
        devices = self.devices or (self.device,)
        return tuple(devices[i % len(devices)] for i in range(n_envs))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}

    def replace(self: ConfigT, **changes: Any) -> ConfigT:
        return from_mapping(changes, base=self)


# --- the task's own checks ---------------------------------------------------------------------
def check_devices(devices: tuple[str, ...]) -> list[str]:
    """Refuse a CUDA device (``cuda`` or ``cuda:N``) this machine does not have (one-line
    `ConfigError`); returns the CUDA devices among ``devices``."""
    import torch  # only a run checks its hardware: parsing stays free of torch

    cuda = [d for d in devices if d.startswith("cuda")]
    if cuda and not torch.cuda.is_available():
        raise ConfigError(f"device {cuda[0]!r} requested but CUDA is not available; use cpu")
    for device in cuda:
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r} does not exist; this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    return cuda


def check_hardware(config: TaskConfig, devices: tuple[str, ...]) -> None:
    """Refuse devices and precisions this machine cannot run (one-line `ConfigError`)."""
    cuda = check_devices(devices)
    if config.precision == "16-mixed" and not cuda:
        raise ConfigError("precision '16-mixed' needs CUDA devices; on cpu use bf16-mixed or "
                          "32-true")


def resolve_task_defaults(config: TaskConfig) -> None:
    """Fill the task-dependent keys left null with the task's defaults (before any check)."""
    for name, value in config.task_spec.defaults().items():
        if getattr(config, name) is None:
            object.__setattr__(config, name, value)


def check_budget(config: TaskConfig) -> None:
    """A budget is a positive number of FLOPs or static-host steps, one of the two, and no
    option that sizes an epoch in data contradicts it."""
    flops, steps = config.budget_flops, config.budget_steps
    if flops is not None and steps is not None:
        raise ConfigError(f"budget_flops={flops!r} and budget_steps={steps!r} are both set; "
                          "accepted: one of them")
    if flops is not None and not (math.isfinite(flops) and flops > 0):
        raise ConfigError(f"budget_flops must be a number > 0 (FLOPs) or null, got {flops!r}")
    if steps is not None and steps < 1:
        raise ConfigError(f"budget_steps must be an int >= 1 or null, got {steps!r}")
    if config.budgeted and config.task_spec.subset_per_epoch and config.train_subset is not None:
        raise ConfigError(f"train_subset={config.train_subset} sets the training blocks of an "
                          "epoch, which a budget sets (budget / episode_length FLOPs per epoch); "
                          "accepted: train_subset null with a budget")


def check_budget_scales(config: TaskConfig) -> None:
    """Budget scales are distinct numbers > 0 that multiply a budget; kept sorted, so the same
    set given in another order is the same configuration (and draws the same budgets)."""
    scales = config.budget_scales
    if scales is None:
        return
    accepted = "accepted: distinct numbers > 0, multiples of the base budget, e.g. 0.5 1 2"
    if not scales:
        raise ConfigError(f"budget_scales is empty; {accepted}, or null for one budget")
    bad = [s for s in scales if not (math.isfinite(s) and s > 0)]
    if bad or len(set(scales)) != len(scales):
        what = f"{bad[0]!r}" if bad else "a scale twice"
        raise ConfigError(f"budget_scales={list(scales)} holds {what}; {accepted}")
    if not config.budgeted:
        raise ConfigError(f"budget_scales={list(scales)} scale a budget, and none is set; "
                          "accepted: budget_flops or budget_steps with them, or budget_scales "
                          "null")
    object.__setattr__(config, "budget_scales", tuple(sorted(scales)))


def check_budget_range(config: TaskConfig) -> None:
    """A budget range is two numbers ``0 < LOW < HIGH`` that multiply a budget, not given with
    budget scales (each says how an episode draws its budget)."""
    span = config.budget_range
    if span is None:
        return
    if len(span) != 2 or not all(math.isfinite(s) for s in span) or not 0 < span[0] < span[1]:
        raise ConfigError(f"budget_range={list(span)} is not a range; accepted: LOW HIGH with "
                          "0 < LOW < HIGH, multiples of the base budget, e.g. 0.25 4")
    if not config.budgeted:
        raise ConfigError(f"budget_range={list(span)} scales a budget, and none is set; "
                          "accepted: budget_flops or budget_steps with it, or budget_range null")
    if config.budget_scales is not None:
        raise ConfigError(f"budget_range={list(span)} and budget_scales="
                          f"{list(config.budget_scales)} are both set; accepted: one of them")


def smallest_budget_scale(config: TaskConfig) -> float:
    """The smallest multiple of the base budget an episode can draw (1 with one budget)."""
    if config.budget_range is not None:
        return config.budget_range[0]
    return min(config.budget_scales or (1.0,))


def check_block_size(config: TaskConfig) -> None:
    """A block size only for a task that takes one (at most its preset's), and an epoch of at
    least one batch where ``train_subset`` counts an epoch's batches."""
    spec = config.task_spec
    limit = spec.block_limit(str(config.host_preset))
    if limit is None and config.block_size is not None:
        takers = [s.name for s in map(task_spec, task_names()) if s.takes_block_size]
        raise ConfigError(f"block_size is for task {' or '.join(map(repr, takers))} only; task "
                          f"{config.task!r} takes null, got {config.block_size}")
    if limit is not None and config.block_size is not None and not (
            1 <= config.block_size <= limit):
        raise ConfigError(f"block_size must be in [1, {limit}] for host_preset "
                          f"{config.host_preset!r}, got {config.block_size}")
    if spec.subset_per_epoch and config.train_subset is not None and (
            config.train_subset < config.batch_size):
        raise ConfigError(f"train_subset (training blocks per epoch) must be >= batch_size="
                          f"{config.batch_size} for task {config.task!r}, got "
                          f"{config.train_subset}")


def check_blueprint_names(config: TaskConfig) -> None:
    """Names, each once, kept sorted: the same subset in another order is the same
    configuration (which names the task's slots accept is checked when the envs are built:
    the blueprint registry lives with torch, `app.task.allowed_blueprints`)."""
    blueprints = config.blueprints
    if blueprints is None:
        return
    if not blueprints:
        raise ConfigError("blueprints is empty; accepted: blueprint names of the task's slots, "
                          "or null for all of them")
    if len(set(blueprints)) != len(blueprints):
        raise ConfigError(f"blueprints lists a blueprint twice: {', '.join(blueprints)}")
    object.__setattr__(config, "blueprints", tuple(sorted(blueprints)))
