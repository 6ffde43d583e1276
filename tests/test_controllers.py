"""Controllers on reports built from real `SeedSlot`s driven through the lifecycle."""

from __future__ import annotations

import dataclasses
import doctest
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from helpers import torch_round_trip

import esper_lightning.controllers.base as base_module
import esper_lightning.controllers.baselines as baselines_module
import esper_lightning.controllers.heuristic as heuristic_module
from esper_lightning.blueprints import available
from esper_lightning.controllers import (
    Controller,
    HeuristicConfig,
    HeuristicController,
    RandomController,
    ScriptedController,
    StaticController,
)
from esper_lightning.controllers.heuristic import decisions_to_judge
from esper_lightning.core.actions import (
    Action,
    AlphaSpeed,
    AlphaTargetChoice,
    LifecycleOp,
    MaskContext,
    Tempo,
    action_error,
    compute_masks,
)
from esper_lightning.core.engine import MorphogenesisEngine, execute_on_slot
from esper_lightning.core.lifecycle import GateConfig, QualityGates, SeedStage
from esper_lightning.core.report import HISTORY_WINDOW, EpochReport
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.errors import ConfigError

CNN = MaskContext(blueprints=available("cnn"))
WAIT = Action()
Op = LifecycleOp


# --- building reports from real slots ----------------------------------------------------------
def make_slots(n: int = 3) -> list[SeedSlot]:
    return [SeedSlot(f"r0c{i}", channels=4) for i in range(n)]


def make_report(
    slots: Sequence[SeedSlot],
    epoch: int,
    accs: Sequence[float] = (50.0,),
    losses: Sequence[float] = (1.0,),
    *,
    ctx: MaskContext = CNN,
    last_action: Action | None = None,
    success: bool = True,
) -> EpochReport:
    """The report an engine builds after validation; ``accs``/``losses`` end with this epoch."""
    views = tuple(slot.report() for slot in slots)
    return EpochReport(
        epoch=epoch,
        max_epochs=None,
        slot_ids=tuple(slot.slot_id for slot in slots),
        slots=views,
        val_accuracy=accs[-1] if accs else None,
        val_loss=losses[-1] if losses else None,
        train_loss=None,
        accuracy_history=tuple(accs[-HISTORY_WINDOW:]),
        loss_history=tuple(losses[-HISTORY_WINDOW:]),
        host_params=1000,
        seed_params=sum(v.seed_params for v in views),
        masks=compute_masks(views, ctx),
        mask_context=ctx,
        last_action=last_action,
        last_action_success=success,
    )


def measure(slot: SeedSlot, acc: float, contribution: float | None = None, healthy=True) -> None:
    """What an engine records for a slot during an epoch: gradients, accuracy, counterfactual."""
    if slot.seed is None:
        return
    metrics = slot.state.metrics
    metrics.gradient_health, metrics.has_exploding = (1.0, False) if healthy else (0.2, True)
    slot.record_accuracy(acc)
    # The counterfactual means something only once the seed is blended into the output.
    if contribution is not None and slot.stage in (SeedStage.BLENDING, SeedStage.HOLDING):
        slot.record_contribution(contribution)


def ticks(slot: SeedSlot, n: int, acc: float | None = None) -> None:
    for _ in range(n):
        slot.tick()
        if acc is not None:
            slot.record_accuracy(acc)


def to_stage(slot: SeedSlot, stage: SeedStage, acc: float = 50.0, tempo: int = 3) -> SeedSlot:
    """Move an empty slot to ``stage`` with legal operations, at a constant accuracy."""
    slot.germinate("conv_light", tempo=tempo)
    measure(slot, acc)
    if stage == SeedStage.GERMINATED:
        return slot
    assert slot.advance().passed
    if stage == SeedStage.TRAINING:
        return slot
    ticks(slot, 10, acc)
    assert slot.advance().passed
    if stage == SeedStage.BLENDING:
        return slot
    ticks(slot, tempo, acc)
    assert slot.advance().passed
    if stage == SeedStage.HOLDING:
        return slot
    slot.record_contribution(1.0)
    assert slot.fossilize().passed
    return slot


@dataclass
class Sim:
    """A minimal engine loop: measure, report, decide, execute (illegal -> WAIT), tick."""

    controller: Controller
    slots: list[SeedSlot] = field(default_factory=make_slots)
    ctx: MaskContext = CNN
    accs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    reports: list[EpochReport] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    penalties: list[dict[str, float]] = field(default_factory=list)
    last_success: bool = True

    def step(self, acc: float, loss: float = 1.0, contribution: float | None = None,
             healthy: bool = True) -> Action:
        self.accs.append(acc)
        self.losses.append(loss)
        for slot in self.slots:
            measure(slot, acc, contribution, healthy)
        last = self.actions[-1] if self.actions else None
        report = make_report(self.slots, len(self.reports), self.accs, self.losses, ctx=self.ctx,
                             last_action=last, success=self.last_success)
        action = self.controller.decide(report)
        self.last_success = self._execute(action, report)
        for slot in self.slots:
            slot.tick()
        self.reports.append(report)
        self.actions.append(action)
        self.reasons.append(getattr(self.controller, "last_reason", ""))
        self.penalties.append(getattr(self.controller, "blueprint_penalties", {}))
        return action

    def _execute(self, action: Action, report: EpochReport) -> bool:
        if action_error(action, report.slots, self.ctx) is not None:
            return False
        result = execute_on_slot(self.slots[action.slot], action)
        return result is None or result.passed

    def ops(self) -> list[Op]:
        return [a.op for a in self.actions]


def feed(controller: Controller, slots: list[SeedSlot], accs, losses, ctx=CNN) -> list[Action]:
    """Decide at every epoch without executing anything (the slots stay as they are)."""
    return [
        controller.decide(make_report(slots, e, accs[: e + 1], losses[: e + 1], ctx=ctx))
        for e in range(len(accs))
    ]


