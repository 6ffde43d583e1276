"""Typed, strict configuration of the application's commands.

`TaskConfig` is the task every env plays (data, host, slots, episode length, reward);
`PPORunConfig` adds how a controller is learned (``esper-lightning ppo``) and `CompareConfig` how
controllers are compared (``esper-lightning compare``). A configuration is built in layers: the
defaults, a preset, an optional JSON/YAML file, then command-line flags. Every layer is checked
strictly: an unknown key, a wrong type or an out-of-range value raises `ConfigError` with a
one-line message naming the bad value and what is accepted. The docstrings' ``Args`` sections are
the command-line help (jsonargparse reads them), so every field is documented exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from esper_lightning.errors import ConfigError
from esper_lightning.hosts.presets import GPT_PRESETS
from esper_lightning.hosts.presets import PRESETS as CNN_PRESETS  # PRESETS here: the runs'
from esper_lightning.schedule import LR_SCHEDULES, schedule_error


@dataclass(frozen=True)
class TaskChoices:
    """What a configuration checks of a task: its host presets (with their slot ids) and what a
    run that names none uses. Plain data, so the command line checks a whole configuration
    before it imports torch; the `Task` classes of `esper_lightning.envs.tasks` play the tasks
    and carry the same facts (tests/test_app_config.py checks that they agree)."""

    presets: Mapping[str, Any]
    default_preset: str
    default_slots: tuple[str, ...]
    default_host_lr: float

    def slot_ids(self, preset: str) -> tuple[str, ...]:
        """Every slot id of host ``preset``, in action order."""
        return self.presets[preset].slot_ids  # type: ignore[no-any-return]


#: The tasks a configuration may name (``--task``).
TASK_CHOICES: dict[str, TaskChoices] = {
    "cifar": TaskChoices(CNN_PRESETS, "baseline", ("r0c0", "r0c1", "r0c2"), 0.01),
    "lm": TaskChoices(GPT_PRESETS, "tiny", ("r0c0", "r0c1"), 1e-3),
}
#: The reward modes of `esper_lightning.rl.rewards.RewardMode`, by value.
REWARD_MODES = ("shaped", "simplified", "sparse")
#: Epochs the outcome averages (`esper_lightning.core.outcome.OUTCOME_EPOCHS`).
OUTCOME_EPOCHS = 3
#: What the outcome measures (`esper_lightning.core.outcome.OUTCOMES`).
OUTCOMES = ("accuracy", "bits")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
#: `esper_lightning.core.slots.BLEND_GRADIENTS` (plain data: parsing never imports torch).
BLEND_GRADIENTS = ("detached", "through")
# Choices as types, so the command-line help lists them.
TaskName = Literal[tuple(TASK_CHOICES)]  # type: ignore[valid-type]
HostPresetName = Literal[tuple(p for t in TASK_CHOICES.values() for p in t.presets)]  # type: ignore[valid-type]
RewardName = Literal[REWARD_MODES]  # type: ignore[valid-type]
OutcomeName = Literal[OUTCOMES]  # type: ignore[valid-type]
PrecisionName = Literal[PRECISIONS]  # type: ignore[valid-type]
BlendGradientName = Literal[BLEND_GRADIENTS]  # type: ignore[valid-type]
LRScheduleName = Literal[LR_SCHEDULES]  # type: ignore[valid-type]
#: How ``esper-lightning ppo`` runs: one process, or Lightning's data-parallel launchers.
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork")
StrategyName = Literal[STRATEGIES]  # type: ignore[valid-type]
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
        task: what the hosts learn: cifar (CifarCNNHost on CIFAR-10 images) or lm (GPTHost
            predicting the next byte of a text; accuracy is next-token accuracy).
        download: download the data when missing (cifar: CIFAR-10; lm: the TinyStories
            validation split).
        episode_length: host epochs per episode (one RL step = one epoch).
        slots: enabled slot ids of the host, in action order (null: cifar r0c0 r0c1 r0c2; lm
            r0c0 r0c1).
        host_preset: the host network (cifar: baseline, impaired, scale; lm: tiny, small,
            medium, grow4 (1 block and one growth slot r1c0 whose block seed is 3 blocks),
            grow4x1 (growth slots r1c0-r1c2 of one block each), grow2 (1 block growing to 2),
            w32l1, w32l2, w32l4; null: baseline / tiny).
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
        max_seeds: seeds present at once per host (null: unlimited).
        blueprints: the blueprints a controller may germinate, a subset of those of the task's
            slots (null: all of them), e.g. block_identity alone for a policy that learns only
            when to grow. A policy trained with a subset plays only that subset wherever it is
            evaluated (`PolicyController`).
        min_training_epochs: epochs a seed incubates before it may blend (gate G2).
        blend_gradient: whether host layers before a BLENDING seed learn through it: through
            (null: the default) or detached (the seed's input is detached, so they get only
            1 - alpha of their gradient; docs/evidence.md measures both).
        block_size: lm only: tokens per block (null: the GPT preset's block_size).
        layer_scale_init: initial gain of every LayerScale in a new seed (null: the
            blueprints' own, 1e-3; docs/evidence.md measures 1.0).
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
    lr_schedule: LRScheduleName = "constant"
    warmup_fraction: float = 0.0
    decay_fraction: float | None = None
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        _check_choice("task", self.task, tuple(TASK_CHOICES))
        _resolve_task_defaults(self)
        _check_positive(self, ("episode_length", "batch_size"))
        if self.episode_length < OUTCOME_EPOCHS:
            raise ConfigError(f"episode_length must be >= {OUTCOME_EPOCHS} (the outcome averages "
                              f"the last {OUTCOME_EPOCHS} epochs), got {self.episode_length}")
        _check_optional_positive(self, ("train_subset", "val_subset", "max_seeds"))
        if self.min_training_epochs < 0:
            raise ConfigError(f"min_training_epochs must be >= 0, got {self.min_training_epochs}")
        if self.host_preset not in self.task_choices.presets:
            raise ConfigError(f"unknown host_preset {self.host_preset!r} for task {self.task!r}; "
                              f"accepted: {', '.join(self.task_choices.presets)}")
        _check_choice("reward", self.reward, REWARD_MODES)
        _check_choice("outcome", self.outcome, OUTCOMES)
        _check_choice("precision", self.precision, PRECISIONS)
        if self.blend_gradient is not None:
            _check_choice("blend_gradient", self.blend_gradient, BLEND_GRADIENTS)
        self._check_devices()
        _check_slots(self.slots, self.task_choices.slot_ids(self.host_preset))
        _check_blueprint_names(self)
        _check_range("gamma", self.gamma, 0.0, 1.0)
        if self.param_cost < 0:
            raise ConfigError(f"param_cost must be >= 0, got {self.param_cost}")
        if self.host_lr <= 0:  # type: ignore[operator]  # resolved above
            raise ConfigError(f"host_lr must be > 0, got {self.host_lr}")
        _check_block_size(self)
        if self.layer_scale_init is not None and not self.layer_scale_init >= 0:
            raise ConfigError(f"layer_scale_init must be >= 0 or null, got "
                              f"{self.layer_scale_init}")
        _check_budget(self)
        _check_budget_scales(self)
        problem = schedule_error(self.lr_schedule, self.warmup_fraction, self.decay_fraction,
                                 self.min_lr_ratio)
        if problem is not None:
            raise ConfigError(problem)

    @property
    def budgeted(self) -> bool:
        """Whether episodes run under a compute budget."""
        return self.budget_flops is not None or self.budget_steps is not None

    @property
    def task_choices(self) -> TaskChoices:
        """The presets, slots and defaults of ``task``."""
        return TASK_CHOICES[self.task]

    def _check_devices(self) -> None:
        for device in (self.device, *self.devices):
            _check_device(device)

    def devices_for(self, n_envs: int) -> tuple[str, ...]:
        """The device of each of ``n_envs`` envs (``devices`` cycled, else ``device``)."""
        devices = self.devices or (self.device,)
        return tuple(devices[i % len(devices)] for i in range(n_envs))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def replace(self: ConfigT, **changes: Any) -> ConfigT:
        return from_mapping(changes, base=self)


@dataclass(frozen=True)
class PPORunConfig(TaskConfig):
    """A run that learns the lifecycle controller with PPO (``esper-lightning ppo``).

    Args:
        envs: parallel environments (host models) per round.
        rounds: PPO rounds; each is ``envs`` episodes of ``episode_length`` epochs + 1 update.
        logdir: TensorBoard root (Lightning layout: ``<logdir>/ppo/version_N``).
        save: checkpoint path written atomically after every round (null: no checkpoint). A
            run refuses a path that already holds a file unless it resumes from that file or
            ``overwrite`` is set.
        resume: checkpoint to continue from (the same TensorBoard run continues). On the
            command line the run takes the checkpoint's configuration; flags given override it.
        overwrite: let a run replace the file at ``save`` that it did not resume from.
        policy_hidden: width of the policy's feature MLP and LSTM.
        learning_rate: Adam step size of the policy.
        ppo_epochs: passes over each round's rollout.
        minibatch_envs: env sequences per PPO minibatch; it divides envs (with ab: each
            policy's envs).
        gae_lambda: GAE lambda.
        target_kl: stop a PPO update after an epoch whose KL on the whole batch exceeds this.
        heads: action space the policy learns: full (all eight heads) or compact (op, slot and
            blueprint; the other heads keep their defaults).
        ab: reward modes to train side by side, one policy each, in one pool (the envs split
            evenly, the same episode seeds in every group); empty: one policy on ``reward``.
        progress: show a progress bar.
        strategy: auto (one process) or data-parallel processes with one env pool each (DD-PPO,
            docs/scaling.md): ddp (Fabric starts ``devices`` processes per node, or joins the
            ones torchrun or SLURM started), ddp_spawn or ddp_fork (processes started from
            this one, on one node). ``envs`` and ``minibatch_envs`` count every process's envs.
        num_nodes: machines of a ddp run.
    """

    envs: int = 4
    rounds: int = 20
    logdir: str = "runs"
    save: str | None = None
    resume: str | None = None
    overwrite: bool = False
    policy_hidden: int = 128
    learning_rate: float = 3e-4
    ppo_epochs: int = 4
    minibatch_envs: int = 2
    gae_lambda: float = 0.95
    target_kl: float = 0.02
    heads: Literal["full", "compact"] = "full"
    ab: tuple[str, ...] = ()
    progress: bool = True
    strategy: StrategyName = "auto"
    num_nodes: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, ("envs", "rounds", "policy_hidden", "ppo_epochs", "minibatch_envs"))
        _check_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
        for name in ("learning_rate", "target_kl"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        _check_choice("heads", self.heads, ("full", "compact"))
        for mode in self.ab:
            _check_choice("ab reward", mode, REWARD_MODES)
        if len(set(self.ab)) != len(self.ab) or len(self.ab) == 1:
            raise ConfigError(f"ab needs two or more different reward modes, got {list(self.ab)}")
        if self.ab and self.envs % len(self.ab):
            raise ConfigError(f"envs={self.envs} does not split evenly into {len(self.ab)} "
                              f"groups for ab={list(self.ab)}")
        self._check_processes()
        self._check_minibatches()

    def _check_devices(self) -> None:
        _check_choice("strategy", self.strategy, STRATEGIES)
        counts = [d for d in self.devices if d.isdigit()]
        if self.strategy == "auto":
            if counts:
                raise ConfigError(f"devices={list(self.devices)} is a process count, which needs "
                                  f"--strategy ddp; with strategy auto list one device per env "
                                  f"(cpu, cuda, cuda:N)")
            super()._check_devices()
            return
        _check_device(self.device)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"with strategy {self.strategy}, device is cpu or cuda (each "
                              f"process takes cuda:<local rank>), got {self.device!r}")
        if len(self.devices) > 1 or len(counts) != len(self.devices) or "0" in counts:
            raise ConfigError(f"with strategy {self.strategy}, devices is the number of "
                              f"processes per node (one device each), e.g. --devices 2; got "
                              f"{list(self.devices)}")

    def _check_processes(self) -> None:
        _check_positive(self, ("num_nodes",))
        if self.num_nodes > 1 and self.strategy != "ddp":
            raise ConfigError(f"num_nodes={self.num_nodes} needs strategy ddp (torchrun or SLURM "
                              f"start the processes of every node), got {self.strategy}")
        if self.strategy == "auto":
            return
        if self.ab:
            raise ConfigError(f"ab={list(self.ab)} cannot be combined with strategy "
                              f"{self.strategy}; run one ddp run per reward mode")
        world = self.world_size
        if self.envs % world:
            raise ConfigError(f"envs={self.envs} does not split evenly over {world} processes "
                              f"(devices x num_nodes); use a multiple of {world}")

    def _check_minibatches(self) -> None:
        """A minibatch is a whole number of each policy's env sequences, and every minibatch of
        an epoch has as many (a smaller last one would weigh its steps more)."""
        envs = self.envs // len(self.reward_modes)
        if envs % self.minibatch_envs == 0:
            return
        whose = f"envs={envs}" if not self.ab else (
            f"the {envs} envs of each policy (envs={self.envs}, ab={list(self.ab)})")
        divisors = ", ".join(str(d) for d in range(1, envs + 1) if envs % d == 0)
        raise ConfigError(f"minibatch_envs={self.minibatch_envs} does not divide {whose}; "
                          f"accepted: {divisors}")

    @property
    def world_size(self) -> int:
        """Processes of the run: ``devices`` (a count) times ``num_nodes`` under ddp, else 1."""
        if self.strategy == "auto":
            return 1
        return (int(self.devices[0]) if self.devices else 1) * self.num_nodes

    @property
    def reward_modes(self) -> tuple[str, ...]:
        """One policy is learned per mode: ``ab``, or just ``reward``."""
        return self.ab or (self.reward,)

    def learner_config(self, mode: str) -> PPORunConfig:
        """What one policy of an A/B run was trained with: its reward mode and its share of the
        envs (so its checkpoint reads like a run of its own)."""
        if not self.ab:
            return self
        return dataclasses.replace(self, reward=mode, envs=self.envs // len(self.ab), ab=())

    @property
    def env_devices(self) -> tuple[str, ...]:
        if self.strategy != "auto":  # each process puts its envs on its own device
            return (self.device,) * self.envs
        return self.devices_for(self.envs)


@dataclass(frozen=True)
class CompareConfig(TaskConfig):
    """A paired comparison of controllers (``esper-lightning compare``).

    Args:
        controllers: controllers to compare, each KIND or KIND:ARGUMENT of the arm kinds
            registered in `esper_lightning.app.compare.arms` (``esper-lightning compare --help``
            lists them: static, heuristic, random, policy:PATH, ...).
        seeds: evaluation episodes per controller; episode i has the same host initialisation,
            data order and augmentation for every controller.
        envs: envs in the lockstep pool (episodes run in chunks of this size).
        out: folder for the per-episode CSV, summary and plots (a rerun with the same settings
            and controllers resumes it; other settings, or a policy file whose content changed,
            are refused).
        reference: the controller every other one is compared with.
        all_pairs: also compare every pair of controllers.
        transfer_policies: let a policy:PATH play a host preset other than the one it was
            trained on (same task and slots; its observation is relative to the run: fractions
            of the budget, normalised statistics), e.g. a policy trained on lm-grow-cpu's
            grow2 evaluated on lm-grow's grow4.
        tune_heuristic: first tune the heuristic's main knobs on tuning episodes (disjoint from
            the evaluation episodes) and compare with the chosen configuration.
        tuning_seeds: tuning episodes per heuristic configuration (and per learning rate of
            tune_lr).
        arm_lr: a host learning rate per controller, NAME=LR (static=8e-3); the others train
            at host_lr (or their tune_lr choice).
        tune_lr: learning rates to try for every controller without an arm_lr (matched:NAME
            excepted): each plays tuning_seeds tuning episodes (disjoint from the evaluation
            episodes) per rate and keeps the best by the judged metric.
        speedup_reference: the controller whose final validation loss the speed-up table
            measures every controller's FLOPs to (null: reference).
        progress: show a progress bar.
    """

    controllers: tuple[str, ...] = ("static", "heuristic")
    seeds: int = 10
    envs: int = 4
    out: str = "compare"
    reference: str = "static"
    all_pairs: bool = False
    transfer_policies: bool = False
    tune_heuristic: bool = False
    tuning_seeds: int = 3
    arm_lr: tuple[str, ...] = ()
    tune_lr: tuple[float, ...] = ()
    speedup_reference: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, ("seeds", "envs", "tuning_seeds"))

        if not self.controllers:
            raise ConfigError("controllers must name at least one controller")
        if len(set(self.controllers)) != len(self.controllers):
            raise ConfigError(f"controllers lists one twice: {', '.join(self.controllers)}")
        for name in ("reference", "speedup_reference"):
            value = getattr(self, name)
            if value is not None and value not in self.controllers:
                raise ConfigError(f"{name} {value!r} is not among the controllers; "
                                  f"accepted: {', '.join(self.controllers)}")
        self.arm_lrs()  # checked now
        for lr in self.tune_lr:
            if not (math.isfinite(lr) and lr > 0):
                raise ConfigError(f"tune_lr must list learning rates > 0, got {lr!r}")
        if len(set(self.tune_lr)) != len(self.tune_lr):
            raise ConfigError(f"tune_lr lists a rate twice: {list(self.tune_lr)}")

    def arm_lrs(self) -> dict[str, float]:
        """``arm_lr`` as a mapping of controller to learning rate (checked)."""
        rates: dict[str, float] = {}
        for item in self.arm_lr:
            name, sep, text = item.rpartition("=")
            try:
                lr = float(text)
            except ValueError:
                lr = math.nan
            if not sep or not (math.isfinite(lr) and lr > 0):
                raise ConfigError(f"bad arm_lr {item!r}; accepted: NAME=LR with LR > 0, e.g. "
                                  f"{self.controllers[0]}=1e-3")
            if name not in self.controllers or name in rates:
                what = "names a controller twice" if name in rates else "is not a controller"
                raise ConfigError(f"arm_lr {item!r} {what}; accepted names: "
                                  f"{', '.join(self.controllers)}")
            rates[name] = lr
        return rates


#: Fields that shape the policy or the task: a checkpoint only resumes with equal values.
COMPATIBILITY_KEYS = (
    "task", "slots", "host_preset", "reward", "episode_length", "policy_hidden", "envs",
    "min_training_epochs", "max_seeds", "param_cost", "outcome", "heads", "blend_gradient",
    "layer_scale_init", "budget_flops", "budget_steps", "budget_scales", "lr_schedule",
    "warmup_fraction", "decay_fraction", "min_lr_ratio", "blueprints",
)
#: What a saved config (a checkpoint, a comparison folder) written before these keys existed
#: meant by leaving them out.
ADDED_KEY_DEFAULTS: dict[str, Any] = {
    "task": "cifar", "block_size": None, "blend_gradient": None, "layer_scale_init": None,
    "budget_flops": None, "budget_steps": None, "budget_scales": None, "lr_schedule": "constant",
    "warmup_fraction": 0.0, "decay_fraction": None, "min_lr_ratio": 0.0, "arm_lr": [],
    "tune_lr": [], "outcome": "accuracy", "blueprints": None,
}
#: Options of which a layer sets at most one: setting one clears the others.
EXCLUSIVE_KEYS = (("budget_flops", "budget_steps"),)
#: Keys whose default depends on the task (null in a layer: the task's own).
TASK_DEFAULTED_KEYS = ("host_preset", "slots", "host_lr")

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
}


def preset_values(preset: str, cls: type[TaskConfig] = PPORunConfig) -> dict[str, Any]:
    """The values a preset sets that ``cls`` has (a compare uses a PPO preset's task part)."""
    _check_choice("preset", preset, tuple(PRESETS))
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in PRESETS[preset].items() if k in known}


