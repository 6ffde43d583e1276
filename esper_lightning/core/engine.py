"""`MorphogenesisEngine`: the framework-agnostic core of morphogenetic training.

The Lightning callback and the Fabric RL environments both drive one engine per model:

1. slots are found (`SeedSlot` modules) or injected after named submodules (`injection.py`);
2. once per epoch the caller records validation results, asks a controller for an `Action` with
   `report()`, runs it with `execute()` (illegal actions become WAIT with a reason) and then
   `tick()`s every slot exactly once;
3. the optimizer stays in step: every seed trains in a param group ``seed/<slot>`` that appears
   and disappears with it (`attach_optimizer`);
4. the compute it spends is its `ComputeLedger`'s (`core.compute`), shared with whoever owns it:
   a report carries the training FLOPs spent and the budget from there.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from esper_lightning import blueprints as blueprint_registry
from esper_lightning.blueprints.growth import operator_of
from esper_lightning.core.actions import (
    HEADS,
    Action,
    LifecycleOp,
    MaskContext,
    action_error,
    compute_masks,
)
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.depth import DepthGrowth
from esper_lightning.core.injection import resolve_slots
from esper_lightning.core.lifecycle import (
    LIVE_STAGES,
    GateResult,
    QualityGates,
    SeedStage,
)
from esper_lightning.core.nonfinite import blamed_seeds, gradients_nonfinite, read_flags
from esper_lightning.core.optim import (
    SeedOptimConfig,
    add_seed_group,
    copy_moments,
    name_host_groups,
    seed_group_names,
    seed_groups,
    slot_of_group,
    strip_params,
    sync_seed_groups,
)
from esper_lightning.core.report import HISTORY_WINDOW, EpochReport
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import (
    BLEND_GUARDS,
    SeedSlot,
    host_parameters,
    prune_live,
)

log = logging.getLogger(__name__)

_WAIT = Action()
#: The prune reason of a seed whose output or gradients were not finite (`prune_nonfinite`).
SEED_NONFINITE = "seed_nonfinite"


@dataclass(frozen=True)
class LifecycleEvent:
    """A seed germinated, fossilized or pruned (with the reason)."""

    epoch: int
    slot_id: str
    kind: str  # "germinated" | "fossilized" | "pruned" | "implanted"
    blueprint: str
    reason: str


@dataclass(frozen=True)
class TimelineEntry:
    """One slot after the decision of one epoch: what `viz.timeline` draws.

    ``stage`` is the `SeedStage` name (plain data, so checkpoints load with
    ``weights_only=True``); ``blueprint`` and ``seed_id`` are None for an empty slot.
    """

    epoch: int
    slot_id: str
    stage: str
    alpha: float
    blueprint: str | None
    seed_id: str | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What happened to one requested action."""

    requested: Action
    executed: Action  # WAIT when the request was illegal
    success: bool
    reason: str | None  # why it was refused, or which gate checks failed
    gate: GateResult | None