def assert_plain(value) -> None:
    """State must be made of plain Python data so weights_only loading accepts it."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) in (str, int), key
            assert_plain(item)
    elif isinstance(value, list):
        for item in value:
            assert_plain(item)
    else:
        assert value is None or type(value) in (bool, int, float, str), (value, type(value))


def quick_germinator(**overrides) -> HeuristicController:
    """A heuristic that germinates as soon as the masks allow (no warm-up)."""
    config = {"min_epochs_before_germinate": 0, "stabilization_epochs": 0,
              "plateau_epochs_to_germinate": 0, **overrides}
    return HeuristicController(HeuristicConfig(**config))


# --- heuristic: germination --------------------------------------------------------------------
def test_heuristic_waits_before_epoch_5_then_germinates_conv_light():
    controller = HeuristicController()
    actions = feed(controller, make_slots(), [50.0] * 6, [1.0] * 6)
    assert actions[:5] == [WAIT] * 5
    assert actions[5] == Action(Op.GERMINATE, slot=0, blueprint="conv_light",
                                alpha_target=AlphaTargetChoice.FULL)
    assert controller.is_stabilized


def test_heuristic_waits_until_the_host_stabilises():
    controller = HeuristicController()
    losses = [2.0 * 0.9**e for e in range(10)] + [2.0 * 0.9**9] * 4  # 10% better per epoch
    actions = feed(controller, make_slots(), [50.0] * len(losses), losses)
    assert actions[:12] == [WAIT] * 12  # stable epochs at 10, 11, 12 latch at epoch 12
    assert actions[12].op == Op.GERMINATE


@pytest.mark.parametrize(
    ("relative_change", "stable"),
    [(0.029, True), (0.031, False), (-0.049, True), (-0.051, False), (0.0, True)],
)
def test_stabilisation_band_is_strictly_inside_minus5_plus3_percent(relative_change, stable):
    controller = HeuristicController()
    losses = [1.0 * (1 - relative_change) ** e for e in range(4)]
    feed(controller, make_slots(), [50.0] * 4, losses)
    assert controller.is_stabilized is stable


def test_stabilisation_needs_three_consecutive_stable_epochs():
    controller = HeuristicController()
    losses = [1.0, 1.0, 1.0, 0.8, 0.8, 0.8]  # two stable, one 20% jump, two stable
    feed(controller, make_slots(), [50.0] * 6, losses)
    assert not controller.is_stabilized


def test_heuristic_without_validation_metrics_never_germinates():
    controller = HeuristicController()
    actions = feed(controller, make_slots(), [None] * 12, [None] * 12)
    assert actions == [WAIT] * 12
    assert controller.last_reason == "host not stabilised"


@pytest.mark.parametrize(("gain", "germinates"), [(0.49, True), (0.5, False)])
def test_plateau_means_gaining_less_than_half_a_point(gain, germinates):
    controller = HeuristicController()
    accs = [50.0 + gain * e for e in range(12)]
    actions = feed(controller, make_slots(), accs, [1.0] * 12)
    assert (actions[5].op == Op.GERMINATE) is germinates
    if not germinates:
        assert actions == [WAIT] * 12
        assert controller.last_reason.startswith("no plateau")


def test_germinates_in_first_empty_slot_after_a_three_epoch_plateau():
    slots = make_slots(3)
    to_stage(slots[0], SeedStage.FOSSILIZED)
    controller = HeuristicController()
    accs = [50.0 + e for e in range(8)] + [57.0] * 4  # climbing until epoch 7, flat after
    actions = feed(controller, slots, accs, [1.0] * len(accs))
    assert actions[:10] == [WAIT] * 10  # plateau of 1 at epoch 8, 2 at epoch 9
    assert actions[10] == Action(Op.GERMINATE, slot=1, blueprint="conv_light")


def test_rotation_is_filtered_to_the_blueprints_of_the_run():
    ctx = MaskContext(blueprints=("norm", "depthwise", "bottleneck"))
    controller = quick_germinator()
    slots = make_slots(1)
    picks = [controller.decide(make_report(slots, e, ctx=ctx)).blueprint for e in range(3)]
    assert picks == ["norm", "depthwise", "norm"]


def test_a_rotation_the_run_cannot_grow_is_refused_in_one_line():
    # Once a silent no-op: the heuristic waited for ever.
    controller = quick_germinator()
    ctx = MaskContext(blueprints=("bottleneck",))
    with pytest.raises(ConfigError, match=r"^heuristic blueprint_rotation \(conv_light, "
                       r"conv_heavy, attention, norm, depthwise\) names no blueprint this run "
                       r"allows; accepted: bottleneck$"):
        controller.decide(make_report(make_slots(1), 0, ctx=ctx))


@pytest.mark.parametrize("topology", ["transformer", "linear"])
def test_the_default_rotation_follows_the_topology(topology):
    controller = quick_germinator()
    ctx = MaskContext(blueprints=available(topology))
    report = dataclasses.replace(make_report(make_slots(1), 0, ctx=ctx), topology=topology)
    picked = controller.decide(report).blueprint
    assert picked == heuristic_module.DEFAULT_ROTATIONS[topology][0]


def test_a_rotation_naming_another_topologys_blueprint_is_refused():
    config = HeuristicConfig(blueprint_rotation=("conv_light", "lora"))
    with pytest.raises(ConfigError, match=r"^heuristic blueprint_rotation: blueprint 'lora' "
                       r"does not exist for topology 'cnn'; accepted: norm, "):
        HeuristicController(config).check_blueprints("cnn", available("cnn"))


def test_penalised_blueprints_are_skipped_and_lowest_penalty_used_when_all_are():
    controller = quick_germinator()
    state = controller.state_dict()
    state["penalties"] = {"conv_light": 3.0, "conv_heavy": 2.9}
    controller.load_state_dict(state)
    assert controller.decide(make_report(make_slots(1), 0)).blueprint == "conv_heavy"

    controller = quick_germinator()
    rotation = HeuristicConfig().rotation("cnn")
    state["penalties"] = {name: 10.0 - i for i, name in enumerate(rotation)}
    controller.load_state_dict(state)
    assert controller.decide(make_report(make_slots(1), 0)).blueprint == "depthwise"


# --- heuristic: managing a live seed -----------------------------------------------------------
def test_germinated_seed_is_advanced():
    slots = make_slots(2)
    to_stage(slots[1], SeedStage.GERMINATED)
    assert HeuristicController().decide(make_report(slots, 20)) == Action(Op.ADVANCE, slot=1)


def test_masked_rule_action_becomes_wait_with_the_reason():
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.BLENDING, acc=50.0, tempo=8)
    ticks(slots[0], 5, acc=45.0)  # losing accuracy while alpha still ramps: prune is masked
    controller = HeuristicController()
    assert controller.decide(make_report(slots, 20)) == WAIT
    assert "PRUNE masked (prune_while_alpha_ramping)" in controller.last_reason


@pytest.mark.parametrize("change", [-3.9, -10.0, 3.0])
def test_a_training_seed_is_not_pruned_for_a_host_accuracy_drop(change):
    # An incubating seed is bitwise isolated from the host: the host's accuracy says nothing
    # about it (once, "training seed lost 3.90 pp: prune").
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.TRAINING, acc=50.0)
    ticks(slots[0], 8, acc=50.0 + change)
    measure(slots[0], 50.0 + change)  # healthy gradients
    controller = HeuristicController()
    assert controller.decide(make_report(slots, 20)) == Action(Op.ADVANCE, slot=0)
    assert controller.last_reason == "training: try to advance"


@pytest.mark.parametrize(
    ("epochs_in_stage", "health", "exploding", "op", "reason"),
    [
        (5, 0.5, False, Op.PRUNE, "training seed gradient health 0.50 < 0.7: prune"),
        (5, 0.2, True, Op.PRUNE, "training seed gradients exploded or went non-finite: prune"),
        (4, 0.2, True, Op.ADVANCE, "training: try to advance"),  # too young to judge
        (5, 0.7, False, Op.ADVANCE, "training: try to advance"),
        (30, 1.0, False, Op.PRUNE, "training seed incubated 30 epochs without passing G2: prune"),
        (29, 1.0, False, Op.ADVANCE, "training: try to advance"),
    ],
)
def test_a_training_seed_is_judged_on_its_own_gradients_and_age(
    epochs_in_stage, health, exploding, op, reason
):
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.TRAINING, acc=50.0)
    ticks(slots[0], epochs_in_stage, acc=50.0)
    metrics = slots[0].state.metrics
    metrics.gradient_health, metrics.has_exploding = health, exploding
    controller = HeuristicController()
    action = controller.decide(make_report(slots, 40))
    assert action == Action(op, slot=0) and controller.last_reason == reason
    assert action.alpha_speed == AlphaSpeed.INSTANT


@pytest.mark.parametrize(("change", "op"), [(-2.5, Op.PRUNE), (-2.0, Op.ADVANCE)])
def test_a_blending_seed_that_hurts_the_host_is_still_pruned(change, op):
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.BLENDING, acc=50.0, tempo=3)
    ticks(slots[0], 5, acc=50.0 + change)  # alpha 1 after 3 ticks: the prune is legal
    controller = HeuristicController()
    assert controller.decide(make_report(slots, 30)) == Action(op, slot=0)
    if op == Op.PRUNE:
        assert controller.last_reason == "blending seed: host lost 2.50 pp: prune"


def test_blending_seed_waits_for_the_ramp_then_advances():
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.BLENDING, tempo=3)
    controller = HeuristicController()
    decisions = []
    for epoch in range(4):
        decisions.append(controller.decide(make_report(slots, 20 + epoch)))
        ticks(slots[0], 1, acc=50.0)
    assert decisions == [WAIT, WAIT, WAIT, Action(Op.ADVANCE, slot=0)]


@pytest.mark.parametrize(("tempo", "op"), [(3, Op.PRUNE), (8, Op.WAIT)])
def test_failing_blending_seed_is_pruned_once_alpha_holds(tempo, op):
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.BLENDING, tempo=tempo)
    ticks(slots[0], 5, acc=47.0)
    controller = HeuristicController()
    assert controller.decide(make_report(slots, 30)).op == op
    if op == Op.WAIT:  # the prune rule fired but alpha still ramps, so PRUNE is masked
        assert "prune_while_alpha_ramping" in controller.last_reason


@pytest.mark.parametrize(
    ("contribution", "accuracy", "op"),
    [
        (None, 51.0, Op.WAIT),  # not measured yet
        (0.6, 51.0, Op.FOSSILIZE),
        (2.0, 50.0, Op.FOSSILIZE),  # no loss of accuracy: not ransomware
        (0.5, 51.0, Op.PRUNE),  # needs strictly more than 0.5
        (0.3, 51.0, Op.PRUNE),
        (0.6, 49.0, Op.PRUNE),  # ransomware: contributes while the host got worse
        (0.05, 49.0, Op.PRUNE),
    ],
)
def test_holding_seed_is_judged_on_its_counterfactual_contribution(contribution, accuracy, op):
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.HOLDING, acc=50.0)
    measure(slots[0], accuracy, contribution)
    controller = HeuristicController()
    action = controller.decide(make_report(slots, 30))
    assert action.op == op
    if op != Op.WAIT:
        assert action.slot == 0
    if contribution == 0.6 and op == Op.PRUNE:
        assert controller.last_reason.startswith("ransomware")


@pytest.mark.parametrize(
    ("contribution", "standard_error", "op"),
    [
        (2.5, 0.9, Op.FOSSILIZE),  # 2.0 above the threshold, more than 2 standard errors
        (2.5, 1.1, Op.WAIT),  # 2.0 above, within 2 standard errors: measure again
        (-1.5, 0.9, Op.PRUNE),
        (-1.5, 1.1, Op.WAIT),
        (0.0, 0.0, Op.PRUNE),  # the seed turns no example either way: told at once
        (2.5, None, Op.FOSSILIZE),  # measured without a standard error: judged as before
    ],
)
def test_a_holding_seed_is_judged_once_its_contribution_is_told_from_the_threshold(
        contribution, standard_error, op):
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.HOLDING, acc=50.0)
    slots[0].record_accuracy(51.0)
    slots[0].record_contribution(contribution, standard_error)
    controller = HeuristicController()
    action = controller.decide(make_report(slots, 30))
    assert action.op == op, controller.last_reason
    if op == Op.WAIT:
        assert controller.last_reason == (
            f"holding: contribution {contribution:.2f} ± {standard_error:.2f} pp is within 2 "
            f"standard errors of 0.5: measure again (held "
            f"{slots[0].state.metrics.epochs_in_stage} of at most 3 decisions)")
    elif standard_error is not None:
        assert f"contribution {contribution:.2f} ± {standard_error:.2f} pp" in (
            controller.last_reason)
    # judge_z=0 is the research code's rule: the contribution alone.
    alone = HeuristicController(HeuristicConfig(judge_z=0.0)).decide(make_report(slots, 30))
    assert alone.op == (Op.FOSSILIZE if contribution > 0.5 else Op.PRUNE)


def test_an_undecided_seed_is_judged_on_its_value_when_its_holds_or_the_run_run_out():
    controller = HeuristicController()
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.HOLDING, acc=50.0)
    ops = []
    for epoch in range(30, 36):  # 2.5 ± 1.5 pp: never told apart at 2 standard errors
        slots[0].record_accuracy(51.0)
        slots[0].record_contribution(2.5, 1.5)
        action = controller.decide(make_report(slots, epoch))
        ops.append(action.op)
        if action.op != Op.WAIT:
            break
        slots[0].tick()
    held = slots[0].state.metrics.epochs_in_stage
    assert ops == [Op.WAIT] * (len(ops) - 1) + [Op.FOSSILIZE] and held == 3
    assert controller.last_reason == (
        "contribution 2.50 ± 1.50 pp > 0.5, judged on its value alone (held 3 decisions): "
        "fossilize")
    # A planned run's last decision judges it at once, holds or not.
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.HOLDING, acc=50.0)
    slots[0].record_accuracy(51.0)
    slots[0].record_contribution(-1.0, 1.5)
    last = dataclasses.replace(make_report(slots, 11), max_epochs=12)
    assert controller.decide(last).op == Op.PRUNE
    assert controller.last_reason == ("contribution -1.00 ± 1.50 pp <= 0.5, judged on its value "
                                      "alone (the run's last decision): prune")
    assert controller.decide(dataclasses.replace(last, epoch=10)).op == Op.WAIT


@pytest.mark.parametrize("judge_z", [-1.0, float("nan"), float("inf")])
def test_a_judge_z_that_is_not_a_finite_number_at_least_0_is_refused(judge_z):
    with pytest.raises(ValueError, match=r"^HeuristicConfig.judge_z must be a finite number "
                       rf">= 0, got {judge_z!r}$"):
        HeuristicConfig(judge_z=judge_z)


def test_only_the_first_live_seed_is_handled_and_no_germination_meanwhile():
    slots = make_slots(3)
    to_stage(slots[1], SeedStage.HOLDING)  # contribution unmeasured: waits
    to_stage(slots[2], SeedStage.GERMINATED)
    controller = quick_germinator()
    assert controller.decide(make_report(slots, 30)) == WAIT
    assert "contribution not measured" in controller.last_reason


# --- heuristic: prunes, penalties, embargo -----------------------------------------------------
def pruned_run(controller: HeuristicController, epochs: int = 24) -> tuple[Sim, int]:
    """Germinate conv_light at epoch 5; its gradients explode at epochs 8 to 11 while it
    incubates, so it is pruned (at 11, five epochs after it started training)."""
    sim = Sim(controller, make_slots(1))
    for epoch in range(epochs):
        sim.step(50.0, healthy=not 8 <= epoch <= 11)
    prunes = [e for e, a in enumerate(sim.actions) if a.op == Op.PRUNE]
    assert len(prunes) == 1, sim.ops()
    assert sim.actions[5].blueprint == "conv_light"
    return sim, prunes[0]


def test_prune_penalises_the_blueprint_and_the_rotation_moves_on():
    sim, p = pruned_run(HeuristicController())
    assert p == 11  # 5 epochs in TRAINING (advanced at 6), unhealthy since epoch 8
    assert [sim.penalties[p + k].get("conv_light") for k in range(1, 6)] == [
        1.0, 0.5, 0.25, 0.125, None,  # 2.0 at the prune, halved per epoch, dropped below 0.1
    ]
    germinations = [a for a in sim.actions[p:] if a.op == Op.GERMINATE]
    assert germinations[0].blueprint == "conv_heavy"


@pytest.mark.parametrize("embargo", [5, 10])
def test_no_germination_during_the_embargo_after_a_prune(embargo):
    controller = HeuristicController(HeuristicConfig(embargo_epochs_after_prune=embargo))
    sim, p = pruned_run(controller, epochs=30)
    for k in range(1, embargo):
        assert sim.reasons[p + k].startswith("embargo"), (k, sim.reasons[p + k])
    # The slot itself is empty again 7 decisions after the prune (PRUNED, 5 EMBARGOED, 1
    # RESETTING); the heuristic's own embargo only matters when it is longer.
    first = next(e for e in range(p, 30) if sim.actions[e].op == Op.GERMINATE)
    assert first == p + max(embargo, 7)
    assert all(a == WAIT for a in sim.actions[p + 1 : first])


def test_a_prune_by_someone_else_counts_too():
    slots = make_slots(2)
    to_stage(slots[0], SeedStage.TRAINING)
    controller = quick_germinator()
    controller.decide(make_report(slots, 10))
    slots[0].prune("governor_rollback")
    controller.decide(make_report(slots, 11))
    assert controller.blueprint_penalties == {"conv_light": 1.0}
    slots[0].tick()  # EMBARGOED: seen again, not counted twice
    controller.decide(make_report(slots, 12))
    assert controller.blueprint_penalties == {"conv_light": 0.5}
    assert controller.last_reason.startswith("embargo")


# --- heuristic: whole runs ---------------------------------------------------------------------
def test_full_run_fossilizes_a_good_seed():
    sim = Sim(HeuristicController(), make_slots(2))
    for epoch in range(40):
        sim.step(50.0 + 0.1 * epoch, contribution=2.0)
    assert sim.slots[0].stage == SeedStage.FOSSILIZED
    assert sim.slots[0].state.blueprint == "conv_light"
    ops = sim.ops()
    assert Op.PRUNE not in ops
    assert ops.index(Op.GERMINATE) == 5
    assert ops.count(Op.FOSSILIZE) == 1
    # The second slot gets the next blueprint of the rotation after the fossilization.
    assert sim.slots[1].state.blueprint == "conv_heavy"


@functools.cache  # shared by two tests; they only read the reports and actions
def random_heuristic_run(seed: int, epochs: int = 60) -> Sim:
    rng = np.random.default_rng(seed)
    n_slots = int(rng.integers(1, 4))
    ctx = MaskContext(blueprints=CNN.blueprints, max_seeds=[None, 1, 2][seed % 3])
    sim = Sim(HeuristicController(), make_slots(n_slots), ctx)
    acc, loss = 40.0, 1.5
    for _ in range(epochs):
        acc = float(np.clip(acc + rng.uniform(-3.0, 3.0), 0.0, 100.0))
        loss *= 1.0 - rng.uniform(-0.06, 0.04)
        contribution = None if rng.random() < 0.2 else float(rng.uniform(-1.0, 2.0))
        sim.step(acc, loss, contribution, healthy=bool(rng.random() < 0.9))
    return sim


def test_heuristic_actions_are_always_allowed_by_the_masks():
    seen: set[Op] = set()
    for seed in range(30):
        sim = random_heuristic_run(seed)
        for report, action in zip(sim.reports, sim.actions, strict=True):
            assert report.masks.allows(action), (seed, report.epoch, action)
            assert action_error(action, report.slots, report.mask_context) is None
        seen.update(sim.ops())
    # The runs must reach every decision the heuristic can take, or this test proves little.
    assert seen == {Op.WAIT, Op.GERMINATE, Op.ADVANCE, Op.PRUNE, Op.FOSSILIZE}


def test_heuristic_reset_starts_a_fresh_run():
    controller = HeuristicController()
    sim = Sim(controller, make_slots(1))
    for epoch in range(20):
        sim.step(50.0 if epoch < 8 else 47.0)
    assert controller.state_dict() != HeuristicController().state_dict()
    controller.reset()
    assert controller.state_dict() == HeuristicController().state_dict()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"plateau_epochs_to_germinate": -1}, "plateau_epochs_to_germinate"),
        ({"embargo_epochs_after_prune": 2.5}, "embargo_epochs_after_prune"),
        ({"blueprint_penalty_decay": 1.5}, "blueprint_penalty_decay"),
        ({"blueprint_rotation": ()}, "blueprint_rotation"),
        ({"blueprint_rotation": ("conv_light", "resnet")}, "'resnet'"),
        # A NaN threshold compared False with everything: the heuristic never germinated.
        ({"plateau_threshold": float("nan")}, "plateau_threshold must be a finite number, got nan"),
        ({"fossilize_contribution": float("nan")}, "fossilize_contribution must be a finite"),
        ({"germinate_from_fraction": float("inf")}, "germinate_from_fraction must be a finite"),
        ({"stabilization_threshold": -1.0}, "stabilization_threshold must be >= 0, got -1.0"),
        ({"judge_z": "2"}, "judge_z must be a finite number, got '2'"),
        ({"min_training_gradient_health": None}, "min_training_gradient_health must be a finite"),
    ],
)
def test_bad_heuristic_config_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        HeuristicConfig(**overrides)


# --- heuristic: timing that follows the run length ---------------------------------------------
def test_timing_knobs_scale_with_the_run_length():
    config = HeuristicConfig()  # given for 50 epochs
    assert HeuristicController(config).timing(50) == {
        "plateau_epochs_to_germinate": 3, "min_epochs_before_germinate": 5,
        "stabilization_epochs": 3, "embargo_epochs_after_prune": 5, "min_epochs_before_prune": 5,
    }
    assert HeuristicController(config).timing(150) == {
        "plateau_epochs_to_germinate": 9, "min_epochs_before_germinate": 15,
        "stabilization_epochs": 9, "embargo_epochs_after_prune": 15,
        "min_epochs_before_prune": 15,
    }
    short = config.scaled_to(10)  # 3 -> 0.6 -> 1 (never below 1), 5 -> 1.0 -> 1
    assert short.plateau_epochs_to_germinate == 1 and short.min_epochs_before_germinate == 1
    assert config.scaled_to(25).min_epochs_before_germinate == 3  # 2.5 rounds half up
    assert short.reference_epochs is None and short.scaled_to(1000) == short  # fixed from now
    assert config.scaled_to(None) == dataclasses.replace(config, reference_epochs=None)
    assert config.scaled_to(-1) == config.scaled_to(None)  # open-ended run: not scaled
    off = HeuristicConfig(min_epochs_before_germinate=0).scaled_to(200)
    assert off.min_epochs_before_germinate == 0  # a knob switched off stays off
    fixed = HeuristicConfig.fixed_timing(embargo_epochs_after_prune=8)
    assert fixed.reference_epochs is None and fixed.scaled_to(10).embargo_epochs_after_prune == 8
    assert config.scaled_to(10).fossilize_contribution == config.fossilize_contribution
    with pytest.raises(ValueError, match="reference_epochs must be an int >= 1 or None, got 0"):
        HeuristicConfig(reference_epochs=0)


def test_a_short_run_germinates_sooner_than_a_long_one():
    def first_germination(max_epochs: int) -> int:
        # The knobs alone: the slots' 10-decision incubation leaves a 10-decision run no seed
        # it could judge (finish_by_end, tested below).
        controller = HeuristicController(HeuristicConfig(finish_by_end=False))
        slots = make_slots(1)
        for epoch in range(max_epochs):
            report = dataclasses.replace(make_report(slots, epoch, [50.0] * (epoch + 1),
                                                     [1.0] * (epoch + 1)), max_epochs=max_epochs)
            if controller.decide(report).op == Op.GERMINATE:
                return epoch
        raise AssertionError("never germinated")

    assert first_germination(10) == 1 < first_germination(50) == 5 < first_germination(150) == 15


def _reaches_blending(controller: HeuristicController, max_epochs: int, incubation: int) -> bool:
    """Whether a flat host run of ``max_epochs`` epochs gets a seed into BLENDING."""
    torch.manual_seed(0)
    net = torch.nn.Module()
    net.conv = torch.nn.Conv2d(3, 4, 1)
    engine = MorphogenesisEngine(net, slots=["conv"], seeding=SeedingConfig(
        gate_config=GateConfig(min_training_epochs=incubation)))
    net.conv(torch.zeros(1, 3, 4, 4))  # the slot learns its width
    controller.reset()
    for _ in range(max_epochs):
        slot = engine.slots["conv"]
        if slot.state is not None:
            slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
        engine.record_epoch(50.0, 1.0, 1.0)
        action = controller.decide(engine.report(max_epochs=max_epochs))
        engine.execute(action)
        engine.tick()
    return any(e.stage == "BLENDING" for e in engine.timeline)


@pytest.mark.parametrize("config", [HeuristicConfig(finish_by_end=False),
                                    HeuristicConfig.fixed_timing(finish_by_end=False)],
                         ids=["scaled", "fixed"])
def test_earliest_germination_says_when_a_run_is_long_enough_to_blend(config):
    controller = HeuristicController(config)
    for incubation in (1, 3):
        for max_epochs in range(3, 14):
            needed = controller.earliest_germination(max_epochs) + 2 + incubation
            reached = _reaches_blending(controller, max_epochs, incubation)
            assert reached == (max_epochs >= needed), (incubation, max_epochs, needed)


def _germinations(accs: Sequence[float], max_epochs: int, incubation: int = 2):
    """(epoch, reason) of every germination the heuristic asks for in a run of ``max_epochs``
    decisions on slots incubating ``incubation`` decisions, the host's loss flat (stable)."""
    controller = HeuristicController()
    slots = make_slots(1)
    for slot in slots:
        slot.gates = QualityGates(slot.gates.mode, GateConfig(min_training_epochs=incubation))
    found = []
    for epoch in range(max_epochs):
        report = dataclasses.replace(make_report(slots, epoch, accs[:epoch + 1],
                                                 [1.0] * (epoch + 1)), max_epochs=max_epochs)
        if controller.decide(report).op == Op.GERMINATE:
            found.append((epoch, controller.last_reason))
    return found