def from_mapping(values: Mapping[str, Any], base: ConfigT) -> ConfigT:
    """Apply ``values`` on top of ``base``; unknown keys are errors."""
    known = {f.name: f for f in fields(base)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(known)}"
        )
    coerced = {name: _coerce(name, value, type(base)) for name, value in values.items()}
    coerced = {**_follow_task(coerced, base), **_exclusive(coerced), **coerced}
    try:
        return dataclasses.replace(base, **coerced)
    except TypeError as err:
        raise ConfigError(str(err)) from None


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


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file '{path}': {err.strerror}") from None
    try:
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except Exception as err:  # any parser error is a user mistake in the file
        reason = str(err).splitlines()[0]
        raise ConfigError(f"cannot parse config file '{path}': {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
    return data


def compatibility_errors(saved: Mapping[str, Any], config: PPORunConfig) -> list[str]:
    """The compatibility keys whose saved value differs from ``config``."""
    current = config.to_dict()
    saved = {**ADDED_KEY_DEFAULTS, **saved}
    return [
        f"{key}={saved.get(key)!r} (now {current[key]!r})"
        for key in COMPATIBILITY_KEYS
        if _plain(saved.get(key)) != current[key]
    ]


def policy_checkpoint(path: str | Path, mode: str) -> Path:
    """Where an A/B run saves the policy of reward mode ``mode`` given ``path`` (``save`` or
    ``resume``): ``<stem>.<mode><suffix>``, e.g. ``ckpt.sparse.pt``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{mode}{path.suffix}")


#: Keys that describe one invocation, not the run: a resumed run does not take them from its
#: checkpoint, and they are not listed among its changes.
INVOCATION_KEYS = ("resume", "overwrite")


def saved_values(saved: Mapping[str, Any], cls: type[TaskConfig]) -> dict[str, Any]:
    """A saved configuration's values that ``cls`` has (keys it left out at their meaning then,
    `ADDED_KEY_DEFAULTS`), without the `INVOCATION_KEYS`: what a resumed run starts from."""
    known = {f.name for f in fields(cls)} - set(INVOCATION_KEYS)
    return {k: v for k, v in {**ADDED_KEY_DEFAULTS, **saved}.items() if k in known}


def config_differences(saved: Mapping[str, Any], config: TaskConfig) -> list[str]:
    """``key old -> new`` for every value of ``config`` that differs from the saved
    configuration (`INVOCATION_KEYS` aside)."""
    before = saved_values(saved, type(config))
    return [f"{key} {_plain(before.get(key))!r} -> {value!r}"
            for key, value in config.to_dict().items()
            if key in before and _plain(before[key]) != value]


def check_hardware(config: TaskConfig, devices: tuple[str, ...]) -> None:
    """Refuse devices and precisions this machine cannot run (one-line `ConfigError`)."""
    import torch  # only a run checks its hardware: parsing stays free of torch

    cuda = [d for d in devices if d.startswith("cuda")]
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


# --- the task's defaults -----------------------------------------------------------------------
def _task_defaults(task: TaskChoices) -> dict[str, Any]:
    return {"host_preset": task.default_preset, "slots": task.default_slots,
            "host_lr": task.default_host_lr}


def _resolve_task_defaults(config: TaskConfig) -> None:
    """Fill the task-dependent keys left null with the task's defaults (before any check)."""
    for name, value in _task_defaults(config.task_choices).items():
        if getattr(config, name) is None:
            object.__setattr__(config, name, value)


