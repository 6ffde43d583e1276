"""Governor: the divergence rules and their state."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import torch_round_trip

from esper_lightning.core.divergence import (
    REASON_DIVERGENCE,
    REASON_LOBOTOMY,
    REASON_NAN,
    Governor,
    GovernorConfig,
)


# ================================================================================================
# Governor rules
# ================================================================================================
def stable(n: int, level: float = 1.0) -> list[float]:
    """``n`` readings wobbling ±1% around ``level``."""
    return [level * (1.0 + 0.01 * math.sin(i)) for i in range(n)]


def feed(governor: Governor, losses: list[float], **kwargs) -> list[str | None]:
    return [governor.check_validation(loss, **kwargs) for loss in losses]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_train_loss_panics_at_once(bad):
    governor = Governor()
    assert governor.check_train_loss(0.5) is None
    assert governor.check_train_loss(bad) == REASON_NAN
    assert governor.last_reason == REASON_NAN
    assert governor.history == ()  # train losses never enter the history


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_validation_panics_even_without_history(bad):
    governor = Governor()
    assert governor.check_validation(bad) == REASON_NAN
    assert governor.check_validation(1.0, val_accuracy=bad) == REASON_NAN
    assert governor.history == ()


def test_divergence_on_the_third_consecutive_anomaly_not_before():
    governor = Governor()
    assert feed(governor, stable(15)) == [None] * 15
    assert feed(governor, [20.0, 20.0, 20.0]) == [None, None, REASON_DIVERGENCE]
    assert governor.consecutive_anomalies == 3
    assert governor.last_panic_loss == 20.0
    assert governor.history == tuple(stable(15))  # anomalies were not appended


def test_two_anomalies_then_a_normal_reading_reset_the_count():
    governor = Governor()
    feed(governor, stable(15))
    assert feed(governor, [20.0, 20.0, 1.0]) == [None, None, None]
    assert governor.consecutive_anomalies == 0 and governor.last_reason is None
    assert feed(governor, [20.0, 20.0]) == [None, None]  # needs three in a row again
    assert governor.check_validation(20.0) == REASON_DIVERGENCE


def test_readings_below_the_absolute_threshold_never_diverge():
    # 10 is far above mean + 6σ and 3× mean, but below the absolute threshold of 12.
    governor = Governor()
    feed(governor, stable(15))
    assert feed(governor, [10.0] * 5) == [None] * 5


def test_no_check_before_min_history():
    governor = Governor()
    assert feed(governor, [*stable(5), 100.0, 100.0, 100.0]) == [None] * 8
    assert len(governor.history) == 8  # appended: not enough history to judge them


def test_history_window_slides():
    governor = Governor()
    feed(governor, [float(i) for i in range(30)])
    assert governor.history == tuple(float(i) for i in range(10, 30))


def test_lobotomy_when_a_good_model_jumps_to_the_uniform_guess_loss():
    guess = math.log(10)
    governor = Governor()
    assert feed(governor, stable(12, 0.8), num_classes=10) == [None] * 12
    history = governor.history
    assert governor.check_validation(guess + 0.1, num_classes=10) == REASON_LOBOTOMY
    assert governor.history == history  # the panicking reading is not recorded


def test_lobotomy_needs_tolerance_good_history_and_num_classes():
    guess = math.log(10)
    outside = Governor(GovernorConfig(num_classes=10))
    feed(outside, stable(12, 0.8))
    assert outside.check_validation(guess + 0.2) is None  # 0.2 > 0.065·ln 10 ≈ 0.15
    assert outside.check_validation(guess - 0.1) == REASON_LOBOTOMY  # config num_classes

    never_learned = Governor(GovernorConfig(num_classes=10))
    feed(never_learned, stable(12, 1.5))  # mean 1.5 is not < 0.6·ln 10 ≈ 1.38
    assert never_learned.check_validation(guess) is None

    short = Governor(GovernorConfig(num_classes=10))
    feed(short, stable(9, 0.8))
    assert short.check_validation(guess) is None  # history 9 < 10

    unknown = Governor()
    feed(unknown, stable(12, 0.8))
    assert unknown.check_validation(guess) is None  # rule off without num_classes


def test_normal_noisy_decreasing_curve_never_panics():
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(100, generator=gen).mul(0.05).tolist()
    curve = [0.3 + 2.0 * math.exp(-t / 15) + noise[t] for t in range(100)]
    governor = Governor(GovernorConfig(num_classes=10))
    assert feed(governor, curve) == [None] * 100
    assert all(governor.check_train_loss(loss) is None for loss in curve)


def test_panics_do_not_pollute_history():
    governor = Governor(GovernorConfig(num_classes=10))
    feed(governor, stable(12, 0.8))
    before = governor.history
    governor.check_validation(float("nan"))
    governor.check_validation(0.8, val_accuracy=float("nan"))
    governor.check_validation(math.log(10))
    governor.check_validation(50.0)
    governor.check_train_loss(float("inf"))
    assert governor.history == before


def test_rollback_keeps_history_and_resets_the_count():
    governor = Governor()
    feed(governor, stable(15))
    feed(governor, [20.0] * 3)
    governor.record_rollback()
    assert governor.rollbacks == 1
    assert governor.consecutive_anomalies == 0 and governor.last_reason is None
    assert governor.history == tuple(stable(15))
    assert governor.check_validation(20.0) is None  # a fresh run of three is needed


def test_immediate_panic_without_rollback_arms_divergence():
    # Upstream: NaN/lobotomy jump the counter to the rollback level.
    governor = Governor()
    feed(governor, stable(15))
    assert governor.check_train_loss(float("nan")) == REASON_NAN
    assert governor.check_validation(20.0) == REASON_DIVERGENCE


def test_reset_clears_readings_but_not_the_rollback_total():
    governor = Governor()
    feed(governor, stable(15))
    governor.check_validation(20.0)
    governor.record_rollback()
    governor.reset()
    assert governor.history == () and governor.consecutive_anomalies == 0
    assert governor.last_reason is None and governor.last_panic_loss is None
    assert governor.rollbacks == 1


def test_snapshot_cadence():
    governor = Governor(GovernorConfig(snapshot_every=5))
    assert [e for e in range(12) if governor.should_snapshot(e)] == [0, 5, 10]
    assert governor.should_snapshot(3, fossilized=True)


def test_state_dict_round_trip_continues_identically():
    config = GovernorConfig(num_classes=10)
    original = Governor(config)
    feed(original, stable(14, 0.8))
    original.check_validation(20.0)  # one pending anomaly
    original.record_rollback()
    original.check_validation(20.0)

    state = torch_round_trip(original.state_dict())
    restored = Governor(config)
    restored.load_state_dict(state)
    assert restored.state_dict() == original.state_dict()

    tail = [20.0, 0.7, 20.0, 20.0, 20.0, 0.75, math.log(10), *stable(25, 0.6), 30.0]
    assert feed(restored, tail) == feed(original, tail)
    assert restored.state_dict() == original.state_dict()
    assert restored.rollbacks == 1


def test_load_state_dict_rejects_bad_state():
    governor = Governor(GovernorConfig(history_length=12))
    state = governor.state_dict()
    with pytest.raises(ValueError, match="keys"):
        governor.load_state_dict({k: v for k, v in state.items() if k != "rollbacks"})
    with pytest.raises(ValueError, match="<= 12 finite losses, got 13"):
        governor.load_state_dict({**state, "history": [1.0] * 13})
    with pytest.raises(ValueError, match="last_reason 'boom'"):
        governor.load_state_dict({**state, "last_reason": "boom"})


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("absolute_threshold", float("nan"), "finite number > 0"),
        ("sigma", 0.0, "finite number > 0"),
        ("multiplier", -3.0, "finite number > 0"),
        ("lobotomy_mean_fraction", 1.5, "in (0, 1]"),
        ("lobotomy_tolerance", 0.0, "in (0, 1]"),
        ("min_history", 1, "int >= 2"),
        ("history_length", 5, "int >= 10"),
        ("history_length", 20.0, "int >= 10"),
        ("consecutive", 0, "int >= 1"),
        ("consecutive", True, "int >= 1"),
        ("snapshot_every", 0, "int >= 1"),
        ("num_classes", 1, "int >= 2"),
    ],
)
def test_config_rejects_bad_values_naming_them(field, value, accepted):
    with pytest.raises(ValueError) as info:
        GovernorConfig(**{field: value})
    message = str(info.value)
    assert f"GovernorConfig.{field}" in message and accepted in message
    assert repr(value) in message and "\n" not in message


def test_bad_num_classes_at_check_time():
    governor = Governor()
    feed(governor, stable(12))
    with pytest.raises(ValueError, match=r"num_classes must be an int >= 2 \(classes or "
                       r"vocabulary size\) or None \(lobotomy rule off\), got 1"):
        governor.check_validation(1.0, num_classes=1)