def test_the_heuristic_germinates_at_its_last_chance_when_no_plateau_comes():
    # A seed needs 1 + 2 (incubation) + 5 (blend) + 2 = 10 decisions to be judged: in a run of
    # 20, decision 9 is the last that leaves them; the host gains 1 point a decision (never a
    # plateau), so the heuristic germinates there, and nowhere else.
    climbing = [50.0 + epoch for epoch in range(20)]
    assert decisions_to_judge(_slot_with_incubation(2).report()) == 10
    assert _germinations(climbing, 20) == [
        (9, "last decision a seed can still be judged by: germinate conv_light")]


def test_the_heuristic_never_germinates_a_seed_too_late_to_be_judged():
    controller = HeuristicController(HeuristicConfig(stabilization_epochs=0))  # stable at once
    slots = make_slots(1)
    report = dataclasses.replace(make_report(slots, 15, [50.0] * 16, [1.0] * 16), max_epochs=20)
    controller.decide(report)
    assert controller.last_reason == ("too late to germinate: 4 decision(s) left, a seed needs "
                                      "18 to incubate, blend and be judged")
    fixed = HeuristicController(HeuristicConfig(stabilization_epochs=0,
                                                plateau_epochs_to_germinate=0, finish_by_end=False))
    assert fixed.decide(report).op == Op.GERMINATE  # the rule is the config's


