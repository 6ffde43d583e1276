import pytest

from esper_lightning.core.lifecycle import (
    EMBARGO_TICKS,
    MIN_TRAINING_EPOCHS,
    RESETTING_TICKS,
    STAGE_ONE_HOT_INDEX,
    VALID_TRANSITIONS,
    AlphaView,
    GateMode,
    IllegalTransitionError,
    QualityGates,
    SeedStage,
    SeedState,
    default_successor,
    parse_stage,
)

HOLD_FULL = AlphaView(alpha=1.0, target=1.0, holding=True)


def test_stage_values_match_upstream():
    assert {s.name: s.value for s in SeedStage} == {
        "UNKNOWN": 0, "DORMANT": 1, "GERMINATED": 2, "TRAINING": 3, "BLENDING": 4,
        "HOLDING": 6, "FOSSILIZED": 7, "PRUNED": 8, "EMBARGOED": 9, "RESETTING": 10,
    }
    assert sorted(STAGE_ONE_HOT_INDEX.values()) == list(range(10))
    assert STAGE_ONE_HOT_INDEX[SeedStage.HOLDING] == 5


def test_reserved_stage_value_rejected():
    with pytest.raises(ValueError, match="5 is reserved"):
        parse_stage(5)
    with pytest.raises(ValueError, match="unknown seed stage value 11"):
        parse_stage(11)
    assert parse_stage(6) is SeedStage.HOLDING


def test_transition_table_and_default_successor():
    assert VALID_TRANSITIONS[SeedStage.HOLDING] == (
        SeedStage.FOSSILIZED, SeedStage.BLENDING, SeedStage.PRUNED
    )
    assert VALID_TRANSITIONS[SeedStage.FOSSILIZED] == ()
    assert default_successor(SeedStage.HOLDING) == SeedStage.FOSSILIZED
    assert default_successor(SeedStage.TRAINING) == SeedStage.BLENDING
    assert default_successor(SeedStage.PRUNED) is None


def test_illegal_transition_raises_and_history_records_reasons():
    state = SeedState("s", "norm")
    state.transition(SeedStage.GERMINATED, "germinate")
    with pytest.raises(IllegalTransitionError, match="GERMINATED -> HOLDING"):
        state.transition(SeedStage.HOLDING, "skip")
    state.transition(SeedStage.TRAINING, "G1 passed")
    assert [(e.source, e.target, e.reason) for e in state.history] == [
        (1, 2, "germinate"), (2, 3, "G1 passed"),
    ]
    assert state.previous_stage == SeedStage.GERMINATED


def test_embargo_lasts_exactly_five_ticks_plus_one_resetting_tick():
    state = SeedState("s", "norm", stage=SeedStage.TRAINING)
    state.transition(SeedStage.PRUNED, "test")
    seen = []
    emptied = False
    while not emptied:
        emptied = state.tick()
        seen.append(SeedStage.DORMANT if emptied else state.stage)
    assert EMBARGO_TICKS == 5 and RESETTING_TICKS == 1
    assert seen == [SeedStage.EMBARGOED] * 5 + [SeedStage.RESETTING, SeedStage.DORMANT]


def test_tick_is_the_only_counter_source():
    state = SeedState("s", "norm", stage=SeedStage.TRAINING)
    state.metrics.record_accuracy(50.0)
    state.metrics.record_accuracy(51.0)
    assert state.metrics.epochs_total == 0
    state.tick()
    assert (state.metrics.epochs_total, state.metrics.epochs_in_stage) == (1, 1)


def _training_state(epochs: int, **metrics) -> SeedState:
    state = SeedState("s", "norm", stage=SeedStage.TRAINING)
    state.metrics.epochs_in_stage = epochs
    for key, value in metrics.items():
        setattr(state.metrics, key, value)
    return state


def test_g2_fails_closed_when_gradients_unmeasured():
    gates = QualityGates()
    result = gates.check(SeedStage.BLENDING, _training_state(MIN_TRAINING_EPOCHS), HOLD_FULL)
    assert not result.passed
    assert "gradient_health_measured" in result.checks_failed


def test_g2_permissive_passes_with_measured_health_after_ten_epochs():
    gates = QualityGates()
    ok = _training_state(10, gradient_health=0.9, has_exploding=False)
    assert gates.check(SeedStage.BLENDING, ok, HOLD_FULL).passed
    young = _training_state(9, gradient_health=0.9, has_exploding=False)
    assert gates.check(SeedStage.BLENDING, young, HOLD_FULL).checks_failed == (
        "min_training_epochs",
    )
    sick = _training_state(10, gradient_health=0.6, has_exploding=False)
    assert not gates.check(SeedStage.BLENDING, sick, HOLD_FULL).passed


def test_g2_strict_needs_improvement_and_gradient_ratio():
    gates = QualityGates(GateMode.STRICT)
    state = _training_state(10, gradient_ratio=None)
    result = gates.check(SeedStage.BLENDING, state, HOLD_FULL)
    assert {"min_improvement", "gradient_ratio_measured", "gradient_ratio"} <= set(
        result.checks_failed
    )
    state = _training_state(10, gradient_ratio=0.2, current_accuracy=60.0)
    state.metrics.accuracy_at_stage_start = 59.0
    assert gates.check(SeedStage.BLENDING, state, HOLD_FULL).passed


def test_g3_needs_full_target_reached_in_hold():
    gates = QualityGates()
    state = SeedState("s", "norm", stage=SeedStage.BLENDING)
    assert gates.check(SeedStage.HOLDING, state, HOLD_FULL).passed
    assert not gates.check(SeedStage.HOLDING, state, AlphaView(0.7, 0.7, True)).passed
    assert not gates.check(SeedStage.HOLDING, state, AlphaView(0.6, 1.0, False)).passed


def test_g5_fails_closed_without_counterfactual():
    gates = QualityGates()
    state = SeedState("s", "norm", stage=SeedStage.HOLDING)
    state.metrics.gradient_health, state.metrics.has_exploding = 1.0, False
    result = gates.check(SeedStage.FOSSILIZED, state, HOLD_FULL)
    assert result.checks_failed == ("counterfactual_measured",)
    state.metrics.record_contribution(0.3)
    assert gates.check(SeedStage.FOSSILIZED, state, HOLD_FULL).passed
    strict = QualityGates("strict").check(SeedStage.FOSSILIZED, state, HOLD_FULL)
    assert strict.checks_failed == ("min_contribution",)


def test_unknown_gate_fails_closed():
    result = QualityGates().check(SeedStage.PRUNED, SeedState("s", "norm"), HOLD_FULL)
    assert not result.passed and result.checks_failed == ("no_gate_for_pruned",)


def test_bad_gate_mode_message():
    with pytest.raises(ValueError, match="unknown gate mode 'lenient'; accepted: permissive"):
        QualityGates("lenient")


def test_seed_state_round_trip():
    state = _training_state(3, gradient_health=0.8, counterfactual_contribution=1.5)
    state.transition(SeedStage.PRUNED, "why")
    state.tick()
    restored = SeedState.from_dict(state.to_dict())
    assert restored == state


def test_contribution_velocity_is_an_ema_of_changes():
    state = SeedState("s", "norm")
    state.metrics.record_contribution(1.0)
    state.metrics.record_contribution(3.0)
    assert state.metrics.contribution_velocity == pytest.approx(0.3 * 2.0)
