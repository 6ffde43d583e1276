from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper_lightning.blueprints import (
    NO_BLUEPRINT,
    BlueprintError,
    available,
    blueprint_index,
    blueprint_table,
)
from esper_lightning.core.actions import (
    CANONICAL,
    CAUSAL_RELEVANCE,
    HEADS,
    Action,
    AlphaSpeed,
    LifecycleOp,
    MaskContext,
    action_error,
    canonicalize,
    compute_masks,
)
from esper_lightning.core.engine import execute_on_slot
from esper_lightning.core.lifecycle import IllegalTransitionError, SeedStage
from esper_lightning.core.slots import SeedSlot

CNN = MaskContext(blueprints=available("cnn"))


def _slots(n: int = 3) -> list[SeedSlot]:
    return [SeedSlot(f"r0c{i}", channels=2) for i in range(n)]


def test_enum_values_match_upstream():
    assert [op.name for op in LifecycleOp] == [
        "WAIT", "GERMINATE", "SET_ALPHA_TARGET", "PRUNE", "FOSSILIZE", "ADVANCE"
    ]
    assert blueprint_index("conv_light") == 1 and blueprint_index("flex_attention") == 12
    assert [s.steps for s in AlphaSpeed] == [0, 3, 5, 8]
    assert HEADS[0] == "op"


def test_the_blueprint_head_takes_names_and_table_indices():
    action = Action(LifecycleOp.GERMINATE, slot=0, blueprint="norm")
    assert action.indices()[HEADS.index("blueprint")] == blueprint_index("norm") == 3
    assert Action.from_indices(action.indices()) == action == Action(LifecycleOp.GERMINATE, 0,
                                                                     blueprint=3)
    assert "blueprint=norm" in action.describe()
    assert Action().blueprint is None and Action().indices()[2] == NO_BLUEPRINT
    with pytest.raises(BlueprintError, match="unknown blueprint 'nrom'; known: conv_light, "):
        Action(LifecycleOp.GERMINATE, 0, blueprint="nrom")
    last = len(blueprint_table()) - 1
    with pytest.raises(BlueprintError, match=rf"blueprint index 99 outside the table 0\.\.{last}"):
        Action.from_indices([1, 0, 99, 0, 0, 0, 0, 0])
    views = [s.report() for s in _slots()]
    assert action_error(Action(LifecycleOp.GERMINATE, 0), views, CNN) == (
        "blueprint_none_not_allowed"
    )


def test_causal_relevance_table():
    assert CAUSAL_RELEVANCE[LifecycleOp.WAIT] == {"op"}
    assert CAUSAL_RELEVANCE[LifecycleOp.PRUNE] == {"op", "slot", "alpha_speed", "alpha_curve"}
    assert CAUSAL_RELEVANCE[LifecycleOp.FOSSILIZE] == {"op", "slot"}
    assert all("op" in heads for heads in CAUSAL_RELEVANCE.values())


def test_canonicalize_resets_irrelevant_heads():
    action = Action(LifecycleOp.FOSSILIZE, slot=2, blueprint="norm", tempo=0)
    canon = canonicalize(action)
    assert canon.slot == 2 and canon.blueprint is None
    assert canon.indices()[HEADS.index("blueprint")] == CANONICAL["blueprint"]
    assert canon.tempo == CANONICAL["tempo"]
    assert canonicalize(Action(LifecycleOp.WAIT, slot=2), canonical_slot=0).slot == 0


def test_empty_slots_allow_germinate_and_wait_only():
    masks = compute_masks([s.report() for s in _slots()], CNN)
    assert masks.op.tolist() == [True, True, False, False, False, False]
    assert masks.slot_by_op[LifecycleOp.GERMINATE].all()
    assert not masks.blueprint[NO_BLUEPRINT]
    assert not masks.blueprint[blueprint_index("lora")]  # transformer-only
    assert masks.blueprint[blueprint_index("conv_light")]