def _slot_with_incubation(incubation: int) -> SeedSlot:
    slot = SeedSlot("r0c0", channels=4)
    slot.gates = QualityGates(slot.gates.mode, GateConfig(min_training_epochs=incubation))
    return slot


def test_the_incubation_the_heuristic_asks_for_scales_with_the_run():
    assert HeuristicController().lifecycle(50)["incubation"] == 10
    assert HeuristicController().lifecycle(20)["incubation"] == 4
    assert HeuristicController().lifecycle(None)["incubation"] == 10
    no_incubation = HeuristicController(HeuristicConfig(incubation_epochs=None))
    assert "incubation" not in no_incubation.lifecycle(20)


def test_the_blend_the_heuristic_asks_for_shrinks_with_a_short_run_only():
    controller = HeuristicController()
    # 5 decisions (the standard tempo) given for 50, rounded half up, never below 1.
    assert controller.lifecycle(12) == {"incubation": 2, "blend": 1}  # 1.2 -> 1
    assert [controller.lifecycle(n)["blend"] for n in (1, 14, 15, 30, 34, 35, 44, 45)] == [
        1, 1, 2, 3, 3, 4, 4, 5]
    # Runs of the reference length or longer, or of unknown length, keep the standard ramp.
    assert {controller.lifecycle(n)["blend"] for n in (None, 50, 51, 150, 10_000)} == {
        Tempo.STANDARD.epochs}
    blends = [controller.lifecycle(n)["blend"] for n in range(1, 301)]
    assert blends == sorted(blends) and set(blends) == {1, 2, 3, 4, 5}
    slow = HeuristicController(HeuristicConfig(blend_epochs=8))
    assert [slow.lifecycle(n)["blend"] for n in (12, 25, 50, 100)] == [2, 4, 8, 8]
    fixed = HeuristicController(HeuristicConfig.fixed_timing())
    assert fixed.lifecycle(12) == {"incubation": 10, "blend": 5}
    assert "blend" not in HeuristicController(HeuristicConfig(blend_epochs=None)).lifecycle(12)


