"""`MorphogenesisCallback`: grow seeds in any LightningModule while a Trainer fits it."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from numbers import Integral
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn
from typing_extensions import override

import esper_lightning.callbacks._distributed as dist
from esper_lightning.callbacks._cadence import (
    RESUME_OR_RAISE,
    RunPlan,
    grown_step_bound,
    run_fraction,
    run_limit,
    run_plan,
    took_step,
    validates_by_step,
)
from esper_lightning.callbacks._metering import (
    check_metering_functions,
    metering_errors,
    step_cost,
)
from esper_lightning.callbacks.compute_budget import fit_budget
from esper_lightning.controllers.base import (
    Controller,
    ExplainsDecisions,
    NamesBlueprints,
    PlansGermination,
    PlansLifecycle,
    SchedulesDecisions,
)
from esper_lightning.controllers.baselines import StaticController
from esper_lightning.controllers.stack import StackController
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.counterfactual import (
    ACCURACY,
    CounterfactualAccumulator,
    LogitsError,
    check_mode,
    default_mode,
    probe_plan,
    validation_plan,
    validation_reads,
)
from esper_lightning.core.depth import DepthGrowth
from esper_lightning.core.engine import (
    MorphogenesisEngine,
    StepOutcome,
    legacy_train_flops,
)
from esper_lightning.core.injection import INJECTED_SLOTS_ATTR
from esper_lightning.core.lifecycle import (
    LIVE_STAGES,
    PRESENT_STAGES,
    GateConfig,
    GateMode,
    SeedStage,
    blend_complete,
)
from esper_lightning.core.report import EpochReport
from esper_lightning.core.seeding import SeedingConfig, with_shorthand
from esper_lightning.core.slots import check_topology
from esper_lightning.core.telemetry import morpho_metrics, slot_layout, stage_changes
from esper_lightning.core.timing import SeedTiming
from esper_lightning.viz.timeline import log_timeline

log = logging.getLogger(__name__)

BatchToXY = Callable[[Any], tuple[Tensor, Tensor]]
LogitsFn = Callable[[L.LightningModule, Tensor], Tensor]
#: What the controller misses when a configured metric key is never logged.
_MISSING_KEY_EFFECT = {
    "loss_key": "the controller sees no validation loss (the heuristic never counts the host as "
    "stable, so it never germinates)",
    "accuracy_key": "the callback measures the accuracy itself where its controller reads it "
    "(one more forward per validation batch; accuracy_key=None says so on purpose)",
    "train_loss_key": "the controller sees no training loss",
}
TIMELINE_TAG = "morpho/timeline"
#: TensorBoard text of every stage change, by name (a germination, a blend's start, a fossil).
EVENTS_TAG = "morpho/stage_changes"
#: What to do about a module the meter cannot run on meta tensors.
_METER_REMEDY = ("pass logits_fn= if its forward needs more than the batch's inputs, or "
                 "meter_flops=False to train without a FLOP count (and without a ComputeBudget)")
#: Steps' losses kept on the device before they are summed into the interval's total.
_FOLD_EVERY = 256
_LONG_RUN = 1_000_000  # epochs: tells timing knobs that follow the run length from fixed ones
#: What the counterfactual measurement can read, said whenever a module's output is not that.
SUPPORTED_MODELS = ("classifiers only (logits [B, C], C >= 2, for class-index targets [B], or "
                    "per-token logits [B, T, C] for targets [B, T])")


class MorphogenesisCallback(Callback):
    r"""Let a controller germinate, blend, fossilize and prune seeds where your loop decides.

    A decision follows every validation run of the fit (``val_check_interval``,
    ``check_val_every_n_epoch``; never the sanity check), or every ``every_n_train_steps``
    optimizer steps when that is given; an epoch in which no decision fell decides at its end.
    A controller that knows when it is due (`controllers.base.SchedulesDecisions`: a
    `StackController`'s ``tau``) decides at the first training step past that point, whatever
    the cadence. At a decision the callback measures every blending seed's counterfactual
    contribution on the last validation run (validation accuracy with the seed at its alpha
    minus accuracy with that slot's alpha at 0), builds an `EpochReport` (its ``epoch`` counts
    decisions, its ``max_epochs`` is the decisions the run plans), asks the controller for an
    action, executes it (illegal actions become WAIT with a reason) and ticks every slot: the
    lifecycle's durations count decisions, and ``timing`` gives them in steps, epochs or a
    share of the run instead. Seeds join the optimizer as param groups named ``seed/<slot>``
    (the host's unnamed groups are named ``host`` so LR-monitor tags stay put); LR schedulers
    schedule them too.
    Every training step's FLOPs (host and every live seed, forward and backward) are metered
    once per architecture on meta tensors (`core.flops`, no effect on training) into the fit's
    `core.compute.ComputeLedger` (`ledger`: the host's share as ``train``, what live seeds
    add as ``growth``), logged as ``morpho/train_flops`` (both) and ``morpho/growth_flops``
    and reported to the controller (`EpochReport.train_flops`). With a `ComputeBudget`
    callback in the same Trainer the ledger is the budget's: it charges the steps, and the
    report carries its budget too.
    Lifecycle events are logged at INFO on the ``esper_lightning`` logger; at the end of the
    fit a seed-timeline image goes to every TensorBoard logger (``morpho/timeline``).

    Under DDP (``strategy="ddp"``, ``"ddp_spawn"`` or ``"ddp_fork"``, any devices and nodes)
    every rank holds the same lifecycle: measurements are summed over the ranks, rank 0's
    decision is broadcast, new seeds get the same weights and their gradients are averaged
    before each optimizer step (docs/design.md, "Distributed"). Sharded strategies (FSDP,
    DeepSpeed) are refused.

    What the measurement needs of your module: only that it maps inputs to logits. By default
    it runs one forward per configuration (main, each measured slot off, all off) on the
    unchanged batch. ``batch_to_xy`` says how to read a validation batch and ``logits_fn`` how
    to get logits when ``forward`` returns a tuple or dict or the module has no ``forward``.
    The measurement runs once at fit start (on the sanity-check batch, or on one validation
    batch when sanity checking is off), so a module it cannot measure (a regression model, say:
    the callback grows classifiers only, `SUPPORTED_MODELS`) fails in the first minute with one
    line saying what is supported and which option to set.

    Args:
        controller: decides the action each epoch (e.g. `HeuristicController`).
        slots: `SeedSlot` ids in the model and/or module paths after which a slot is injected
            (``"net.3"``; one name or a list); None uses every `SeedSlot` in the model.
        blueprints: shorthand for ``seeding.blueprints`` (`core.seeding.SeedingConfig`).
        max_seeds: shorthand for ``seeding.max_seeds``.
        seed_lr: shorthand for ``seeding.seed_optim.lr``.
        seed_momentum: shorthand for ``seeding.seed_optim.momentum``.
        seed_weight_decay: shorthand for ``seeding.seed_optim.weight_decay``.
        topology: ``"cnn"``, ``"transformer"`` or ``"linear"`` for injected slots; None (the
            default) infers it from the rank of the activation a slot first sees:
            ``[B, C, H, W]`` cnn, ``[B, T, D]`` transformer, ``[B, D]`` linear (an MLP layer).
        blend_gradient: shorthand for ``seeding.blend_gradient``.
        growth: where the model grows deeper (`core.depth.DepthGrowth`): growth slots after
            blocks of a stack of same-shape blocks (your own ``blocks``, Hugging Face's
            ``transformer.h`` or ``model.layers``), where a growth seed (``block_copy``,
            ``block_identity``, ``block_random``: the growth operators,
            `blueprints.growth`) adds new blocks of the stack's own class. They come after the
            ``slots``; ``slots=None`` with ``growth`` means the growth slots alone.
            ``DepthGrowth("blocks", blocks=3)`` grows a one-block model to four in one event;
            ``blocks=(1, 2)`` to two, then four.
        gate_mode: shorthand for ``seeding.gate_mode``.
        gate_config: shorthand for ``seeding.gate_config``.
        batch_to_xy: ``batch -> (inputs, class targets)`` for the counterfactual; the default
            accepts ``(x, y)`` pairs. Targets are class indices ``[B]`` (or ``[B, T]`` for a
            token-level classifier).
        logits_fn: ``(pl_module, x) -> logits [B, classes]`` (or ``[B, T, classes]``); default
            ``pl_module(x)``. Set it when ``forward`` returns a tuple or dict
            (``lambda m, x: m(x)[0]``) or the module has no ``forward``.
        counterfactual: ``"separate"`` (one forward per configuration, works on any module),
            ``"fused"`` (one forward whose batch fans out K-fold at the first measured slot;
            the module must not reshape with a batch size read before the slot) or None: the
            measured default for the device (`core.counterfactual.DEFAULT_MODES`).
        accuracy_key: a logged validation accuracy in [0, 1] used when no seed needs measuring
            (saves the extra forward); missing -> measured by the callback, for a controller
            that reads the accuracy (`core.counterfactual.validation_reads`: the heuristic does,
            a `StackController` does not, so an LM run with no live seed validates with no
            forward besides ``validation_step``'s own).
        loss_key: the logged validation loss copied into the controller's report.
        train_loss_key: a logged training loss to report instead of the callback's own
            measurement (None: the mean of the epoch's ``training_step`` losses, exactly what the
            RL envs report). A configured key that is never logged draws one warning per fit
            naming the logged keys (``accuracy_key`` only for a controller that reads it).
        grad_stats_every: shorthand for ``seeding.grad_stats_every``.
        rng_seed: a new seed's initial weights come from a generator seeded with (``rng_seed``,
            epoch), as in the RL envs, so a policy meets the seeds it was trained with. None:
            ``torch.initial_seed()`` at setup (the value `seed_everything` set).
        every_n_train_steps: decide every this many optimizer steps instead of after each
            validation run (a run without validation, say); validation results still reach
            the next decision. None: after each validation run.
        timing: shorthand for ``seeding.timing``.
        meter_flops: meter the FLOPs of every training step (the forward of ``logits_fn`` on
            the inputs ``batch_to_xy`` reads from the training batch, and its backward: a
            ``training_step`` that computes more is counted as that forward) and validation
            batch, summed over DDP ranks. The measurement runs the module on meta tensors; a
            module that cannot run there (``.item()``, data-dependent control flow) fails at
            the first batch with one line saying so: pass False to train without a count.
        layer_scale_init: shorthand for ``seeding.layer_scale_init``.
        seeding: how seeds grow in every slot (`core.seeding.SeedingConfig`, where each of its
            options is documented; its ``timing`` in steps, epochs or a share of the run is
            turned into decisions at fit start). The shorthand keywords above fill it in; one
            that contradicts a value ``seeding`` sets is refused in one line. None: the
            defaults, with the shorthand's values.

    Example:
        >>> from esper_lightning.controllers import HeuristicController
        >>> trainer = L.Trainer(
        ...     max_epochs=30,
        ...     callbacks=[MorphogenesisCallback(HeuristicController(), slots=["net.3"],
        ...                                      logits_fn=lambda m, x: m(x)[0])],
        ... )
        >>> trainer.fit(my_module, datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        controller: Controller,
        slots: Sequence[str] | None = None,
        blueprints: Sequence[str] | None = None,
        max_seeds: int | None = None,
        seed_lr: float | None = None,
        seed_momentum: float | None = None,
        seed_weight_decay: float | None = None,
        topology: str | None = None,
        gate_mode: GateMode | str | None = None,
        gate_config: GateConfig | None = None,
        blend_gradient: str | None = None,
        growth: DepthGrowth | None = None,
        batch_to_xy: BatchToXY | None = None,
        logits_fn: LogitsFn | None = None,
        counterfactual: str | None = None,
        accuracy_key: str | None = "val_acc",
        loss_key: str = "val_loss",
        train_loss_key: str | None = None,
        grad_stats_every: int | None = None,
        rng_seed: int | None = None,
        meter_flops: bool = True,
        every_n_train_steps: int | None = None,
        timing: SeedTiming | None = None,
        layer_scale_init: float | None = None,
        seeding: SeedingConfig | None = None,
    ) -> None:
        _check_options(controller, topology, growth, seeding)
        _check_inputs(slots, batch_to_xy, logits_fn, loss_key, rng_seed, every_n_train_steps)
        #: How seeds grow (`core.seeding.SeedingConfig`): ``seeding`` with the shorthand's values.
        self.seeding = with_shorthand(
            seeding, "MorphogenesisCallback", blueprints=blueprints, max_seeds=max_seeds,
            gate_mode=gate_mode, gate_config=gate_config, blend_gradient=blend_gradient,
            layer_scale_init=layer_scale_init, seed_lr=seed_lr, seed_momentum=seed_momentum,
            seed_weight_decay=seed_weight_decay, grad_stats_every=grad_stats_every,
            timing=timing)
        self.every_n_train_steps, self.controller = every_n_train_steps, controller
        self._engine_kwargs: dict[str, Any] = {
            "slots": None if slots is None else [slots] if isinstance(slots, str) else list(slots),
            "topology": topology, "growth": growth,
            # The callback turns the timing into decisions itself, at fit start (`_make_plan`).
            "seeding": dataclasses.replace(self.seeding, timing=None),
        }
        self._state_key = self._generate_state_key(slots=self._engine_kwargs["slots"])
        self.rng_seed, self.logits_fn = rng_seed, logits_fn
        self.batch_to_xy = batch_to_xy or _pair
        self.counterfactual = None if counterfactual is None else check_mode(counterfactual)
        self.accuracy_key, self.meter_flops = accuracy_key, meter_flops
        self.loss_key, self.train_loss_key = loss_key, train_loss_key
        #: The fit's compute (`core.compute.ComputeLedger`): a `ComputeBudget`'s when the fit
        #: has one (it charges the training steps), else this callback's own.
        self.ledger = ComputeLedger()
        self._owns_ledger = True
        self.engine: MorphogenesisEngine | None = None
        self.last_outcome: StepOutcome | None = None
        self._accumulator: CounterfactualAccumulator | None = None
        self._pending_state: dict[str, Any] | None = None
        self._forget_decisions()
        self._start_fit()

    def _forget_decisions(self) -> None:
        """The decision bookkeeping a checkpoint carries (`state_dict`)."""
        self._decided_step = -1  # global step of the last decision
        self._decided_epoch = -1  # epoch of the last decision
        #: The spent fraction at which the controller's next decision is due (None: the cadence).
        self._due: float | None = None
        #: The last validation run's (accuracy, loss, contributions, their standard errors),
        #: for the next decision.
        self._validation: tuple[float | None, float | None, dict[str, float],
                                dict[str, float]] | None = None
        self._train_loss: Tensor | None = None  # [loss sum, batches] folded so far
        self._losses: list[Tensor] = []  # each step's loss since the last fold, on the device
        self._budget_steps: int | None = None  # the steps a compute budget allows (estimated)

    def _start_fit(self) -> None:
        """Forget what the last fit left behind (not the decision bookkeeping, which a resumed
        fit takes from its checkpoint)."""
        self.last_outcome = None
        self._stats_decision = -1  # decisions made when gradient health was last measured
        self._probed = False
        self._plan: RunPlan | None = None
        self._warned_length = False
        self._scheduled = False  # asked the controller when it is due, this fit
        self._checked_keys: set[str] = set()
        self._accumulator = None
        self._step_at_batch_start = -1  # trainer.global_step when this batch began

    @property
    @override
    def state_key(self) -> str:
        return self._state_key  # built once: Lightning reads it at every hook it calls

    # --- setup --------------------------------------------------------------------------------
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dist.check_strategy(trainer)  # one device or DDP; sharded strategies are refused
        mine = [k for k, c in enumerate(trainer.callbacks) if isinstance(c, MorphogenesisCallback)]
        if len(mine) > 1:  # two engines would inject, grow and charge the one model apart
            raise MisconfigurationException(
                f"MorphogenesisCallback: one per Trainer, found {len(mine)} (at positions "
                f"{', '.join(map(str, mine))}); give one callback every slot (slots=[...]) and "
                "its growth (growth=...)")
        budget = fit_budget(trainer)  # who holds the fit's ledger: one rule
        self._owns_ledger = budget is None
        if budget is not None:
            self.ledger = budget.ledger  # read here, charged by the budget
        if self.engine is None or self.engine.model is not pl_module:
            # Slots are injected here, before Lightning loads a checkpoint's weights, so grown
            # seeds are rebuilt from each slot's saved manifest during strict loading.
            rng_seed = torch.initial_seed() if self.rng_seed is None else self.rng_seed
            rng_seed = dist.broadcast_rng_seed(trainer, rng_seed)  # equal seeds on every rank
            self.engine = MorphogenesisEngine(pl_module, rng_seed=rng_seed, compute=self.ledger,
                                              **self._engine_kwargs)
            # Event lines name what decided them (`HeuristicController`), not a generic "policy".
            self.engine.label(type(self.controller).__name__, tick="decision")
        self.engine.use_ledger(self.ledger)
        dist.keep_slots_out_of_ddp(pl_module)
        wanted = getattr(self.controller, "slot_ids", None)  # a policy's: fixed by its training
        if wanted is not None and tuple(wanted) != tuple(self.engine.slot_ids):
            # At setup, not at the first decision (after an epoch had trained).
            raise MisconfigurationException(
                f"MorphogenesisCallback: {type(self.controller).__name__} was trained for slots "
                f"{list(wanted)}, the callback has {list(self.engine.slot_ids)}; pass those "
                f"slots (slots=[...], or the model's own, e.g. --model.slots)")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        engine = self._require_engine()
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException(
                f"MorphogenesisCallback needs exactly one optimizer (automatic optimization); "
                f"got {len(trainer.optimizers)}"
            )
        self._start_fit()
        if self._pending_state is not None:  # resumed: load_state_dict ran before this hook
            engine.load_state_dict(self._pending_state["engine"])
            self._resume_ledger(self._pending_state)
            self._pending_state = None
        else:  # a fresh fit: forget any earlier run (a recurrent policy's state, trackers)
            self.controller.reset()
            self._forget_decisions()
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        # Runs before Lightning restores the optimizer state, so saved seed groups line up.
        engine.attach_optimizer(trainer.optimizers[0], schedulers)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._probed:  # no sanity check ran: measure one validation batch now
            batch = _first_validation_batch(trainer)
            if batch is not None:
                self._probe(trainer, pl_module, batch)
        self._check_controller()
        # The training batches are counted by now: a run bounded by max_steps has a length (a
        # budget's is known after its first step: `_plan_budget`).
        self._make_plan(trainer)
        layout = slot_layout(self._require_engine().slot_ids)
        for logger in _tensorboards(trainer):
            logger.experiment.add_custom_scalars(layout)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish_due(trainer)
        # Here, not in on_fit_end: the loggers are finalized before that hook.
        engine = self._require_engine()
        title = f"seed timeline of {type(pl_module).__name__}"
        for logger in _tensorboards(trainer):
            log_timeline(logger.experiment, engine.timeline, trainer.global_step, TIMELINE_TAG,
                         slot_ids=engine.slot_ids, title=title)
            logger.experiment.flush()

    # --- the run's plan ------------------------------------------------------------------------
    def _make_plan(self, trainer: L.Trainer) -> None:
        """The run in steps and decisions; the lifecycle's durations in decisions from it."""
        self._plan = plan = run_plan(trainer, self.every_n_train_steps, self._budget_steps)
        durations: dict[str, int] = {}
        if self.ledger.budget_flops is not None and self._budget_steps is None:
            return  # a budget's length is known after its first step: planned there
        if isinstance(self.controller, PlansLifecycle):  # what it asks, where the user set none
            durations.update(self.controller.lifecycle(plan.decisions))
            if self.seeding.gate_config is not None:
                durations.pop("incubation", None)
        if self.seeding.timing is not None:
            try:
                durations.update(self.seeding.timing.resolve(plan.for_durations()))
            except ValueError as err:
                raise MisconfigurationException(f"MorphogenesisCallback: {err}") from None
        if durations:
            self._require_engine().set_timing(durations)
        if self._require_engine().topology is not None:  # else at the first step that knows it
            self._warn_if_too_short(trainer)

    def _plan_budget(self, trainer: L.Trainer) -> None:
        """Under a compute budget, the steps it allows once a step's cost is known (the first
        step's; growth makes later steps dearer, so this bounds the run from above), then the
        check that a growth schedule can finish in them."""
        if trainer.global_step < 1:
            return
        per_step = self.ledger.train_flops / trainer.global_step
        if per_step > 0:
            self._budget_steps = math.ceil(self.ledger.budget_flops / per_step)
            self._make_plan(trainer)
            self._check_growth_schedule(trainer)

    def step_cost_bound(self) -> float:
        """How many times this step's cost a later step can cost at most (`GrowsSteps`): a
        `StaticController`'s host never grows; a `StackController`'s grows by its growth sites'
        blocks (`grown_step_bound`); any other controller's seeds have no known bound."""
        if isinstance(self.controller, StaticController):
            return 1.0
        sites = [] if self.engine is None else [
            s.growth for s in self.engine.slots.values() if s.growth is not None]
        if isinstance(self.controller, StackController) and sites:
            return grown_step_bound(sites)
        return math.inf

    def _check_growth_schedule(self, trainer: L.Trainer) -> None:
        """Refuse, in one line, a `StackController` schedule the run cannot finish: after its last
        ``tau`` it needs a decision (one step each) per germination, per tick of the blend and for
        the advance and the fossilization (`StackController.decisions_after_tau`); the steps left
        after ``tau`` are counted at the grown model's cost, bounded by the depth it grows to.
        Runs bounded by time alone are not checked (their steps are unknown)."""
        controller, plan = self.controller, self._plan
        engine = self._require_engine()
        if not isinstance(controller, StackController) or plan is None or plan.steps is None:
            return
        sites = [s.growth for s in engine.slots.values() if s.growth is not None]
        if not sites:
            return  # the controller says so itself, at its first decision
        ticks = controller.blend_ticks
        needed = controller.decisions_after_tau(len(sites))
        tau = controller.last_tau
        left = (1.0 - tau) * plan.steps
        what = f"max_steps={trainer.max_steps}" if trainer.max_steps == plan.steps else "the run"
        if self.ledger.budget_flops is not None and self._budget_steps is not None:
            left = (1.0 - tau) * self._budget_steps / grown_step_bound(sites)
            what = f"the budget ({self.ledger.budget_flops:g} FLOPs, at the grown cost)"
            self._warn_if_cut_short(trainer, controller, plan.steps, needed, left)
        if left < needed:
            raise MisconfigurationException(
                f"MorphogenesisCallback: the growth schedule cannot finish: StackController(tau="
                f"{tau:g}) needs >= {needed} steps after tau (a germination per slot, "
                f"{ticks} blend step(s), the advance and the fossilization), {what} leaves about "
                f"{int(left)}; lower tau or train longer")

    def _warn_if_cut_short(self, trainer: L.Trainer, controller: StackController, steps: int,
                           needed: int, budget_left: float) -> None:
        """Under a budget ``tau`` is a share of the budget, so a run whose own length ends it
        first (``max_steps``, ``max_epochs``) may stop between the growth and its end: warn,
        in one line, where it leaves fewer steps after ``tau`` than the growth needs. Not
        refused: a fit cut short on purpose is resumed from its checkpoint, growth and all.
        Silent where the growth would not begin in this fit and the `ComputeBudget` has said so
        already (at the first step: "what the budget plans after that (a decay, a growth) will
        not happen"): one cause, one line."""
        grows_at = math.ceil(controller.last_tau * self._budget_steps)  # today's cost
        left = steps - grows_at
        if left >= needed or left >= budget_left:
            return
        budget = fit_budget(trainer)
        if left <= 0 and budget is not None and budget.told_short:
            return
        grows = (f"grows at about step {grows_at}" if left > 0
                 else f"would grow at about step {grows_at}")
        rank_zero_warn(
            f"MorphogenesisCallback: StackController(tau={controller.last_tau:g}) {grows} of "
            f"the budget ({self.ledger.budget_flops:g} FLOPs) and needs >= {needed} steps "
            f"after it, and {run_limit(trainer, steps)} ends the fit after {steps}: "
            f"this fit stops before its growth is done ({RESUME_OR_RAISE})")

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step
        if self._budget_steps is None and self.ledger.budget_flops is not None:
            self._plan_budget(trainer)
        elif trainer.global_step == 0 and batch_idx == 0:
            self._check_growth_schedule(trainer)
        if not self._scheduled and self._require_engine().topology is not None:
            # Ask the controller when it is first due, once the slots know their shape (a
            # sanity check or the first step's forward tells them): a run that never validates
            # still grows at tau, and is told if it is too short for a seed to blend.
            self._scheduled = True
            self._schedule_next(trainer)
            self._warn_if_too_short(trainer)
        # A growth at tau: decided before the first step past it, so that step trains grown
        # (all of it: at the first batch of an accumulation window, never inside one).
        if self._due is not None and batch_idx % trainer.accumulate_grad_batches == 0:
            spent = self._spent_fraction(trainer)
            if spent is not None and spent >= self._due:
                self._decide(trainer)

    def _spent_fraction(self, trainer: L.Trainer) -> float | None:
        """`EpochReport.spent_fraction` as the next report would say it."""
        if self.ledger.budget_flops is not None:
            return self.ledger.fraction
        return self._run_fraction(trainer)

    def _run_fraction(self, trainer: L.Trainer) -> float | None:
        return None if self._plan is None else run_fraction(trainer, self._plan)

    # --- training -----------------------------------------------------------------------------
    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, Tensor):  # kept on the device: no host sync, one op per batch
            if pl_module.automatic_optimization and trainer.accumulate_grad_batches > 1:
                # Lightning hands on the loss it backpropagated: training_step's, divided by
                # the accumulation; the report's training loss is training_step's own.
                loss = loss * trainer.accumulate_grad_batches
            self._losses.append(loss.detach())
            if len(self._losses) >= _FOLD_EVERY:
                self._fold_losses()
        if self.meter_flops and self._owns_ledger:  # a ComputeBudget charges its own
            self.ledger.end_step(step_cost(self.ledger, trainer, pl_module,
                                         self.batch_to_xy(batch)[0], self.logits_fn,
                                         "MorphogenesisCallback", _METER_REMEDY))
        every = self.every_n_train_steps
        stepped = took_step(trainer, pl_module, self._step_at_batch_start)  # not in a window
        if every is not None and stepped and trainer.global_step % every == 0:
            self._decide(trainer)

    def _metered(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                 kind: str, plan: Any = None) -> int:
        """One validation (``kind`` ``forward`` or ``counterfactual``) reading of the ledger's
        meter times the ranks, or one line saying the module cannot be metered and how to go
        on without."""
        x, _ = self.batch_to_xy(batch)
        engine = self._require_engine()
        # Read once per epoch and mode and whenever a slot changes (the ledger's revision).
        arch = self.ledger.architecture(pl_module, (trainer.current_epoch, pl_module.training))
        meter = self.ledger.meter
        with metering_errors("MorphogenesisCallback", pl_module, _METER_REMEDY):
            if kind == "counterfactual":
                flops = meter.counterfactual(pl_module, x, engine.slots, plan[0], plan[1],
                                             self.logits_fn, arch)
            else:
                flops = meter.forward(pl_module, x, self.logits_fn, arch)
        return flops * trainer.world_size

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        engine = self._require_engine()
        present = sum(s.stage in PRESENT_STAGES for s in engine.slots.values())
        pl_module.log("seeds", float(present), prog_bar=True, logger=False, on_epoch=True,
                      sync_dist=dist.is_distributed(trainer))  # equal everywhere; no warning

    @override
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # DDP only syncs the host's gradients; the seeds' are averaged here, before a loss
        # scaler unscales them: a seed-only overflow then reaches every rank's scaler, and every
        # rank skips the step together (averaging after the unscale would let one rank skip
        # while the others stepped on its inf). Linear, so it holds under accumulation too.
        engine = self._require_engine()
        if dist.is_distributed(trainer):  # the seed parameters gathered only where averaged
            dist.average_gradients(trainer, engine.seed_parameters())
        if _scaled(trainer):
            # Here, before the scaler unscales (and records a found inf for the step), so a
            # non-finite seed pruned now leaves the host's step as it would be without it.
            # Summed over the ranks: a seed's output differs by rank, its decision must not.
            engine.prune_nonfinite(scaled=True, reduce=_rank_sum(trainer))

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Gradients are already unscaled here under AMP.
        engine = self._require_engine()
        if not _scaled(trainer):
            # Before clipping and the step: a non-finite seed leaves with its param group, so
            # its inf or NaN reaches neither the global norm nor the host's weights (under a
            # loss scaler this ran in on_after_backward, before the unscale).
            engine.prune_nonfinite(reduce=_rank_sum(trainer))
        # The first step after each decision is measured, so a seed the decision changed has
        # its gradients' health by the next one (a growth seed's G5 reads it).
        first = self._stats_decision != engine.epoch
        if engine.gradient_stats_due(trainer.global_step, first):
            self._stats_decision = engine.epoch
            engine.capture_gradient_stats(scaled=_scaled(trainer))

    # --- validation: counterfactual measurement -----------------------------------------------
    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Plan this validation run's measurement (`core.counterfactual.validation_plan`): the
        counterfactual while a seed is live (or fossils are, for a controller that reads their
        contributions); else the accuracy alone for a controller that reads it, unless
        ``accuracy_key`` was logged by the last validation run (the first of a fit cannot know
        yet: Lightning clears the sanity check's metrics); else nothing: no forward besides
        ``validation_step``'s own."""
        self._accumulator = None
        if trainer.sanity_checking:
            return
        engine = self._require_engine()
        plan, accuracy_only = validation_plan(engine.slots, validation_reads(self.controller))
        logged = self.accuracy_key is not None and self.accuracy_key in trainer.callback_metrics
        if plan is not None and not (accuracy_only and logged):
            self._accumulator = CounterfactualAccumulator(plan, self.counterfactual)

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if dataloader_idx != 0:
            return
        if trainer.sanity_checking:
            if not self._probed and trainer.state.fn == TrainerFn.FITTING:
                self._probe(trainer, pl_module, batch)
            return
        engine = self._require_engine()
        if self._accumulator is not None:
            x, y = self.batch_to_xy(batch)
            with trainer.precision_plugin.forward_context():  # same autocast as validation_step
                self._accumulator.update(self._forward(pl_module), x, y, engine.slots)
        if self.meter_flops:  # validation_step's own forward, and the counterfactual beside it
            plan = None if self._accumulator is None else (self._accumulator.plan,
                                                           self._accumulator.mode)
            forward = self._metered(trainer, pl_module, batch, "forward")
            extra = None if plan is None else self._metered(trainer, pl_module, batch,
                                                            "counterfactual", plan)
            self.ledger.charge_validation(forward, extra)

    def _forward(self, pl_module: L.LightningModule) -> Callable[[Tensor], Tensor]:
        if self.logits_fn is None:
            return pl_module
        return functools.partial(self.logits_fn, pl_module)

    # --- the fit-start probe: can this module be measured? ------------------------------------
    def _probe(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        """Run the measurement once on ``batch`` with every slot overridden (a fused probe fans
        out at the first slot), so a module it cannot measure fails now, not when the first
        seed blends; the result is thrown away."""
        self._probed = True
        name = type(pl_module).__name__
        if self.logits_fn is None and type(pl_module).forward is L.LightningModule.forward:
            raise MisconfigurationException(
                f"MorphogenesisCallback cannot measure {name}: it has no forward(); pass "
                f"logits_fn=lambda module, x: <logits [B, classes]>"
            )
        x, y = self.batch_to_xy(batch)
        slots = self._require_engine().slots
        mode = self.counterfactual or default_mode(x.device)
        forward = self._forward(pl_module)
        with trainer.precision_plugin.forward_context(), _eval_mode(pl_module):
            for run in dict.fromkeys(("separate", mode)):  # the general contract first
                try:
                    CounterfactualAccumulator(probe_plan(slots), run).update(forward, x, y, slots)
                except Exception as err:
                    raise MisconfigurationException(_probe_message(name, run, err)) from err
            _check_slots_before_the_logits(name, forward, x, slots)  # a forward that works

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Before ModelCheckpoint (always ordered last) saves, so a checkpoint holds the decision.
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        accuracy, contributions, errors = self._measurements(trainer)
        loss = dist.mean_over_ranks(trainer, trainer.callback_metrics.get(self.loss_key))
        self._validation = (accuracy, loss, contributions, errors)
        self._check_keys(trainer, validated=True)
        if self.every_n_train_steps is None:
            self._decide(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # An epoch in which no decision fell (no validation in it) still decides at its end,
        # unless validation runs by the run's batch count and so falls across epochs.
        if (self.every_n_train_steps is None and self._decided_epoch != trainer.current_epoch
                and not validates_by_step(trainer)):
            self._decide(trainer)

    def _finish_due(self, trainer: L.Trainer) -> None:
        """At the end of the fit, let a controller finish what is due now and changes nothing
        the model computes (a growth seed blended in, still to be held and fossilized), so
        `core.depth.materialize` finds no growth seed half-born. A seed still ramping is left
        as it is (its ramp would move alpha without training)."""
        engine = self._require_engine()
        for _ in range(2 * len(engine.slots) + 2):
            slots = engine.slots.values()
            ramping = any(s.stage == SeedStage.BLENDING
                          and not blend_complete(s.report().alpha_view) for s in slots)
            live = any(s.stage in LIVE_STAGES for s in slots)
            spent = self._spent_fraction(trainer)
            if self._due is None or ramping or not live or spent is None or spent < self._due:
                return
            self._decide(trainer, force=True)

    # --- the decision -------------------------------------------------------------------------
    def _decide(self, trainer: L.Trainer, force: bool = False) -> None:
        """One decision: record what was measured since the last, report, act, tick. At most
        one per optimizer step (``force``: the fit's end, where no step follows)."""
        if self._decided_step == trainer.global_step and not force:
            return
        self._decided_step, self._decided_epoch = trainer.global_step, trainer.current_epoch
        engine = self._require_engine()
        train_loss = self._interval_train_loss(trainer)
        accuracy, loss, contributions, errors = self._validation or (None, None, {}, {})
        self._validation = None  # measured once, reported once: never a stale reading
        self._check_keys(trainer, validated=False)
        engine.record_epoch(accuracy, loss, train_loss, contributions, errors)
        action = self.controller.decide(self._report(trainer))
        controller = self.controller
        reason = controller.last_reason if isinstance(controller, ExplainsDecisions) else None
        if force and action.op == LifecycleOp.GERMINATE:  # no step follows: nothing new grows
            action, reason = Action(), "the fit has ended: no germination"
        action, reason = dist.broadcast_decision(trainer, action, reason)  # decided once
        before = {sid: slot.stage for sid, slot in engine.slots.items()}
        self.last_outcome = outcome = engine.execute(action, reason)
        engine.tick()
        if action.op != 0:  # lifecycle events themselves are logged at INFO by the engine
            verdict = "done" if outcome.success else f"refused ({outcome.reason})"
            log.debug("decision %d (step %d): %s %s", engine.epoch - 1, trainer.global_step,
                      action.describe(engine.slot_ids), verdict)
        self._log(trainer, contributions)
        self._schedule_next(trainer)
        changes = stage_changes(before, engine.slots,
                                f"step {trainer.global_step} (epoch {trainer.current_epoch})")
        for logger in _tensorboards(trainer) if changes else ():
            logger.experiment.add_text(EVENTS_TAG, "  \n".join(changes), trainer.global_step)

    def _schedule_next(self, trainer: L.Trainer) -> None:
        """When the controller's next decision is due, if sooner than the cadence
        (`SchedulesDecisions`), asked with the state this decision left."""
        if not isinstance(self.controller, SchedulesDecisions):
            return
        due = self.controller.next_decision(self._report(trainer))
        self._due = due if due is None else float(due)

    def _report(self, trainer: L.Trainer) -> EpochReport:
        """The engine's report with the run's length in decisions and how far it is."""
        plan = self._plan
        return self._require_engine().report(
            max_epochs=None if plan is None else plan.decisions,
            run_fraction=self._run_fraction(trainer))

    def _fold_losses(self) -> Tensor | None:
        """The interval's ``[loss sum, batches]`` so far, the steps' losses folded into it (a
        resumed interval's sum comes from the checkpoint, on the CPU)."""
        if self._losses:
            losses, self._losses = torch.stack(self._losses).float(), []
            step = torch.stack([losses.sum(), losses.new_tensor(float(losses.numel()))])
            total = self._train_loss
            self._train_loss = step if total is None else total.to(step.device) + step
        return self._train_loss

    def _interval_train_loss(self, trainer: L.Trainer) -> float | None:
        if self.train_loss_key is not None:
            return dist.mean_over_ranks(trainer, trainer.callback_metrics.get(self.train_loss_key))
        total, self._train_loss = self._fold_losses(), None
        if dist.is_distributed(trainer):  # every rank's [loss sum, batches], summed
            none = torch.zeros(2, device=trainer.strategy.root_device)
            total = dist.reduce_sum(trainer, none if total is None else total)
            total = None if float(total[1]) == 0 else total
        return None if total is None else float(total[0] / total[1])  # one sync per decision

    # --- warnings, once per fit ---------------------------------------------------------------
    def _check_keys(self, trainer: L.Trainer, validated: bool) -> None:
        """Warn once per fit about configured metric keys the module does not log: the
        training key at the first decision, the validation keys at the first validation
        run."""
        groups = {"train": ("train_loss_key",)}
        if validated:  # an accuracy the controller never reads is missed by nobody
            reads_accuracy = ACCURACY in validation_reads(self.controller)
            groups["validation"] = ("loss_key", "accuracy_key")[:2 if reads_accuracy else 1]
        metrics = trainer.callback_metrics
        missing = []
        for group, options in groups.items():
            if group in self._checked_keys:
                continue
            self._checked_keys.add(group)
            for option in options:
                key = getattr(self, option)
                if key is not None and key not in metrics:  # None: measured, not read
                    missing.append(f"{option}={key!r} is never logged, so "
                                   f"{_MISSING_KEY_EFFECT[option]}")
        if missing:
            rank_zero_warn(f"MorphogenesisCallback: {'; '.join(missing)}; logged keys: "
                           f"{sorted(metrics)}")

    def _check_controller(self) -> None:
        """Refuse now, in one line, blueprints the controller names that this run can never
        germinate (`NamesBlueprints`): the run's blueprints are checked against the slots'
        topology too. Slots that have not seen an activation yet leave it to the controller's
        first decision."""
        engine = self._require_engine()
        if engine.topology is None:
            return
        allowed = engine.mask_context.blueprints
        if isinstance(self.controller, NamesBlueprints):
            self.controller.check_blueprints(engine.topology, allowed)

    def _warn_if_too_short(self, trainer: L.Trainer) -> None:
        """Warn when no seed can reach blending before the run ends (controllers that know
        their earliest germination: `PlansGermination`, such as `HeuristicController`), or
        when the run's length is unknown, so the controller's timing cannot follow it."""
        controller, plan = self.controller, self._plan
        max_epochs = None if plan is None else plan.decisions
        if not isinstance(controller, PlansGermination) or self._warned_length:
            return
        self._warned_length = True
        if max_epochs is None:
            # Knobs that scale with the run length differ between an unknown and a long run.
            if controller.timing(None) != controller.timing(_LONG_RUN):
                rank_zero_warn(
                    f"MorphogenesisCallback: the run's length is unknown "
                    f"(max_epochs={trainer.max_epochs}, max_steps={trainer.max_steps}, "
                    f"{_batches_text(trainer)}), so the controller's timing knobs are used as "
                    f"given, not scaled to the run; set max_epochs, max_steps (with a sized "
                    f"training loader) or a ComputeBudget"
                )
            return
        earliest = controller.earliest_germination(max_epochs)
        if earliest is None:
            return
        first = int(earliest)
        engine = self._require_engine()
        incubation = min(s.incubation_epochs(b) for s in engine.slots.values()
                         for b in engine.mask_context.blueprints)
        # Germinate, advance, incubate, then the G2 decision; a seed without incubation (block
        # seeds) is BLENDING from the decision that germinates it.
        needed = first + 1 if incubation == 0 else first + 2 + incubation
        if plan is None or max_epochs >= needed:
            return
        timing = controller.timing(max_epochs)
        knobs = ", ".join(f"{k}={v}" for k, v in timing.items())
        rank_zero_warn(
            f"MorphogenesisCallback: {_length_text(trainer, plan)} is too short for any seed to "
            f"reach blending: the controller germinates at decision {first} at the earliest"
            f"{f' (timing knobs at this length: {knobs})' if knobs else ''}, then a seed needs 1 "
            f"decision to start training and {incubation} decisions of training before G2 lets "
            f"it blend, {needed} decisions in all; lower the controller's timing knobs or the "
            f"incubation (timing=SeedTiming(incubation=...)), validate more often, or train "
            f"longer"
        )

    def _measurements(self, trainer: L.Trainer
                      ) -> tuple[float | None, dict[str, float], dict[str, float]]:
        """The host's validation accuracy (percent), each measured seed's contribution and its
        standard error (points), from the counterfactual accumulator where one ran."""
        acc = self._accumulator
        self._accumulator = None
        if acc is not None and dist.is_distributed(trainer):  # counts of every rank's shard
            acc.reduce(dist.all_reduce_sum, trainer.strategy.root_device)
        if acc is not None and acc.total > 0:
            accuracies = acc.accuracies()
            return accuracies["main"], acc.contributions(accuracies), acc.standard_errors()
        logged = None if self.accuracy_key is None else trainer.callback_metrics.get(
            self.accuracy_key
        )
        logged = dist.mean_over_ranks(trainer, logged)
        return (None if logged is None else 100.0 * logged), {}, {}

    def _log(self, trainer: L.Trainer, contributions: dict[str, float]) -> None:
        engine = self._require_engine()
        flops = self.ledger.train_flops if self.meter_flops else None
        metrics = morpho_metrics(engine.seed_params, engine.event_counts(), engine.slots,
                                 contributions, train_flops=flops,
                                 budget_flops=self.ledger.budget_flops)
        if flops is not None:  # the live seeds' share of the training FLOPs
            metrics["morpho/growth_flops"] = self.ledger.flops["growth"]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # --- state --------------------------------------------------------------------------------
    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # MyModule.load_from_checkpoint runs nothing of ours before its strict load fails on the
        # injected slots' keys (lightning/pytorch/core/saving.py, _load_state), so the way to
        # load them is said where they are written, once per fit.
        prefix = INJECTED_SLOTS_ATTR + "."
        if (getattr(self, "_said_how_to_load", None) != id(trainer)
                and any(key.startswith(prefix) for key in checkpoint.get("state_dict", ()))):
            self._said_how_to_load = id(trainer)
            name = type(pl_module).__name__
            rank_zero_info(f"MorphogenesisCallback: checkpoints of this fit hold the seed slots "
                           f"it injected into {name} ({prefix}*): load them with "
                           f"esper_lightning.load_grown({name}, path); "
                           f"{name}.load_from_checkpoint alone refuses those keys")

    @override
    def state_dict(self) -> dict[str, Any]:
        engine = self._require_engine()
        loss = self._fold_losses()
        state = {
            "engine": engine.state_dict(),
            "controller": self.controller.state_dict(),
            "decided_epoch": self._decided_epoch,
            "decided_step": self._decided_step,
            "due": self._due,
            # A checkpoint between decisions (every_n_train_steps, mid-epoch) resumes the
            # interval's training loss and the last validation's readings exactly.
            "train_loss": None if loss is None else [float(v) for v in loss.tolist()],
            "validation": None if self._validation is None else list(self._validation),
            "budget_steps": self._budget_steps,
        }
        if self._owns_ledger:  # a ComputeBudget saves the ledger it owns
            state["compute"] = self.ledger.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict["controller"])
        self._forget_decisions()  # a checkpoint written before decisions fell at steps: these
        self._decided_epoch = int(state_dict["decided_epoch"])
        self._decided_step = int(state_dict.get("decided_step", -1))
        self._due = state_dict.get("due")
        loss, validation = state_dict.get("train_loss"), state_dict.get("validation")
        self._train_loss = None if loss is None else torch.tensor(loss, dtype=torch.float)
        self._losses = []
        if validation is not None:  # a checkpoint before the standard errors holds three
            accuracy, val_loss, contributions, *errors = validation
            self._validation = (accuracy, val_loss, dict(contributions),
                                dict(errors[0]) if errors else {})
        self._budget_steps = state_dict.get("budget_steps")
        if self.engine is not None:  # seeds just rebuilt from the checkpoint: not DDP's to sync
            dist.keep_slots_out_of_ddp(self.engine.model)
        # The engine adopts its state in on_fit_start, next to the optimizer it re-groups.
        self._pending_state = {"engine": state_dict["engine"],
                               "compute": state_dict.get("compute")}

    def _resume_ledger(self, state: dict[str, Any]) -> None:
        """Go on from the training FLOPs the checkpoint had spent, when this callback owns the
        ledger (older checkpoints kept them in the engine's state)."""
        if not self._owns_ledger:
            return
        if state["compute"] is not None:
            self.ledger.load_state_dict(state["compute"])
        else:
            self.ledger.restore_train_flops(legacy_train_flops(state["engine"]) or 0.0)

    # --- what the governor asks of the lifecycle's owner ---------------------------------------
    def prune_live(self, reason: str) -> list[str]:
        """Prune every live seed now (a governor's rollback), recorded as lifecycle events;
        fossils stay. Returns the pruned slots' ids."""
        return self._require_engine().prune_live(reason)

    @property
    def fossils(self) -> int:
        """Seeds fossilized so far in this run."""
        return 0 if self.engine is None else self.engine.event_counts()["fossilized"]

    def _require_engine(self) -> MorphogenesisEngine:
        if self.engine is None:
            raise RuntimeError("MorphogenesisCallback used before setup(); add it to a Trainer")
        return self.engine


def _check_slots_before_the_logits(name: str, forward: Callable[[Tensor], Tensor], x: Tensor,
                                   slots: Mapping[str, nn.Module]) -> None:
    """Refuse, in one line, a slot whose output is the module's logits themselves (a slot after
    its last layer): a seed there would only rewrite the class scores, and nothing the host
    learns passes through it (a user's slot after the output layer germinated, blended and was
    pruned at no contribution, silently)."""
    outputs: dict[str, Any] = {}
    hooks = [slot.register_forward_hook(lambda _m, _i, out, sid=sid: outputs.setdefault(sid, out))
             for sid, slot in slots.items()]
    try:
        with torch.no_grad():
            logits = forward(x)
    finally:
        for hook in hooks:
            hook.remove()
    if not isinstance(logits, Tensor):
        return  # the probe names what the forward returned
    last = [sid for sid, out in outputs.items() if isinstance(out, Tensor)
            and out.shape == logits.shape and out.data_ptr() == logits.data_ptr()]
    if last:
        raise MisconfigurationException(
            f"MorphogenesisCallback: slot {last[0]!r} comes after {name}'s last layer (its "
            f"output is the logits, {tuple(logits.shape)}); accepted: a slot after a layer whose "
            "output another layer reads")


def _check_options(controller: Any, topology: str | None, growth: DepthGrowth | None,
                   seeding: Any) -> None:
    """Refuse a bad option at construction, in one line (the seeding options are checked by
    `SeedingConfig`)."""
    if isinstance(controller, type):
        raise TypeError(f"controller must be a controller instance, got the class "
                        f"{controller.__name__}; accepted: {controller.__name__}(...)")
    if not isinstance(controller, Controller):
        raise TypeError(
            f"controller must implement decide/reset/state_dict/load_state_dict, got "
            f"{type(controller).__name__}"
        )
    check_topology(topology)
    if growth is not None and not isinstance(growth, DepthGrowth):
        raise TypeError(f"growth must be a DepthGrowth, got {type(growth).__name__}")
    if seeding is not None and not isinstance(seeding, SeedingConfig):
        raise TypeError(f"seeding must be a SeedingConfig or None, got {type(seeding).__name__}")


def _check_inputs(slots: Any, batch_to_xy: Any, logits_fn: Any, loss_key: Any,
                  rng_seed: Any, every_n_train_steps: Any) -> None:
    """Refuse, in one line at construction, what would otherwise fail mid-fit or never act."""
    _check_cadence(every_n_train_steps)
    names = [slots] if isinstance(slots, str) else slots
    if names is not None and (not names or not all(isinstance(n, str) and n for n in names)):
        raise ValueError(f"slots must name one or more modules (e.g. slots=['net.3']), or be "
                         f"None (a growth= or a built-in host's slots), got {slots!r}")
    check_metering_functions(batch_to_xy, logits_fn)
    if not isinstance(loss_key, str) or not loss_key:
        raise ValueError(f"loss_key must name the logged validation loss (e.g. 'val_loss'), "
                         f"got {loss_key!r}")
    if rng_seed is not None and (isinstance(rng_seed, bool) or not isinstance(rng_seed, Integral)
                                 or rng_seed < 0):
        raise ValueError(f"rng_seed must be an int >= 0 or None, got {rng_seed!r}")


def _check_cadence(every_n_train_steps: Any) -> None:
    """Refuse a bad decision cadence at construction, in one line."""
    every = every_n_train_steps
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"every_n_train_steps must be an int >= 1 or None, got {every!r}")


def _scaled(trainer: L.Trainer) -> bool:
    """Whether a loss scaler (fp16 mixed precision) owns the gradients."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None


def _rank_sum(trainer: L.Trainer) -> Callable[[Tensor], Tensor] | None:
    """The sum over the ranks a flag needs under DDP; None in one process."""
    return dist.all_reduce_sum if dist.is_distributed(trainer) else None


def _batches_text(trainer: L.Trainer) -> str:
    batches = trainer.num_training_batches
    return f"{batches} batches per epoch" if math.isfinite(batches) else "batches per epoch unknown"


def _length_text(trainer: L.Trainer, plan: RunPlan) -> str:
    """How the run's length in decisions was set, for messages."""
    decisions = plan.decisions
    per_epoch = plan.steps_per_decision == plan.steps_per_epoch
    if per_epoch and trainer.max_epochs == decisions:
        return f"max_epochs={decisions}"
    every = "one per epoch" if per_epoch else f"one every {plan.steps_per_decision:g} steps"
    return (f"a run of {decisions} decision{'s' if decisions != 1 else ''} ({plan.steps} steps, "
            f"{every}; max_steps={trainer.max_steps}, {_batches_text(trainer)})")


def _pair(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, list | tuple) and len(batch) == 2:
        x, y = batch
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            return x, y
    raise TypeError(
        f"cannot read a validation batch of type {type(batch).__name__} as (inputs, targets); "
        "pass batch_to_xy= to MorphogenesisCallback"
    )


def _probe_message(name: str, mode: str, err: Exception) -> str:
    """One line: what went wrong measuring module ``name`` and which option fixes it."""
    lines = str(err).strip().splitlines()
    cause = lines[0] if lines else type(err).__name__
    if mode == "fused":
        return (f"MorphogenesisCallback: counterfactual='fused' does not work with {name} "
                f"({cause}): its forward must carry a batch that grows K-fold at the first slot; "
                f"pass counterfactual='separate'")
    if isinstance(err, LogitsError):
        return (f"MorphogenesisCallback cannot measure {name}: {cause}; it measures "
                f"{SUPPORTED_MODELS}: pass logits_fn=lambda module, x: <logits> or batch_to_xy= "
                f"if your module gives them in another form")
    return (f"MorphogenesisCallback cannot measure {name}: its forward failed on the validation "
            f"inputs ({type(err).__name__}: {cause}); pass batch_to_xy= (what the forward takes) "
            f"or logits_fn=lambda module, x: <logits [B, classes]>")


@contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Evaluation mode for a block, then every submodule's own mode back (a frozen BatchNorm
    stays in eval), so the probe never updates running statistics."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _first_validation_batch(trainer: L.Trainer) -> Any | None:
    """One batch of the first validation loader on the module's device, or None without
    validation. The global RNG is left untouched (creating a loader iterator draws from it)."""
    if not trainer.enable_validation or trainer.state.fn != TrainerFn.FITTING:
        return None
    trainer.fit_loop.epoch_loop.val_loop.setup_data()
    loaders = trainer.val_dataloaders
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    loader = loaders[0] if isinstance(loaders, list | tuple) and loaders else loaders
    if loader is None:
        return None
    with torch.random.fork_rng(devices=[]):
        batch = next(iter(loader), None)
    return None if batch is None else trainer.strategy.batch_to_device(batch, dataloader_idx=0)


def _tensorboards(trainer: L.Trainer) -> list[TensorBoardLogger]:
    """The trainer's TensorBoard loggers (rank zero only: the others write nothing)."""
    if not trainer.is_global_zero:
        return []
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