def test_one_seed_incubating_at_a_time_and_no_germination_in_cooldown():
    slots = _slots()
    slots[0].germinate("norm")
    masks = compute_masks([s.report() for s in slots], CNN)
    assert not masks.op[LifecycleOp.GERMINATE]
    assert action_error(Action(LifecycleOp.GERMINATE, slot=1, blueprint=3),
                        [s.report() for s in slots], CNN) == (
        "another_seed_incubating_or_cooling_down"
    )
    slots[0].prune("test")
    assert not compute_masks([s.report() for s in slots], CNN).op[LifecycleOp.GERMINATE]


def test_prune_needs_age_and_alpha_hold():
    slots = _slots(1)
    slots[0].germinate("norm")
    for _ in range(4):
        slots[0].tick()
    views = [slots[0].report()]
    assert action_error(Action(LifecycleOp.PRUNE), views, CNN) == "prune_age_4_below_5"
    slots[0].tick()
    assert action_error(Action(LifecycleOp.PRUNE), [slots[0].report()], CNN) is None


def test_retarget_and_fossilize_rules():
    slot = SeedSlot("r0c0", channels=2)
    slot.germinate("norm", tempo=3)
    slot.advance()
    slot.state.metrics.epochs_in_stage = 10
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed  # -> BLENDING, alpha ramping up
    views = [slot.report()]
    assert action_error(Action(LifecycleOp.SET_ALPHA_TARGET), views, CNN) == (
        "retarget_while_alpha_ramping"
    )
    assert action_error(Action(LifecycleOp.FOSSILIZE), views, CNN) == "fossilize_from_blending"
    for _ in range(3):
        slot.tick()
    assert action_error(Action(LifecycleOp.SET_ALPHA_TARGET), [slot.report()], CNN) is None


def test_max_seeds_and_blueprint_restriction():
    slots = _slots(2)
    slots[0].germinate("norm")
    slots[0].state.stage = SeedStage.FOSSILIZED  # present, does not block incubation
    ctx = MaskContext(blueprints=("norm",), max_seeds=1)
    views = [s.report() for s in slots]
    assert action_error(Action(LifecycleOp.GERMINATE, 1, blueprint=3), views, ctx) == (
        "max_seeds_1_reached"
    )
    ctx = MaskContext(blueprints=("norm",))
    assert action_error(Action(LifecycleOp.GERMINATE, 1, blueprint=1), views, ctx) == (
        "blueprint_conv_light_not_allowed"
    )
    masks = compute_masks(views, ctx)
    assert masks.blueprint.sum() == 1 and masks.blueprint[blueprint_index("norm")]


def test_head_masks_collapse_irrelevant_heads():
    masks = compute_masks([s.report() for s in _slots()], CNN)
    tempo = masks.head("tempo", LifecycleOp.WAIT)
    assert tempo.sum() == 1 and tempo[CANONICAL["tempo"]]
    assert masks.head("tempo", LifecycleOp.GERMINATE).all()


# --- property test over reachable states ------------------------------------------------------

_actions = st.builds(
    Action,
    # Weighted toward the ops that move a seed forward so deep stages are reached.
    op=st.sampled_from([*LifecycleOp, LifecycleOp.ADVANCE, LifecycleOp.ADVANCE,
                        LifecycleOp.FOSSILIZE, LifecycleOp.FOSSILIZE,
                        LifecycleOp.SET_ALPHA_TARGET]),
    slot=st.integers(0, 2),
    blueprint=st.sampled_from(["norm", "conv_small"]),
    style=st.integers(0, 3),
    tempo=st.integers(0, 2),
    alpha_target=st.integers(0, 2),
    alpha_speed=st.integers(0, 3),
    alpha_curve=st.integers(0, 4),
)
_step = st.tuples(
    _actions,
    st.booleans(),  # aim the op at a slot whose mask allows it (reaches deep stages)
    st.sampled_from([True, True, True, False]),  # healthy gradients
    st.floats(-2.0, 2.0),  # counterfactual contribution
    st.integers(0, 6),  # epochs to tick after the action
)