@pytest.mark.parametrize("blend", [0, -1, 2.5, True])
def test_a_blend_of_no_decisions_is_refused(blend):
    with pytest.raises(ValueError, match=rf"^HeuristicConfig\.blend_epochs must be an int "
                                         rf">= [01].*got {blend!r}$"):
        HeuristicConfig(blend_epochs=blend)


def _short_run(lifecycle: dict[str, int], max_epochs: int = 12) -> list[tuple[int, str]]:
    """(decision, stage) after each decision of a ``max_epochs`` run of one slot set to the
    heuristic's ``lifecycle`` durations; the host stable and gaining a point per decision (no
    plateau, so only the last chance germinates), a blended seed contributing 2 points."""
    controller = HeuristicController()
    slot = _slot_with_incubation(lifecycle["incubation"])
    slot.set_timing(blend_ticks=lifecycle["blend"])
    accs: list[float] = []
    stages = []
    for epoch in range(max_epochs):
        accs.append(50.0 + epoch)
        measure(slot, accs[-1], contribution=2.0)
        report = dataclasses.replace(make_report([slot], epoch, accs, [1.0] * (epoch + 1)),
                                     max_epochs=max_epochs)
        action = controller.decide(report)
        assert action_error(action, report.slots, report.mask_context) is None
        execute_on_slot(slot, action)
        slot.tick()
        stages.append((epoch, slot.stage.name))
    return stages