def _follow_task(values: Mapping[str, Any], base: TaskConfig) -> dict[str, Any]:
    """A layer that changes the task resets the task-dependent keys it does not set and that
    still hold the old task's default, so ``--task lm`` alone gets the lm host and slots."""
    task = values.get("task", base.task)
    if task == base.task or task not in TASK_CHOICES:
        return {}
    old = _task_defaults(base.task_choices)
    return {name: None for name in TASK_DEFAULTED_KEYS
            if name not in values and getattr(base, name) == old[name]}


def _exclusive(values: Mapping[str, Any]) -> dict[str, Any]:
    """A layer that sets one of `EXCLUSIVE_KEYS` clears the others it does not set (a preset's
    budget_flops gives way to a flag's budget_steps)."""
    cleared: dict[str, Any] = {}
    for group in EXCLUSIVE_KEYS:
        if any(values.get(key) is not None for key in group):
            cleared.update({key: None for key in group if key not in values})
    return cleared


def _check_budget(config: TaskConfig) -> None:
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
    if config.budgeted and config.task == "lm" and config.train_subset is not None:
        raise ConfigError(f"train_subset={config.train_subset} sets the training blocks of an "
                          "epoch, which a budget sets (budget / episode_length FLOPs per epoch); "
                          "accepted: train_subset null with a budget")