class MorphogenesisEngine:
    """Owns the slots of one model and applies lifecycle actions to them.

    Args:
        model: the host network.
        slots: slot ids of `SeedSlot` modules already in ``model`` and/or dotted module paths
            (as in ``model.named_modules()``) after which a slot is injected. None: every
            `SeedSlot` in the model.
        seeding: how seeds grow in every slot: allowed blueprints, seed limit, gates, blend
            gradient, LayerScale gain, seed optimizer, gradient-statistics cadence, lifecycle
            durations in decisions (`core.seeding.SeedingConfig`, where each is documented;
            None: its defaults).
        topology: ``"cnn"``, ``"transformer"`` or ``"linear"`` for injected slots; None infers
            it from the rank of each slot's first activation (4: cnn, 3: transformer, 2:
            linear). Until then `topology` is None and reports wait for a forward pass.
        rng_seed: a new seed's initial weights are drawn from a generator seeded with
            (``rng_seed``, epoch), so they depend on the run and the epoch only — never on what
            else drew from the global generator (data loading, other envs). None: the global
            generator as it is.
        growth: where the model grows deeper (`core.depth.DepthGrowth`): growth slots after
            blocks of a stack of same-shape blocks, whose seeds are new blocks of the stack's
            own class. Growth blueprints (``block_*``) are allowed only in a run that has a
            growth slot (its own, or a host's such as `GPTHost`'s ``r1c*``).
        compute: the run's `ComputeLedger` (its owner's: a `ComputeBudget`, the callback, an
            env); None: a ledger of its own, without a budget.

    Example:
        >>> model = nn.Module()
        >>> model.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
        >>> engine = MorphogenesisEngine(model, slots=["net.1"])
        >>> _ = model.net(torch.zeros(1, 3, 8, 8))  # infers the slot width
        >>> from esper_lightning.core.actions import LifecycleOp
        >>> engine.execute(Action(LifecycleOp.GERMINATE, 0, blueprint="norm")).success
        True
    """

    def __init__(
        self,
        model: nn.Module,
        slots: Sequence[str] | None = None,
        *,
        seeding: SeedingConfig | None = None,
        topology: str | None = None,
        rng_seed: int | None = None,
        growth: DepthGrowth | None = None,
        compute: ComputeLedger | None = None,
    ) -> None:
        if seeding is not None and not isinstance(seeding, SeedingConfig):
            raise TypeError(f"seeding must be a SeedingConfig or None, got "
                            f"{type(seeding).__name__}")
        self._seeding = seeding = seeding or SeedingConfig()
        durations = seeding.fixed_durations()  # refused before any slot is injected
        self.model = model
        self.rng_seed = rng_seed
        self.slots = resolve_slots(model, slots, topology, growth)
        self._set_slot_settings(seeding)
        if durations:
            self.set_timing(durations)
        self._allowed = seeding.blueprints
        self._max_seeds = seeding.max_seeds
        self._mask_context: MaskContext | None = None
        if self.topology is not None:  # check the blueprints now, not at the first report
            self._mask_context = self._make_mask_context()
        self.optimizer: Optimizer | None = None
        self.schedulers: list[Any] = []
        self.epoch = 0
        self.last_action: Action | None = None
        self.last_action_success = True
        self.accuracy_history: deque[float] = deque(maxlen=HISTORY_WINDOW)
        self.loss_history: deque[float] = deque(maxlen=HISTORY_WINDOW)
        #: Seed parameters at each recorded accuracy (the outcome charges their mean).
        self.seed_params_history: deque[int] = deque(maxlen=HISTORY_WINDOW)
        self.train_loss: float | None = None
        self.events: list[LifecycleEvent] = []
        self._controller_name = "policy"
        self._tick = "epoch"  # what a decision is called in event lines (`label`)
        self._compute = compute if compute is not None else ComputeLedger()
        self._log: logging.Logger | logging.LoggerAdapter[logging.Logger] = log
        #: Every slot's stage and alpha after each decision (appended by `tick`).
        self.timeline: list[TimelineEntry] = []
        self._pending_group_order: list[str] | None = None
        self._guard_blends()

    def _guard_blends(self) -> None:
        """Watch for seeds that spoil a step (`prune_nonfinite`)."""
        #: Optimizer steps whose gradients a non-finite seed spoiled, which did not move the
        #: host (`prune_nonfinite`); the governor does not count their losses as the host's.
        self.dropped_steps = 0
        #: The host's buffers (and their values) before this step's first blending forward.
        self._kept_buffers: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        for slot in self.slots.values():
            BLEND_GUARDS[slot] = weakref.WeakMethod(self._keep_buffers)

    # --- slots --------------------------------------------------------------------------------
    def _set_slot_settings(self, seeding: SeedingConfig) -> None:
        """Give every slot the settings ``seeding`` gives (the others keep the slot's own)."""
        for slot in self.slots.values():
            gates = None
            if seeding.gate_mode is not None or seeding.gate_config is not None:
                mode = seeding.gate_mode or slot.gates.mode
                gates = QualityGates(mode, seeding.gate_config or slot.gates.config)
            slot.configure(gates, seeding.blend_gradient, seeding.layer_scale_init)

    @property
    def seeding(self) -> SeedingConfig:
        """How seeds grow in this run (`core.seeding.SeedingConfig`)."""
        return self._seeding

    @property
    def seed_optim(self) -> SeedOptimConfig:
        """Hyper-parameters of the seed param groups (``seeding.seed_optim``)."""
        return self._seeding.seed_optim

    @property
    def grad_stats_every(self) -> int:
        """Optimizer steps between gradient-health measurements (``seeding``'s)."""
        return self._seeding.grad_stats_every

    def set_timing(self, durations: Mapping[str, int]) -> None:
        """Lifecycle durations in decisions for every slot (`core.timing.SeedTiming.resolve`):
        ``incubation`` (G2's ``min_training_epochs``), ``hold`` (G3's ``min_blending_epochs``),
        ``blend`` (the ramp of seeds germinated from now on, unless their blueprint paces
        itself) and ``embargo`` (decisions a pruned slot stays EMBARGOED)."""
        unknown = set(durations) - {"incubation", "hold", "blend", "embargo"}
        if unknown:
            raise ValueError(f"unknown lifecycle durations {sorted(unknown)}; accepted: "
                             "incubation, hold, blend, embargo")
        gates = {"incubation": "min_training_epochs", "hold": "min_blending_epochs"}
        changes = {gates[k]: v for k, v in durations.items() if k in gates}
        for slot in self.slots.values():
            if changes:
                slot.configure(QualityGates(slot.gates.mode,
                                            dataclasses.replace(slot.gates.config, **changes)))
            slot.set_timing(durations.get("embargo"), durations.get("blend"))

    @property
    def topology(self) -> str | None:
        """The slots' topology; None while a slot still infers its own (no forward pass yet)."""
        return _common_topology(self.slots.values())

    @property
    def mask_context(self) -> MaskContext:
        """The blueprints controllers may germinate and the seed limit (known once the
        topology is: the blueprints are checked against it then)."""
        if self._mask_context is None:
            self._mask_context = self._make_mask_context()
        return self._mask_context

    def _make_mask_context(self) -> MaskContext:
        grows = any(slot.growth is not None for slot in self.slots.values())
        names = _check_blueprints(self._allowed, self._known_topology(), grows)
        # Per slot, what it cannot host (a growth blueprint outside a growth slot), so the masks
        # never allow a germination `execute` then refuses as a WAIT.
        refuses = tuple(frozenset(n for n in names if slot.context_error(n) is not None)
                        for slot in self.slots.values())
        return MaskContext(blueprints=names, max_seeds=self._max_seeds,
                           slot_refuses=refuses if any(refuses) else ())

    def _known_topology(self) -> str:
        topology = self.topology
        if topology is None:
            raise RuntimeError("the slots infer their topology from their first activation; "
                               "run a forward pass before asking for a report or an action")
        return topology

    @property
    def controller_name(self) -> str:
        """Who decides: the events its actions cause are labelled with it (``(random)``,
        ``(heuristic: <reason>)``; `label`)."""
        return self._controller_name

    @property
    def log(self) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
        """Where events are logged (`label`)."""
        return self._log

    @property
    def compute(self) -> ComputeLedger:
        """The run's compute: FLOPs spent by kind, the budget (`core.compute`; `use_ledger`)."""
        return self._compute

    def label(self, controller_name: str,
              log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
              tick: str = "epoch") -> None:
        """Say who decides (``controller_name``), what its decisions are called in event lines
        (``tick``: ``epoch`` in the envs, one decision an epoch; ``decision`` in a Trainer,
        whose decisions follow its loop) and, where given, where event lines go: an app passes
        a `logging.LoggerAdapter` that says which env and episode a line comes from
        (`esper_lightning.app.logs`)."""
        self._controller_name = controller_name
        self._tick = tick
        if log is not None:
            self._log = log

    def use_ledger(self, ledger: ComputeLedger) -> None:
        """Keep compute in ``ledger`` from now on (a fit's, when its holder changes: a
        `ComputeBudget` added for a second fit of the same model)."""
        self._compute = ledger
        ledger.invalidate()

    @property
    def slot_ids(self) -> tuple[str, ...]:
        return tuple(self.slots)

    @property
    def train_flops(self) -> float:
        """Training FLOPs spent (the ledger's)."""
        return self.compute.train_flops

    @property
    def growth_flops(self) -> float:
        """The part of `train_flops` the live seeds added to the training steps (the ledger's
        ``growth`` kind; a fossilized seed's share is the host's, ``train``)."""
        return self.compute.flops["growth"]

    @property
    def validation_flops(self) -> float:
        """FLOPs of validation forwards (the ledger's; they never spend a budget)."""
        return self.compute.flops["validation"]

    @property
    def counterfactual_flops(self) -> float:
        """FLOPs the counterfactual's extra configurations cost (the ledger's)."""
        return self.compute.flops["counterfactual"]

    @property
    def budget_flops(self) -> float | None:
        """The budget in training FLOPs (the ledger's; None: none)."""
        return self.compute.budget_flops

    @property
    def budget_scale(self) -> float:
        """The budget over the run's base budget (the ledger's)."""
        return self.compute.budget_scale

    def seed_parameters(self) -> list[nn.Parameter]:
        return [p for slot in self.slots.values() for p in slot.seed_parameters()]

    def host_parameters(self) -> list[nn.Parameter]:
        return host_parameters(self.model)

    @property
    def seed_params(self) -> int:
        return sum(p.numel() for p in self.seed_parameters())

    @property
    def host_params(self) -> int:
        return sum(p.numel() for p in self.host_parameters())

    def event_counts(self) -> Counter[str]:
        """Lifecycle events so far by kind (``germinated``, ``fossilized``, ``pruned``)."""
        return Counter(e.kind for e in self.events)

    # --- once-per-epoch protocol --------------------------------------------------------------
    def record_epoch(
        self,
        val_accuracy: float | None,
        val_loss: float | None = None,
        train_loss: float | None = None,
        contributions: Mapping[str, float] | None = None,
        standard_errors: Mapping[str, float] | None = None,
    ) -> None:
        """Record this epoch's measurements (accuracy in percent, contributions and their
        standard errors in points; a contribution without one was measured some other way)."""
        if val_accuracy is not None:
            self.accuracy_history.append(float(val_accuracy))
            self.seed_params_history.append(self.seed_params)
        if val_loss is not None:
            self.loss_history.append(float(val_loss))
        self.train_loss = train_loss
        for slot in self.slots.values():
            if val_accuracy is not None:
                slot.record_accuracy(val_accuracy)
        for slot_id, contribution in (contributions or {}).items():
            slot = self.slots[slot_id]
            if slot.seed is not None:
                slot.record_contribution(contribution, (standard_errors or {}).get(slot_id))

    def report(self, max_epochs: int | None = None,
               run_fraction: float | None = None) -> EpochReport:
        """What a controller sees now: ``max_epochs`` the decisions the run plans,
        ``run_fraction`` how far a run without a budget is (`EpochReport.run_fraction`)."""
        reports = tuple(s.report() for s in self.slots.values())
        acc, loss = self.accuracy_history, self.loss_history
        return EpochReport(
            epoch=self.epoch,
            max_epochs=max_epochs,
            slot_ids=self.slot_ids,
            slots=reports,
            val_accuracy=acc[-1] if acc else None,
            val_loss=loss[-1] if loss else None,
            train_loss=self.train_loss,
            accuracy_history=tuple(acc),
            loss_history=tuple(loss),
            host_params=self.host_params,
            seed_params=self.seed_params,
            masks=compute_masks(reports, self.mask_context),
            mask_context=self.mask_context,
            last_action=self.last_action,
            last_action_success=self.last_action_success,
            topology=self.topology,
            seed_params_history=tuple(self.seed_params_history),
            train_flops=self.train_flops,
            growth_flops=self.growth_flops,
            budget_flops=self.budget_flops,
            budget_scale=self.budget_scale,
            run_fraction=run_fraction,
        )

    def execute(self, action: Action, reason: str | None = None) -> StepOutcome:
        """Re-check ``action`` against the live slot states and carry it out. ``reason`` (the
        controller's, if it gives one) is recorded with the lifecycle event it causes."""
        views = [s.report() for s in self.slots.values()]
        error = action_error(action, views, self.mask_context)
        if error is None and action.op == LifecycleOp.GERMINATE:  # a block seed needs a block
            error = list(self.slots.values())[action.slot].context_error(action.blueprint)
        if error is not None:
            outcome = StepOutcome(action, _WAIT, False, error, None)
        else:
            slot = list(self.slots.values())[action.slot]
            before = self._stages()
            name = self.controller_name
            why = f"{name}: {reason}" if reason else name
            with self._seed_rng(self.epoch):
                gate = execute_on_slot(slot, action, why)
            passed = gate is None or gate.passed
            reason = None if passed else gate.message  # type: ignore[union-attr]
            outcome = StepOutcome(action, action, passed, reason, gate)
            self._note_changes(before, why)
            self._sync_optimizer()
            if action.op == LifecycleOp.GERMINATE and passed:
                self._start_moments(slot)
        self.last_action, self.last_action_success = outcome.executed, outcome.success
        return outcome

    def tick(self) -> None:
        """Advance every slot by one epoch (alpha ramps, scheduled prunes, embargo)."""
        before = self._stages()
        for slot in self.slots.values():
            slot.tick()
        self._note_changes(before, "scheduled")
        self._sync_optimizer()
        self.timeline.extend(_timeline_entry(self.epoch, s) for s in self.slots.values())
        self.epoch += 1

    def implant(self, slot_id: str, blueprint: str) -> None:
        """Implant a seed fossilized from birth in an empty slot (`SeedSlot.implant`): the
        "born grown" baseline. Recorded as an ``implanted`` event, not as a germination."""
        topology = self._known_topology()
        if blueprint not in blueprint_registry.available(topology):
            accepted = ", ".join(blueprint_registry.available(topology))
            raise ValueError(f"unknown blueprint {blueprint!r}; accepted: {accepted}")
        slot = self.slots[slot_id]
        with self._seed_rng(-1 - list(self.slots).index(slot_id)):  # apart from every epoch
            slot.implant(blueprint)
        self.events.append(LifecycleEvent(self.epoch, slot_id, "implanted", blueprint, "implanted"))
        self._sync_optimizer()

    def gradient_stats_due(self, step: int, first_of_epoch: bool) -> bool:
        """Whether to measure gradient health at this optimizer step (the one cadence every
        adapter follows, so a controller sees the same measurements in a Trainer and an env)."""
        return first_of_epoch or step % self.grad_stats_every == 0

    @contextmanager
    def _seed_rng(self, epoch: int) -> Iterator[None]:
        if self.rng_seed is None:
            yield
            return
        # fork_rng also forks every CUDA generator manual_seed reseeds.
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            torch.manual_seed((self.rng_seed * 1_000_003 + epoch) % 2**63)
            yield

    def prune_live(self, reason: str) -> list[str]:
        """Prune every live seed now (the governor's rollback); fossilized seeds stay."""
        before = self._stages()
        pruned = prune_live(self.slots.values(), reason)
        self._note_changes(before, reason)
        self._sync_optimizer()
        self.last_action, self.last_action_success = _WAIT, False
        return pruned

    @torch.no_grad()
    def prune_nonfinite(self, scaled: bool = False,
                        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[str]:
        """Prune every live seed whose output or gradients are not finite, before the
        optimizer steps (after backward, before clipping), so its inf or NaN never reaches the
        step nor a global gradient norm. Returns the ids of the pruned slots.

        Which seeds are blamed is `core.nonfinite.blamed_seeds`'s rule (never one the host
        handed inf or NaN, nor an incubating seed whose gradients are NaN because the host's
        are: a diverging host is the governor's). When a blamed seed was in the host's forward
        and the host's gradients are not finite, the step is dropped (`_drop_step`: no
        gradient moves the host, the buffers go back); `dropped_steps` counts these steps and
        a warning says so.

        Reads one flag vector back from the device while a live seed runs in the forward (a
        second only when a seed's gradients are not finite), nothing otherwise.

        Args:
            scaled: A loss scaler (fp16 mixed precision) owns the gradients: non-finite
                gradients of the seed and of the rest of the model together may be its
                overflow (which it skips while lowering its scale), so they prune no seed.
            reduce: Sums a flag tensor over the data-parallel ranks (every rank calls this
                method at the same step): a seed's output differs by rank, so this keeps every
                rank's lifecycle equal. None: one process.
        """
        kept, self._kept_buffers = self._kept_buffers, None  # the next step keeps its own
        live = [s for s in self.slots.values() if s.stage in LIVE_STAGES and s.seed is not None]
        flags = read_flags(live, reduce) if live else None
        if flags is None or not any(f.output or f.gradients for f in flags):
            return []
        host: list[bool] = []  # the rest of the model's gradients, read once if asked

        def host_nonfinite() -> bool:
            if not host:
                host.append(gradients_nonfinite(self.model, live, reduce))
            return host[0]

        blamed = blamed_seeds(live, flags, scaled, host_nonfinite)
        if not blamed:
            return []
        # Whether a seed could have spoiled the host's gradients (it is in the forward).
        drop = any(s.stage != SeedStage.TRAINING for s in blamed) and host_nonfinite()
        before = self._stages()
        for slot in blamed:
            slot.prune(SEED_NONFINITE)
        self._note_changes(before, SEED_NONFINITE)
        self._sync_optimizer()
        pruned = [s.slot_id for s in blamed]
        if drop:
            self._drop_step(kept, scaled)
        self.log.warning(
            "%s %d: pruned %s: seed output or gradients not finite; %s",
            self._tick, self.epoch, ", ".join(pruned),
            ("the step's gradients were dropped: the host does not move this step" if drop
             and not scaled else "the loss scaler skips this step" if drop
             else "the host's gradients are its own and it steps as usual"))
        return pruned

    def _drop_step(self, kept: list[tuple[torch.Tensor, torch.Tensor]] | None,
                   scaled: bool) -> None:
        """A step a seed spoiled: no gradient moves the host (a loss scaler skips the step
        itself), and the buffers the spoiled forward moved after the slot (BatchNorm's running
        statistics) go back to where they were before it."""
        self.dropped_steps += 1
        if not scaled:
            for p in self.model.parameters():
                p.grad = None
        for buffer, value in kept or ():
            buffer.copy_(value)

    def _keep_buffers(self) -> None:
        """Keep the host's buffers as they are before the step's first forward of a seed in
        the host's forward (a copy per step only while one trains; `prune_nonfinite` puts
        them back when that seed spoils them)."""
        if self._kept_buffers is None:
            with torch.no_grad():
                self._kept_buffers = [(b, b.clone()) for b in self.model.buffers()]

    @torch.no_grad()
    def capture_gradient_stats(self, scaled: bool = False) -> None:
        """Measure seed gradient health and the seed/host gradient ratio (after backward).

        Args:
            scaled: A loss scaler (fp16 mixed precision) owns these gradients. Then a step
                whose gradients are not all finite is the scaler's overflow, which it skips
                while it lowers its scale, not a reading of the seeds' health: it is not
                measured (the next finite step is).
        """
        active = [s for s in self.slots.values() if s.stage in LIVE_STAGES and s.seed is not None]
        if not active:
            return
        host = [p for p in self.host_parameters() if p.grad is not None]
        host_norm = None
        if host:
            host_norm = float(torch.linalg.vector_norm(torch.stack(
                torch._foreach_norm([p.grad for p in host])
            )))
        if scaled and not _all_finite(host_norm, [s.seed_parameters() for s in active]):
            return
        n_host = sum(p.numel() for p in host)
        for slot in active:
            slot.capture_gradient_stats(host_norm if host_norm and math.isfinite(host_norm)
                                        else None, n_host)

    # --- optimizer ----------------------------------------------------------------------------
    def attach_optimizer(self, optimizer: Optimizer, schedulers: Sequence[Any] = ()) -> None:
        """Track ``optimizer``: seed params leave the host groups and get their own groups,
        in the order saved in a checkpoint (so its optimizer state lines up)."""
        self.optimizer, self.schedulers = optimizer, list(schedulers)
        name_host_groups(optimizer)  # stable per-group tags in LR loggers
        strip_params(optimizer, self.seed_parameters())
        existing = set(seed_group_names(optimizer))
        for name in self._pending_group_order or []:
            slot_id = slot_of_group(name)
            slot = self.slots.get(slot_id)
            params = [] if slot is None else seed_groups(optimizer, slot_id,
                                                         slot.seed_parameters()).get(name, [])
            if params and name not in existing:
                add_seed_group(optimizer, name, params, self.seed_optim, self.schedulers)
        self._pending_group_order = None
        self._sync_optimizer()  # the groups no checkpoint named, in slot order

    @property
    def revision(self) -> int:
        """Bumped by every operation that may change a slot (what a step computes): a caller
        that caches the architecture (`core.flops.structure`) reads it again when this moves
        (the ledger's, `ComputeLedger.architecture`)."""
        return self.compute.revision

    def _sync_optimizer(self) -> None:
        self.compute.invalidate()
        if self.optimizer is None:
            return
        for slot_id, slot in self.slots.items():
            sync_seed_groups(self.optimizer, slot_id, slot.seed_parameters(), self.seed_optim,
                             self.schedulers, slot.seed_sources())

    def _start_moments(self, slot: SeedSlot) -> None:
        """A growth seed made from its sources' weights starts from their optimizer moments
        when its site says so (``DepthGrowth(moments="copy")``)."""
        operator = operator_of(slot.state.blueprint if slot.state is not None else None)
        site = slot.growth
        if (self.optimizer is not None and site is not None and site.moments == "copy"
                and operator is not None and operator.copies_weights):
            copy_moments(self.optimizer, slot.seed_parameters(), slot.seed_sources())

    # --- bookkeeping --------------------------------------------------------------------------
    def _stages(self) -> dict[str, SeedStage]:
        return {sid: s.stage for sid, s in self.slots.items()}

    def _note_changes(self, before: Mapping[str, SeedStage], initiator: str) -> None:
        for slot_id, slot in self.slots.items():
            stage, state = slot.stage, slot.state
            if stage == before[slot_id] or state is None:
                continue
            kind = {
                SeedStage.GERMINATED: "germinated",
                SeedStage.FOSSILIZED: "fossilized",
                SeedStage.PRUNED: "pruned",
            }.get(stage)
            if before[slot_id] == SeedStage.DORMANT:  # a seed without incubation is BLENDING
                kind = "germinated"
            if kind is not None:
                reason = state.prune_reason if kind == "pruned" else initiator
                event = LifecycleEvent(self.epoch, slot_id, kind, state.blueprint,
                                       reason or initiator)
                self.events.append(event)
                self.log.info("%s %d: %s %s %s (%s)", self._tick, event.epoch, event.slot_id,
                              event.kind, event.blueprint, event.reason)

    def state_dict(self) -> dict[str, Any]:
        """Engine bookkeeping (slot states live in the model's own state_dict)."""
        order = (
            seed_group_names(self.optimizer)
            if self.optimizer is not None
            else list(self._pending_group_order or [])
        )
        return {
            "epoch": self.epoch,
            # By head name, the blueprint by its name: a checkpoint never depends on the order in
            # which a process registered its blueprints.
            "last_action": None if self.last_action is None else _plain(self.last_action),
            "last_action_success": self.last_action_success,
            "accuracy_history": list(self.accuracy_history),
            "loss_history": list(self.loss_history),
            "seed_params_history": list(self.seed_params_history),
            "train_loss": self.train_loss,
            "events": [asdict(e) for e in self.events],
            "seed_group_order": order,
            "timeline": [asdict(e) for e in self.timeline],
            # FLOPs are the ledger's, saved by whoever holds it (`core.compute`).
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        last = state["last_action"]
        if last is None:
            self.last_action = None
        else:  # a list of head indices in checkpoints written before names were stored
            self.last_action = Action(**last) if isinstance(last, Mapping) else (
                Action.from_indices(last))
        self.last_action_success = bool(state["last_action_success"])
        self.accuracy_history = deque(state["accuracy_history"], maxlen=HISTORY_WINDOW)
        self.loss_history = deque(state["loss_history"], maxlen=HISTORY_WINDOW)
        # Checkpoints written before the history existed have none: the outcome then needs
        # three more epochs, which only an episode (never a resumed Trainer) computes.
        self.seed_params_history = deque(state.get("seed_params_history", []),
                                         maxlen=HISTORY_WINDOW)
        self.train_loss = state["train_loss"]
        self.events = [LifecycleEvent(**e) for e in state["events"]]
        self.timeline = [TimelineEntry(**e) for e in state.get("timeline", [])]
        # Checkpoints written before the ledger held every kind kept validation and
        # counterfactual FLOPs here (and, earlier still, training FLOPs: `legacy_train_flops`,
        # the ledger holder's to read); a run resumed from one goes on from them.
        for kind, flops in state.get("flops", {}).items():
            if kind != "train":
                self.compute.charge(float(flops), kind)
        self._pending_group_order = list(state["seed_group_order"])


def _plain(action: Action) -> dict[str, int | str | None]:
    """``action`` as plain data: head name -> index, the blueprint head -> blueprint name."""
    return {head: action.blueprint if head == "blueprint" else int(getattr(action, head))
            for head in HEADS}


def _timeline_entry(epoch: int, slot: SeedSlot) -> TimelineEntry:
    state = slot.state
    return TimelineEntry(epoch, slot.slot_id, slot.stage.name, float(slot.alpha),
                         None if state is None else state.blueprint,
                         None if state is None else state.seed_id)


def _common_topology(slots: Any) -> str | None:
    topologies = {s.topology for s in slots}
    known = topologies - {None}
    if len(known) > 1:
        raise ValueError(f"slots mix topologies {sorted(known)}; use one topology per model")
    return None if None in topologies or not known else known.pop()


def _check_blueprints(names: Sequence[str] | None, topology: str,
                      grows: bool) -> tuple[str, ...]:
    """The blueprints a run may germinate: ``names`` (None: every one of the topology), growth
    blueprints only where a slot grows depth."""
    # Every registered blueprint has an index in the blueprint table, so every one is actionable.
    registered = blueprint_registry.available(topology)
    allowed = tuple(n for n in registered if grows or operator_of(n) is None)
    if names is None:
        return allowed
    unknown = [n for n in names if n not in registered]
    if unknown or not names:
        bad = ", ".join(map(repr, unknown)) or "an empty list"
        raise ValueError(f"unknown blueprint {bad} for {topology}; accepted: "
                         f"{', '.join(registered)}")
    depth = [n for n in names if n not in allowed]
    if depth:
        raise ValueError(f"blueprint {depth[0]!r} grows a stack deeper and no slot of this run is "
                         "a growth slot; accepted: growth=DepthGrowth(...) for the model's "
                         "stack of blocks, or blueprints without block_*")
    return tuple(names)


def execute_on_slot(
    slot: SeedSlot, action: Action, reason: str = "policy_prune"
) -> GateResult | None:
    """Carry out ``action`` on ``slot`` (whose index the caller resolved). Check legality first
    with `actions.action_error`: an illegal action raises here. ``reason`` is recorded on a
    prune. Returns the gate result for germinate, advance and fossilize."""
    op = action.op
    if op == LifecycleOp.WAIT:
        return None
    if op == LifecycleOp.GERMINATE:
        style = action.style
        return slot.germinate(
            action.blueprint,
            algorithm=style.algorithm,
            curve=style.curve,
            tempo=action.tempo.epochs,
            alpha_target=action.alpha_target.alpha,
        )
    if op == LifecycleOp.ADVANCE:
        return slot.advance()
    if op == LifecycleOp.FOSSILIZE:
        return slot.fossilize()
    curve, steepness = action.alpha_curve.curve, action.alpha_curve.steepness
    if op == LifecycleOp.PRUNE:
        slot.schedule_prune(action.alpha_speed.steps, curve, steepness, reason=reason)
        return None
    if op == LifecycleOp.SET_ALPHA_TARGET:
        slot.set_alpha_target(
            action.alpha_target.alpha,
            action.alpha_speed.steps,
            curve,
            steepness,
            algorithm=action.style.algorithm,
        )
        return None
    raise ValueError(f"unknown op {op!r}")


def legacy_train_flops(state: Mapping[str, Any]) -> float | None:
    """The training FLOPs an engine state saved before they were the ledger's, if any."""
    train = state.get("flops", {}).get("train")
    return None if train is None else float(train)


def _all_finite(host_norm: float | None, seeds: list[list[nn.Parameter]]) -> bool:
    """Whether the host's gradient norm and every seed gradient are finite."""
    if host_norm is not None and not math.isfinite(host_norm):
        return False
    grads = [p.grad for params in seeds for p in params if p.grad is not None]
    return not grads or bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())