def test_on_a_12_decision_run_the_scaled_blend_leaves_a_seed_time_to_be_judged():
    # 1 + incubation 2 + blend 1 + 2 = 6 decisions to judge: decision 5 is the last chance
    # (12 - 5 - 1 = 6 left). The ramp's one tick falls on the decision G2 lets it blend, so
    # the seed is judged (fossilized) at decision 10, one before the last: the count is safe.
    lifecycle = HeuristicController().lifecycle(12)
    assert decisions_to_judge(_slot_with_incubation(2).report()) == 10  # the unscaled blend
    scaled = _slot_with_incubation(lifecycle["incubation"])
    scaled.set_timing(blend_ticks=lifecycle["blend"])
    assert decisions_to_judge(scaled.report()) == 6
    stages = _short_run(lifecycle)
    assert stages[4:] == [(4, "DORMANT"), (5, "GERMINATED"), (6, "TRAINING"), (7, "TRAINING"),
                          (8, "BLENDING"), (9, "HOLDING"), (10, "FOSSILIZED"), (11, "FOSSILIZED")]
    # With the standard 5-decision blend only decision 1 could germinate, as the first
    # short-run study found (results/short-runs).
    unscaled = _short_run({**lifecycle, "blend": Tempo.STANDARD.epochs})
    assert next(e for e, stage in unscaled if stage != "DORMANT") == 1