def _check_budget_scales(config: TaskConfig) -> None:
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


def _check_block_size(config: TaskConfig) -> None:
    if config.task != "lm":
        if config.block_size is not None:
            raise ConfigError(f"block_size is for task 'lm' only; task {config.task!r} takes "
                              f"null, got {config.block_size}")
        return
    limit = GPT_PRESETS[config.host_preset].block_size  # type: ignore[index]
    if config.block_size is not None and not 1 <= config.block_size <= limit:
        raise ConfigError(f"block_size must be in [1, {limit}] for host_preset "
                          f"{config.host_preset!r}, got {config.block_size}")
    if config.train_subset is not None and config.train_subset < config.batch_size:
        raise ConfigError(f"train_subset (training blocks per epoch) must be >= batch_size="
                          f"{config.batch_size} for task 'lm', got {config.train_subset}")


# --- checking ---------------------------------------------------------------------------------
@functools.cache
def field_types(cls: type[TaskConfig]) -> dict[str, tuple[bool, Any]]:
    """Each field of ``cls``: whether it may be null, and its type without the ``None`` (read
    from the dataclass's annotations, so a new field needs no list of its kind here)."""
    found = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        optional = type(None) in args and typing.get_origin(hint) in (typing.Union, types.UnionType)
        rest = tuple(a for a in args if a is not type(None))
        found[name] = (optional, rest[0] if optional and len(rest) == 1 else hint)
    return found