def _measure(slot: SeedSlot, healthy: bool, contribution: float) -> None:
    """Feed the measurements the gates read, as the engine would."""
    if slot.seed is None:
        return
    metrics = slot.state.metrics
    metrics.gradient_health, metrics.has_exploding = (1.0, False) if healthy else (0.2, True)
    if slot.alpha > 0:
        slot.record_contribution(contribution)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_step, min_size=30, max_size=80))
def test_masks_never_allow_an_action_the_slot_rejects(steps):
    slots = _slots()
    ctx = MaskContext(blueprints=("norm", "conv_small"), max_seeds=2)
    for action, aim, healthy, contribution, ticks in steps:
        views = [s.report() for s in slots]
        masks = compute_masks(views, ctx)
        if aim and masks.slot_by_op[action.op].any():
            action = replace(action, slot=int(np.flatnonzero(masks.slot_by_op[action.op])[0]))
        assert masks.op.any() and masks.op[LifecycleOp.WAIT]
        for head in HEADS:
            for op in np.flatnonzero(masks.op):
                assert masks.head(head, LifecycleOp(op)).any(), (head, op)
        legal = action_error(action, views, ctx) is None
        assert legal == masks.allows(canonicalize(action, action.slot))
        if legal:
            execute_on_slot(slots[action.slot], action)  # must not raise
        elif action.op != LifecycleOp.GERMINATE:
            # An op the masks forbid is one the slot itself refuses (or a no-op gate miss).
            _assert_slot_refuses(slots[action.slot], action, views[action.slot].stage)
        for _ in range(ticks):
            for slot in slots:
                _measure(slot, healthy, contribution)
                slot.tick()


def _assert_slot_refuses(slot: SeedSlot, action: Action, stage: SeedStage) -> None:
    if action.op == LifecycleOp.PRUNE and stage in (
        SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING
    ):
        return  # too young or ramping: a controller rule, not a state-machine rule
    with pytest.raises(IllegalTransitionError):
        execute_on_slot(slot, action)


def test_the_blueprint_mask_depends_on_the_chosen_slot():
    views = [s.report() for s in _slots(3)]
    ctx = MaskContext(blueprints=("norm", "conv_small"),
                      slot_refuses=(frozenset({"conv_small"}), frozenset(),
                                    frozenset({"norm", "conv_small"})))
    masks = compute_masks(views, ctx)
    norm, small = blueprint_index("norm"), blueprint_index("conv_small")
    assert np.flatnonzero(masks.blueprint_by_slot[0]).tolist() == [norm]
    assert np.flatnonzero(masks.blueprint_by_slot[1]).tolist() == sorted([norm, small])
    # A slot that hosts none of the run's blueprints is no place to germinate.
    assert masks.slot_by_op[LifecycleOp.GERMINATE].tolist() == [True, True, False]
    assert action_error(Action(LifecycleOp.GERMINATE, 2, blueprint="norm"), views, ctx) == (
        "no_blueprint_fits_slot")
    refused = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_small")
    assert not masks.allows(refused)
    assert action_error(refused, views, ctx) == "blueprint_conv_small_not_hostable_in_slot_0"
    assert masks.allows(replace(refused, slot=1)) and masks.blueprint[small]
    with pytest.raises(ValueError, match="slot_refuses for 3 slots and the report 2"):
        compute_masks(views[:2], ctx)


def test_a_mask_legal_germination_is_one_the_engine_executes():
    from esper_lightning.core.engine import MorphogenesisEngine
    from esper_lightning.hosts import GPTHost

    # r0c0 is a plain slot, r1c0 a growth slot: growth blueprints fit only the second.
    engine = MorphogenesisEngine(GPTHost("grow2", slots=("r0c0", "r1c0")), rng_seed=0)
    masks = engine.report().masks
    views = [s.report() for s in engine.slots.values()]
    slots = list(engine.slots.values())
    for slot in range(2):
        for name in engine.mask_context.blueprints:
            action = Action(LifecycleOp.GERMINATE, slot, blueprint=name)
            executes = (action_error(action, views, engine.mask_context) is None
                        and slots[slot].context_error(name) is None)
            assert masks.allows(action) == executes, (slot, name)
    assert masks.allows(Action(LifecycleOp.GERMINATE, 1, blueprint="block_copy"))