# --- random ------------------------------------------------------------------------------------
def random_run(controller: RandomController, epochs: int = 400, episode: int = 80) -> Sim:
    """Drive fresh slots with the controller's own actions, restarting every ``episode``."""
    rng = np.random.default_rng(1)
    sim = Sim(controller, make_slots(3))
    for epoch in range(epochs):
        if epoch % episode == 0:
            sim.slots = make_slots(3)
            controller.reset()
        sim.step(float(rng.uniform(30, 60)), contribution=float(rng.uniform(-1, 2)),
                 healthy=bool(rng.random() < 0.9))
    return sim


def test_random_actions_are_valid_on_many_reachable_states():
    # States reached by the random controller itself, plus the heuristic's runs, which get
    # seeds all the way to HOLDING and FOSSILIZED (random ones rarely survive that long).
    reports = random_run(RandomController(rng_seed=3)).reports
    reports += [r for seed in range(6) for r in random_heuristic_run(seed).reports]
    assert {s.stage for r in reports for s in r.slots} >= {
        SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING,
        SeedStage.FOSSILIZED, SeedStage.EMBARGOED, SeedStage.RESETTING,
    }
    controller = RandomController(rng_seed=9)
    actions = []
    for report in reports:
        for action in (controller.decide(report) for _ in range(4)):
            assert report.masks.allows(action), (report.epoch, action)
            assert action_error(action, report.slots, report.mask_context) is None
            for head in IRRELEVANT_CHECKED:
                if not action.relevant(head):  # irrelevant heads carry no information
                    assert getattr(action, head) == getattr(WAIT, head)
            actions.append(action)
    assert {a.op for a in actions} == set(Op)
    assert len({a.blueprint for a in actions if a.op == Op.GERMINATE}) == len(CNN.blueprints)


IRRELEVANT_CHECKED = ("blueprint", "style", "tempo", "alpha_target", "alpha_speed", "alpha_curve")


def holding_and_training_report() -> EpochReport:
    """Slot 0 HOLDING, slot 1 TRAINING (old enough to prune), slot 2 empty but blocked."""
    slots = make_slots(3)
    to_stage(slots[0], SeedStage.HOLDING)
    to_stage(slots[1], SeedStage.TRAINING)
    ticks(slots[1], 6, 50.0)
    return make_report(slots, 30)


def test_random_op_and_slot_are_uniform_over_the_legal_values():
    report = holding_and_training_report()
    allowed = {Op.WAIT, Op.SET_ALPHA_TARGET, Op.PRUNE, Op.FOSSILIZE, Op.ADVANCE}
    assert set(np.flatnonzero(report.masks.op)) == allowed
    controller = RandomController(rng_seed=0)
    actions = [controller.decide(report) for _ in range(5000)]
    ops = np.array([a.op for a in actions])
    for op in allowed:
        assert abs(np.mean(ops == op) - 0.2) < 0.03, op
    prune_slots = np.array([a.slot for a in actions if a.op == Op.PRUNE])
    assert set(prune_slots) == {0, 1} and abs(np.mean(prune_slots) - 0.5) < 0.06


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_random_wait_probability(p):
    report = holding_and_training_report()
    controller = RandomController(rng_seed=1, wait_probability=p)
    waits = np.mean([controller.decide(report).op == Op.WAIT for _ in range(2000)])
    assert abs(waits - p) < 0.04


def test_random_with_nothing_but_wait_legal_waits():
    slots = make_slots(1)
    to_stage(slots[0], SeedStage.FOSSILIZED)
    report = make_report(slots, 30)
    controller = RandomController(rng_seed=0, wait_probability=0.0)
    assert all(controller.decide(report) == WAIT for _ in range(20))


def test_random_same_seed_same_sequence_and_seeds_differ():
    report = holding_and_training_report()
    a, b = RandomController(rng_seed=5), RandomController(rng_seed=5)
    c = RandomController(rng_seed=6)
    seq_a = [a.decide(report) for _ in range(50)]
    assert seq_a == [b.decide(report) for _ in range(50)]
    assert seq_a != [c.decide(report) for _ in range(50)]


def test_random_rejects_bad_wait_probability():
    with pytest.raises(ValueError, match=r"1\.5"):
        RandomController(wait_probability=1.5)


# --- scripted ----------------------------------------------------------------------------------
GERMINATE = Action(Op.GERMINATE, slot=1, blueprint="norm", tempo=Tempo.FAST)


