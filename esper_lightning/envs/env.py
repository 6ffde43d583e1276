"""`MorphogenesisEnv`: one RL environment = one host model training on its task's data (CIFAR-10
images, or byte-level text: `envs.tasks`) under its own Lightning Fabric.

One RL step is one host epoch. The env never drives itself: the `EnvPool` calls, in lockstep over
all envs, `execute` (the controller's action, then the epoch tick), `train_batch` while
`epoch_open`, `validate` and `finish_step`, which observes the new state and returns a `Step`:
the observation, the reward of the transition (`rl.rewards.compute_reward` under the episode's
`RewardConfig`) and whether the episode ended (`rl.episodes.is_terminal`), as CleanRL's
``env.step`` returns them. Whoever plays the env, PPO or `compare`, reads the same numbers.
Nothing is copied to the host until `observe`, which reads all of the epoch's numbers in one
transfer (but for the gradient health at its cadence and, while a live seed runs, one flag per
step that catches a non-finite seed before the step, `train_batch`). On request
(``cuda_stream=True``) every kernel of a CUDA env runs on a stream of its own, synchronised
once in `observe`; off by default, because on an H100 and an H200 the streams made a four-env
pool's epoch 1-18 % slower in each of six runs (docs/benchmarks.md): these hosts are
launch-bound, so there is nothing for streams to overlap.

Every training step is metered (`core.flops.FlopMeter`, once per architecture, on meta tensors:
training numerics are untouched) into the env's `core.compute.ComputeLedger` (``env.ledger``,
one for all its episodes: its meter's cache outlives the hosts): the episode's training FLOPs
(the host's share as ``train``, what live seeds add as ``growth``; the budget counts both), its
budget, the slice of each decision and the learning rate's multiplier; validation and the
counterfactual's extra configurations are counted apart, by kind (``env.ledger.flops``, copied
into each `Observation`; `ComputeLedger.begin_step`, ``end_step``, ``charge_validation``).

**Under a compute budget** (`EnvSpec.budget_flops`) an episode of ``episode_length`` epochs
spends the budget in equal slices: epoch ``k`` (1-based; the first trains before the first
decision) trains while the episode's training FLOPs are below ``k × budget / episode_length``.
So a bigger host takes fewer batches per epoch, every epoch ends within one batch past its
mark, and the episode ends within one batch past the budget. An epoch is then a slice of
compute, not a pass over the data: batches come from the task's endless `Task.train_stream`
(text: non-overlapping blocks without replacement from a random offset per pass).

**Budgets that vary by episode** (`EnvSpec.budget_scales`): each episode's budget is one of those
multiples of ``budget_flops``, drawn uniformly by `draw_budget_scale` from the episode's rng seed
alone, so every controller that plays an episode, and every replay of a rollout, gets the same
budget; with `EnvSpec.budget_range` it is drawn log-uniformly from a range instead
(`draw_budget_in_range`), so no two episodes share a budget. The report carries the scale
(`EpochReport.budget_scale`) for the policy to observe.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric
from torch import Tensor

from esper_lightning.core.actions import Action
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.counterfactual import CounterfactualAccumulator, make_plan
from esper_lightning.core.divergence import Governor, GovernorConfig
from esper_lightning.core.engine import MorphogenesisEngine, StepOutcome
from esper_lightning.core.flops import host_structure, structure
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.report import EpochReport
from esper_lightning.core.rollback import roll_back
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.snapshot import Snapshot, take_snapshot
from esper_lightning.envs.tasks import CifarTask, Task
from esper_lightning.rl.episodes import is_terminal
from esper_lightning.rl.rewards import RewardBreakdown, RewardConfig, compute_reward
from esper_lightning.schedule import LRSchedule, set_base_lrs


@dataclass(frozen=True)
class EnvSpec:
    """What every env of a pool shares.

    A governor rollback never ends an episode: live seeds are pruned, the last snapshot is
    restored in place and the episode goes on, with the routine `GovernorCallback` calls in a
    Trainer (`core.rollback.roll_back`). Learning and evaluating a controller see the same
    consequences (docs/rl.md, "Episode ends").

    ``task`` is what the envs learn (`envs.tasks`): its data, host presets and slot ids, loss
    and number of classes; ``host_preset`` and ``slots`` must be the task's.

    ``seeding`` is how seeds grow in every env's host (`core.seeding.SeedingConfig`, where each
    option is documented; by default its defaults with the default `GateConfig` for every
    slot); its ``timing``, if any, counts decisions (one per env epoch).

    ``budget_flops`` is each episode's compute budget in training FLOPs (None: epochs of data;
    the module docstring says how a budget is spent), ``lr_schedule`` the learning-rate schedule
    over the fraction of the episode spent (`esper_lightning.schedule`; the budget fraction, or
    the share of the planned batches without a budget). ``budget_scales`` (None: every episode gets
    ``budget_flops``) are the multiples of ``budget_flops`` an episode draws its budget from
    (`budget_scale`); ``budget_range`` (``(low, high)``, instead of ``budget_scales``) draws the
    multiple log-uniformly from that range. ``reward`` is what a step's reward measures (an
    episode may play under another, `MorphogenesisEnv.reset`: the two policies of an A/B run).
    """

    host_preset: str = "baseline"
    slots: tuple[str, ...] = ("r0c1",)
    batch_size: int = 128
    host_lr: float = 0.01
    precision: str = "32-true"
    episode_length: int = 20
    seeding: SeedingConfig = field(
        default_factory=lambda: SeedingConfig(gate_config=GateConfig()))
    governor: GovernorConfig = field(default_factory=lambda: GovernorConfig(num_classes=10))
    task: Task = field(default_factory=CifarTask)
    budget_flops: float | None = None
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)
    budget_scales: tuple[float, ...] | None = None
    budget_range: tuple[float, float] | None = None
    reward: RewardConfig = field(default_factory=RewardConfig)

    def __post_init__(self) -> None:
        self.task.check_preset(self.host_preset)
        if not isinstance(self.seeding, SeedingConfig):
            raise TypeError(f"seeding must be a SeedingConfig, got {type(self.seeding).__name__}")
        self.seeding.fixed_durations()  # an env decides once per epoch: decisions only
        if self.budget_flops is not None and not self.budget_flops > 0:
            raise ValueError(f"budget_flops must be > 0 or None, got {self.budget_flops!r}")
        scales = self.budget_scales
        if scales is not None and (self.budget_flops is None or not scales
                                   or not all(s > 0 for s in scales)):
            raise ValueError(f"budget_scales must be numbers > 0 that scale a budget_flops, got "
                             f"{scales!r} with budget_flops={self.budget_flops!r}")
        span = self.budget_range
        if span is not None and (self.budget_flops is None or scales is not None
                                 or len(span) != 2 or not 0 < span[0] < span[1]):
            raise ValueError(f"budget_range must be (low, high) with 0 < low < high, scaling a "
                             f"budget_flops, without budget_scales; got {span!r} with "
                             f"budget_flops={self.budget_flops!r}, budget_scales={scales!r}")

    def budget_scale(self, episode_rng_seed: int) -> float:
        """The multiple of ``budget_flops`` that is the budget of the episode of this rng seed:
        `draw_budget_scale` of ``budget_scales``, `draw_budget_in_range` of ``budget_range``,
        1 without either."""
        if self.budget_range is not None:
            return draw_budget_in_range(self.budget_range, episode_rng_seed)
        if self.budget_scales is None:
            return 1.0
        return draw_budget_scale(self.budget_scales, episode_rng_seed)


#: Keys the generator of an episode's budget among everything drawn from its rng seed (torch
#: generators seeded with it draw the host's and seeds' weights and the data order).
BUDGET_STREAM = 0xB0D6E7


def smallest_budget_flops(step_flops: int, episode_length: int) -> int:
    """The smallest episode budget that gives each of ``episode_length`` equal slices at least one
    training batch of ``step_flops``: the one rule both the env (at reset) and the configuration
    check (`esper_lightning.app.task.budget_flops`, at the smallest budget scale) apply.

    Example:
        >>> smallest_budget_flops(1_000, 10)
        10000
    """
    return step_flops * episode_length


def draw_budget_scale(scales: Sequence[float], episode_rng_seed: int) -> float:
    """One of ``scales``, uniformly, as a pure function of the episode's rng seed: from a
    generator of its own (a NumPy stream keyed by the rng seed and `BUDGET_STREAM`), never a
    global one, so the episode has this budget for every controller and in every replay.

    Example:
        >>> draw_budget_scale((0.5, 1.0, 2.0), 7) == draw_budget_scale((0.5, 1.0, 2.0), 7)
        True
    """
    rng = np.random.default_rng([episode_rng_seed, BUDGET_STREAM])
    return float(scales[int(rng.integers(len(scales)))])


def draw_budget_in_range(span: Sequence[float], episode_rng_seed: int) -> float:
    """A multiple of the base budget drawn log-uniformly from ``span`` (low, high), as a pure
    function of the episode's rng seed (the generator of `draw_budget_scale`), so budgets
    spread evenly over the factors of two of the range and episode i has its budget for every
    controller and in every replay.

    Example:
        >>> scale = draw_budget_in_range((0.25, 4.0), 7)
        >>> scale == draw_budget_in_range((0.25, 4.0), 7) and 0.25 <= scale <= 4.0
        True
    """
    low, high = span
    rng = np.random.default_rng([episode_rng_seed, BUDGET_STREAM])
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


@dataclass(frozen=True)
class Observation:
    """The env's state after an epoch, and whether the governor rolled it back.

    Attributes:
        report: what the controller sees next.
        rollback_reason: the governor's reason when it rolled the env back during this epoch
            (the report is of the restored state), else None.
        train_loss: mean training loss of the epoch; None when it trained no batch.
        data_passes: training data seen this episode over the training data's size (tokens
            or images): below 1, nothing was trained on twice within a budgeted episode.
        flops: the FLOPs this episode has spent so far by kind (a copy of the ledger's,
            `core.compute.FLOP_KINDS`: ``train``, ``growth``, ``validation``,
            ``counterfactual``).
    """

    report: EpochReport
    rollback_reason: str | None
    train_loss: float | None
    data_passes: float = 0.0
    flops: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """What one env step returns, as CleanRL's ``obs, reward, terminated``.

    Attributes:
        observation: the state after the epoch: what the controller sees next.
        reward: the transition's reward by component (``reward.total`` is the number), under
            the episode's `RewardConfig`; a governor rollback is charged here and the episode
            goes on.
        terminated: the episode reached its last decision (`rl.episodes.is_terminal`).
        outcome: what the engine executed (an illegal action became WAIT).
    """

    observation: Observation
    reward: RewardBreakdown
    terminated: bool
    outcome: StepOutcome


class MorphogenesisEnv:
    """One host model, its optimizer, engine and governor under its own `Fabric`.

    Args:
        index: position in the pool (names the env in logs).
        spec: the pool-wide settings.
        train, val: the task's training and validation data (`Task.load`), on any device.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        test: the task's test split (`Task.load_test`), None without one (`test`).
        cuda_stream: run this env's kernels on a CUDA stream of its own (a CUDA device only;
            off by default: the module docstring says why).

    Raises:
        ValueError: ``cuda_stream`` on a device that is not CUDA.
    """

    def __init__(
        self,
        index: int,
        spec: EnvSpec,
        train: Any,
        val: Any,
        device: str = "cpu",
        test: Any = None,
        cuda_stream: bool = False,
    ) -> None:
        self.index, self.spec = index, spec
        kind, _, number = device.partition(":")
        if cuda_stream and kind != "cuda":
            raise ValueError(f"cuda_stream=True needs a CUDA device, got device={device!r}")
        devices: list[int] | int = [int(number)] if number else 1
        self.fabric = Fabric(accelerator=kind, devices=devices, precision=spec.precision)
        self.device = self.fabric.device
        self.stream = torch.cuda.Stream(self.device) if cuda_stream else None
        self.task = spec.task
        self.loader = self.task.train_loader(train, spec.batch_size, self.device)
        self.val_batches = self.task.validation_batches(val, self.device)
        self.test_batches = (None if test is None
                             else self.task.validation_batches(test, self.device))
        self.corpus_size = self.task.corpus_size(train)
        #: The compute of every episode of this env (`reset` per episode).
        self.ledger = ComputeLedger(spec.budget_flops, spec.lr_schedule, spec.episode_length)
        self.engine: MorphogenesisEngine | None = None
        self.governor = Governor(spec.governor)
        self.episode_rng_seed = 0
        self.reward_config = spec.reward  # this episode's (`reset`)
        self._decisions = 0  # decisions this episode
        self._state: EpochReport | None = None  # the last observed state, s_t of the next step
        self._batches: Any = None
        self._stream: Any = None  # the episode's batches under a budget
        self._arch: Any = None  # the host's `core.flops.structure` this epoch
        self._host_arch: Any = None  # and with its live seeds off (`core.flops.host_structure`)
        self._loss_sum: Tensor | None = None
        self._accumulator: CounterfactualAccumulator | None = None
        self.snapshot: Snapshot | None = None
        self._snapshot_fossils = 0
        self._steps = 0  # optimizer steps this episode
        self._first_of_epoch = True
        self._epoch = 0  # epochs started this episode
        self._epoch_batches = 0
        self._spoiled_batches = 0  # this epoch's batches whose step a non-finite seed spoiled
        self._samples_seen = 0

    # --- episode ------------------------------------------------------------------------------
    def reset(self, episode_rng_seed: int, implants: Sequence[tuple[str, str]] = (),
              host_lr: float | None = None, reward: RewardConfig | None = None) -> None:
        """Start an episode: a fresh host (initialised from ``episode_rng_seed``), its own
        optimizer (the host's `configure_optimizers`) and a fresh governor.

        ``implants`` are ``(slot id, blueprint)`` pairs of seeds fossilized from birth (the
        "born grown" baseline, `MorphogenesisEngine.implant`), drawn from the same rng seed.
        ``host_lr`` is this episode's learning rate (None: the spec's): every arm of a
        comparison can train at its own tuned rate. The episode's budget is drawn from its rng
        seed (`EnvSpec.budget_scale`). ``reward``: what this episode's steps reward (None: the
        spec's).
        """
        self.episode_rng_seed = episode_rng_seed
        self.reward_config = self.spec.reward if reward is None else reward
        self._decisions, self._state = 0, None
        scale = self.spec.budget_scale(episode_rng_seed)
        base = self.spec.budget_flops
        self.ledger.reset(None if base is None else base * scale, scale)
        precision = self.fabric.strategy.precision
        if getattr(precision, "scaler", None) is not None:
            # A fresh loss scale per episode: an episode depends on its rng seed, not on history.
            precision.scaler = torch.amp.GradScaler(self.device.type)
        lr = self.spec.host_lr if host_lr is None else host_lr
        with _forked_rng(episode_rng_seed):
            host = self.task.make_host(self.spec.host_preset, self.spec.slots, lr)
        self._check_budget(host)
        optimizer = single_optimizer(host)
        self.model, self.optimizer = self.fabric.setup(host, optimizer)
        self.host = host
        self.engine = MorphogenesisEngine(host, seeding=self.spec.seeding,
                                          rng_seed=episode_rng_seed, compute=self.ledger)
        self.engine.attach_optimizer(self.optimizer.optimizer)
        for slot_id, blueprint in implants:
            self.engine.implant(slot_id, blueprint)
        set_base_lrs(self.optimizer.optimizer.param_groups)  # what the schedule scales
        self._steps = self._epoch = self._samples_seen = 0
        self.governor.reset()
        self.loader.reseed(episode_rng_seed)
        self._stream = (None if self.budget_flops is None
                        else self.task.train_stream(self.loader))
        self.snapshot = self._take_snapshot()

    def _check_budget(self, host: Any) -> None:
        """Refuse a budget whose slice per epoch is smaller than one training batch of the
        host as born (every epoch must be able to train)."""
        budget, epochs = self.budget_flops, self.spec.episode_length
        if budget is None:
            return
        step = self.ledger.meter.training_step(host, self.task.example_batch(self.spec.batch_size))
        least = smallest_budget_flops(step, epochs)
        if budget < least:
            raise ValueError(f"budget_flops={budget:g} gives each of the {epochs} epochs "
                             f"{budget / epochs:g} FLOPs, less than one training batch of the "
                             f"host ({step}); accepted: at least {least}")

    def execute(self, action: Action) -> StepOutcome:
        """Execute the controller's action, then tick every slot (end of the decision).

        Raises:
            RuntimeError: the episode is over (`reset` first) or not yet observed.
        """
        if self._state is None:
            raise RuntimeError(f"env {self.index}: observe the episode's first epoch before a "
                               "step")
        if is_terminal(self._decisions, self.spec.episode_length):
            raise RuntimeError(f"env {self.index}: the episode ended after {self._decisions} "
                               "decisions; reset before the next step")
        engine = self._engine()
        # A new seed's initial weights depend on this env's episode and epoch only, never on
        # what other envs drew from the global generator before.
        with self._on_stream():  # new seed weights come from the engine's own rng seed
            outcome = engine.execute(action)
            engine.tick()
        if (engine.event_counts()["fossilized"] > self._snapshot_fossils
                and self.governor.consecutive_anomalies == 0):
            # Before the epoch that first trains the new fossil: a rollback in it restores
            # the fossil's weights too (the last snapshot does not hold them).
            self.snapshot = self._take_snapshot()
        return outcome

    # --- lockstep epoch -----------------------------------------------------------------------
    def start_epoch(self) -> int | None:
        """Begin a training epoch; returns its number of batches (None under a budget: the
        epoch trains until its slice is spent, `epoch_open`)."""
        budgeted = self.budget_flops is not None
        self._epoch += 1
        if budgeted and self._epoch > self.spec.episode_length:
            raise RuntimeError(f"env {self.index}: the episode's {self.spec.episode_length} "
                               "epochs have spent its budget; reset() first")
        self._join_default_stream()
        with self._on_stream():  # the epoch's permutation and augmentation are drawn here
            self._batches = self._stream if budgeted else iter(self.loader)
            self._loss_sum = torch.zeros((), device=self.device)
        self._first_of_epoch = True
        self._epoch_batches = self._spoiled_batches = 0
        self.model.train()
        self._arch = structure(self.host)  # the architecture is fixed until the next decision
        self._host_arch = host_structure(self.host, self._arch)
        return None if budgeted else len(self.loader)

    def epoch_open(self) -> bool:
        """Whether this epoch trains another batch: one pass over the loader, or, under a
        budget, while the episode's training FLOPs are below this epoch's mark."""
        if self.budget_flops is None:
            return self._epoch_batches < len(self.loader)
        return self.ledger.train_flops < self.ledger.slice_end(self._epoch)

    @property
    def budget_flops(self) -> float | None:
        """This episode's budget in training FLOPs (None: none; the ledger's)."""
        return self.ledger.budget_flops

    @property
    def budget_scale(self) -> float:
        """This episode's budget over the spec's (the ledger's)."""
        return self.ledger.budget_scale

    def train_batch(self) -> None:
        """One optimizer step on the next batch, metered. Nothing is read back to the host,
        except the gradient health at the engine's cadence (the same as in a Trainer) and, while
        a live seed runs, one flag vector per step: a seed whose output or gradients are not
        finite is pruned before the step (`MorphogenesisEngine.prune_nonfinite`)."""
        engine = self._engine()
        with self._on_stream():
            x, y = next(self._batches)
            # The cost, and the learning rate at the middle of the batch (of the budget, or of
            # the planned batches without one).
            cost = self.ledger.begin_step(self.host, x, arch=self._arch,
                                          host_arch=self._host_arch,
                                          param_groups=self.optimizer.optimizer.param_groups,
                                          step=self._steps,
                                          planned_steps=self.spec.episode_length
                                          * len(self.loader))
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.task.loss(self.model(x), y)
            self.fabric.backward(loss)
            scaled = getattr(self.fabric.strategy.precision, "scaler", None) is not None
            dropped = engine.dropped_steps
            # Before the step (and the scaler's unscale): a non-finite seed leaves with its
            # param group, so the host steps as it would without it.
            engine.prune_nonfinite(scaled=scaled)
            spoiled = engine.dropped_steps != dropped  # the host did not move on this batch
            self.optimizer.step()  # unscales the gradients under 16-mixed before stepping
            # The step index before counting this one, as a Trainer's global_step.
            if engine.gradient_stats_due(self._steps, self._first_of_epoch):
                engine.capture_gradient_stats(scaled=scaled)
            self._steps += 1
            self._first_of_epoch = False
            if spoiled:  # a seed's NaN, not the host's loss: the governor must not read it
                self._spoiled_batches += 1
            else:
                self._loss_sum = self._loss_sum + loss.detach().float()
        self.ledger.end_step(cost)  # the episode's slices say when it stops (`epoch_open`)
        self._samples_seen += self.task.batch_units(x)
        self._epoch_batches += 1

    def validate(self) -> None:
        """Counterfactual validation: accuracy with and without each blending seed."""
        engine = self._engine()
        self._join_default_stream()
        self.model.eval()
        plan = make_plan(engine.slots)
        with self._on_stream(), torch.no_grad():
            accumulator = CounterfactualAccumulator(plan)
            for x, y in self.val_batches:
                accumulator.update(self.model, x, y, engine.slots)
        self._accumulator = accumulator
        arch = structure(self.host)
        meter = self.ledger.meter
        for x, _ in self.val_batches:  # metered apart: validation never spends the budget
            main = meter.forward(self.host, x, arch=arch)
            every = meter.counterfactual(self.host, x, engine.slots, plan, str(accumulator.mode),
                                         arch=arch)
            # The plan's main configuration is this validation's forward.
            self.ledger.charge_validation(main, every, forward_included=True)

    def observe(self) -> Observation:
        """Synchronise this env's stream once (where it has one of its own), read the epoch's
        numbers, consult the governor and return the state the controller sees next."""
        engine, accumulator = self._engine(), self._accumulator
        assert accumulator is not None, "validate() before observe()"
        assert self._loss_sum is not None, "train an epoch before observe()"
        if self.stream is not None:
            self.stream.synchronize()
        accuracies, val_loss, extra = accumulator.read(self._loss_sum)  # one transfer
        batches = self._epoch_batches - self._spoiled_batches  # the host's own losses
        train_loss = float(extra[0]) / batches if batches else None
        contributions = accumulator.contributions(accuracies)
        engine.record_epoch(accuracies["main"], val_loss, train_loss, contributions,
                            accumulator.standard_errors())
        reason = None if train_loss is None else self.governor.check_train_loss(train_loss)
        if reason is None:
            reason = self.governor.check_validation(val_loss, num_classes=self.task.num_classes)
        self._restore_or_snapshot(reason)
        report = engine.report(max_epochs=self.spec.episode_length)
        self._state = report
        return Observation(report, reason, train_loss, self.data_passes, dict(self.ledger.flops))

    def finish_step(self, outcome: StepOutcome) -> Step:
        """After `execute` and the epoch's training and validation: observe the new state and
        return the step's reward and whether the episode ended."""
        before = self._state
        assert before is not None, "execute() before finish_step()"
        observation = self.observe()
        self._decisions += 1
        terminated = is_terminal(self._decisions, self.spec.episode_length)
        reward = compute_reward(  # a rollback restored the env; the episode goes on
            before, outcome.executed, observation.report, self.reward_config,
            terminal=terminated, rollback=observation.rollback_reason is not None)
        return Step(observation, reward, terminated, outcome)

    @torch.no_grad()
    def test(self) -> tuple[float, float]:
        """The host's mean loss (per token for a language model) and accuracy (percent) on
        the test split as it is now: for final tables, never for a decision.

        Raises:
            RuntimeError: The env was built without a test split.
        """
        if self.test_batches is None:
            raise RuntimeError(f"env {self.index} has no test split; pass test= to the pool")
        self._join_default_stream()
        self.model.eval()
        loss = correct = count = 0.0
        with self._on_stream():
            for x, y in self.test_batches:
                logits = self.model(x)
                flat = logits.reshape(-1, logits.shape[-1])  # every token (or image)
                loss += float(torch.nn.functional.cross_entropy(flat, y.reshape(-1),
                                                                reduction="sum"))
                correct += float((flat.argmax(-1) == y.reshape(-1)).sum())
                count += y.numel()
        self.model.train()
        return loss / count, 100.0 * correct / count

    @property
    def data_passes(self) -> float:
        """Training data seen this episode over its size (tokens or images)."""
        return self._samples_seen / self.corpus_size

    # --- rollback in place ---------------------------------------------------------------------
    def _restore_or_snapshot(self, reason: str | None) -> None:
        engine = self._engine()
        if reason is not None:
            roll_back(self.snapshot, self.host, self.governor, reason, prune=engine.prune_live,
                      optimizer=self.optimizer.optimizer, scaler=self._scaler())
        elif self.governor.consecutive_anomalies == 0:
            fossilized = engine.event_counts()["fossilized"]
            if self.governor.should_snapshot(engine.epoch, fossilized > self._snapshot_fossils):
                self.snapshot = self._take_snapshot()

    def _take_snapshot(self) -> Snapshot:
        self._snapshot_fossils = self._engine().event_counts()["fossilized"]
        return take_snapshot(self.host, self.optimizer.optimizer, self._scaler())

    def _scaler(self) -> Any:
        return getattr(self.fabric.strategy.precision, "scaler", None)

    # --- helpers ------------------------------------------------------------------------------
    def _engine(self) -> MorphogenesisEngine:
        if self.engine is None:
            raise RuntimeError(f"env {self.index}: reset() before use")
        return self.engine

    def _on_stream(self) -> Any:
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def _join_default_stream(self) -> None:
        """Order this env's stream after work queued on the default stream (new host weights
        from `reset`, the validation tensors, a freshly built seed): a device-side wait."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))


@contextmanager
def _forked_rng(rng_seed: int) -> Iterator[None]:
    """Seed every generator for a block and restore them after: ``manual_seed`` also reseeds
    each CUDA device, so all of them are forked, not only this env's."""
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        torch.manual_seed(rng_seed)
        yield


def single_optimizer(host: Any) -> torch.optim.Optimizer:
    """The one optimizer of ``host.configure_optimizers()`` (a bare optimizer, a one-element
    list or tuple, or a dict with ``"optimizer"``); an env steps no LR scheduler, because one
    episode is one short run whose length the host's schedule does not know."""
    configured = host.configure_optimizers()
    if isinstance(configured, list | tuple) and len(configured) == 1:
        configured = configured[0]
    if isinstance(configured, dict):
        configured = configured.get("optimizer")
    if not isinstance(configured, torch.optim.Optimizer):
        raise TypeError(
            f"{type(host).__name__}.configure_optimizers() must return one optimizer (or a dict "
            f"with 'optimizer') for an env, got {type(configured).__name__}"
        )
    return configured