def _coerce(name: str, value: Any, cls: type[TaskConfig]) -> Any:
    """``value`` as field ``name`` of ``cls`` holds it (a list becomes a tuple, an int a float
    where the field is a float); a value of the wrong type is a one-line `ConfigError`."""
    optional, kind = field_types(cls)[name]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} must not be null")
    if typing.get_origin(kind) is tuple:
        numbers = typing.get_args(kind)[0] is float
        items = "numbers" if numbers else "strings"
        if isinstance(value, str) or not isinstance(value, list | tuple) or (numbers and not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
            raise ConfigError(f"{name} must be a list of {items}, got {value!r}")
        return tuple(float(v) for v in value) if numbers else tuple(str(v) for v in value)
    expected = str if typing.get_origin(kind) is Literal else kind
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be a {expected.__name__}, got {value!r}")
    return value


def _check_positive(config: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")


def _check_optional_positive(config: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1 or null, got {value}")


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low}, {high}], got {value}")


def _check_choice(name: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ConfigError(f"unknown {name} {value!r}; accepted: {', '.join(accepted)}")


def _check_slots(slots: tuple[str, ...] | None, accepted: tuple[str, ...]) -> None:
    if not slots:
        raise ConfigError(f"slots must name at least one slot; accepted: {', '.join(accepted)}")
    for slot in slots:
        _check_choice("slot", slot, accepted)
    if len(set(slots)) != len(slots):
        raise ConfigError(f"slots lists a slot twice: {', '.join(slots)}")


def _check_blueprint_names(config: TaskConfig) -> None:
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


def _check_device(device: str) -> None:
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ConfigError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