def test_scripted_plays_actions_at_their_epochs_and_waits_elsewhere():
    slots = make_slots(2)
    controller = ScriptedController({2: GERMINATE, 3: Action(Op.ADVANCE, slot=1)})
    actions = [controller.decide(make_report(slots, e)) for e in range(6)]
    assert actions == [WAIT, WAIT, GERMINATE, Action(Op.ADVANCE, slot=1), WAIT, WAIT]


def test_scripted_accepts_pairs_and_queues_repeated_epochs():
    second = Action(Op.ADVANCE, slot=1)
    controller = ScriptedController([(4, GERMINATE), (4, second), (7, [second])])
    assert controller.script == {4: (GERMINATE, second), 7: (second,)}
    report = make_report(make_slots(2), 4)
    assert [controller.decide(report) for _ in range(3)] == [GERMINATE, second, WAIT]
    controller.reset()
    assert controller.decide(report) == GERMINATE


def test_scripted_returns_illegal_actions_as_written():
    fossilize = Action(Op.FOSSILIZE, slot=0)  # nothing to fossilize: the engine turns it to WAIT
    report = make_report(make_slots(1), 0)
    assert not report.masks.allows(fossilize)
    assert ScriptedController({0: fossilize}).decide(report) == fossilize


@pytest.mark.parametrize(
    ("script", "error", "match"),
    [
        ({-3: GERMINATE}, ValueError, "-3"),
        ([(2, GERMINATE), (-1, WAIT)], ValueError, "-1"),
        ({1.5: GERMINATE}, ValueError, "1.5"),
        ({True: GERMINATE}, ValueError, "True"),
        ([(1, GERMINATE, 2)], ValueError, "pairs"),
        ({1: "germinate"}, TypeError, "germinate"),
        ({1: [GERMINATE, Op.ADVANCE]}, TypeError, "epoch 1"),
        (5, TypeError, "mapping"),
    ],
)
def test_bad_script_raises_early_naming_the_value(script, error, match):
    with pytest.raises(error, match=match):
        ScriptedController(script)


def test_scripted_state_must_match_the_script():
    state = ScriptedController({1: GERMINATE}).state_dict()
    state["served"] = [[1, 2]]
    with pytest.raises(ValueError, match="epoch 1"):
        ScriptedController({1: GERMINATE}).load_state_dict(state)


# --- protocol and state ------------------------------------------------------------------------
def heuristic_sim(controller: Controller) -> Sim:
    rng = np.random.default_rng(11)
    sim = Sim(controller, make_slots(2))
    acc = 50.0
    for _ in range(70):
        acc += float(rng.uniform(-2.5, 1.0))
        sim.step(acc, contribution=float(rng.uniform(-0.5, 2.0)))
    return sim


def scripted() -> ScriptedController:
    return ScriptedController(
        {2: GERMINATE, 3: Action(Op.ADVANCE, slot=1), 14: Action(Op.ADVANCE, slot=1),
         25: [Action(Op.PRUNE, slot=1), WAIT]}
    )


CONTROLLERS: dict[str, tuple[Callable[[], Controller], Callable[[Controller], Sim]]] = {
    "heuristic": (HeuristicController, heuristic_sim),
    "random": (lambda: RandomController(rng_seed=4, wait_probability=0.6),
               lambda c: random_run(c, epochs=70, episode=35)),
    "scripted": (scripted, heuristic_sim),
    "static": (StaticController, heuristic_sim),
}


@pytest.mark.parametrize("name", CONTROLLERS)
def test_state_dict_round_trip_through_torch_continues_identically(name):
    factory, run = CONTROLLERS[name]
    sim = run(factory())
    assert isinstance(sim.controller, Controller)
    if name == "heuristic":  # the run must exercise prunes and penalties to mean something
        assert Op.PRUNE in sim.ops() and Op.GERMINATE in sim.ops()
    resets = {e for e in range(len(sim.reports)) if e % 35 == 0} if name == "random" else {0}
    for split in (10, 33, 50):
        replay = factory()
        for epoch in range(split):
            if epoch in resets:
                replay.reset()
            assert replay.decide(sim.reports[epoch]) == sim.actions[epoch], (name, epoch)
        state = replay.state_dict()
        assert_plain(state)
        restored = factory()
        restored.load_state_dict(torch_round_trip(state))
        assert restored.state_dict() == state
        for epoch in range(split, len(sim.reports)):
            if epoch in resets:
                restored.reset()
            assert restored.decide(sim.reports[epoch]) == sim.actions[epoch], (name, epoch)


@pytest.mark.parametrize("name", CONTROLLERS)
def test_loading_another_controllers_state_is_refused(name):
    factory, _ = CONTROLLERS[name]
    other = StaticController() if name != "static" else HeuristicController()
    with pytest.raises(ValueError, match="expected"):
        factory().load_state_dict(other.state_dict())
    state = factory().state_dict()
    state["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        factory().load_state_dict(state)


@pytest.mark.parametrize("module", [base_module, heuristic_module, baselines_module])
def test_docstring_examples_run(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# --- optional hooks -------------------------------------------------------------------------------
def test_the_optional_hooks_are_protocols_with_defaults_in_controller_base():
    from esper_lightning.controllers import ControllerBase, ExplainsDecisions, PlansGermination

    heuristic = HeuristicController()
    assert isinstance(heuristic, ExplainsDecisions) and isinstance(heuristic, PlansGermination)
    assert not isinstance(StaticController(), ExplainsDecisions | PlansGermination)

    class Minimal(ControllerBase):
        pass

    minimal = Minimal()
    assert isinstance(minimal, base_module.Controller)
    assert isinstance(minimal, ExplainsDecisions) and isinstance(minimal, PlansGermination)
    assert minimal.last_reason is None and minimal.earliest_germination(30) is None
    assert minimal.timing(30) == {} and minimal.state_dict() == {}
    minimal.reset()
    minimal.load_state_dict({})
    with pytest.raises(ValueError, match=r"Minimal keeps no state; got keys \['counter'\]"):
        minimal.load_state_dict({"counter": 1})
    with pytest.raises(NotImplementedError, match="Minimal must implement decide"):
        minimal.decide(make_report(make_slots(1), 0))
