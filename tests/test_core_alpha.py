from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esper_lightning.core.alpha import AlphaController, AlphaCurve, AlphaMode, curve_progress


@pytest.mark.parametrize("curve", list(AlphaCurve))
@pytest.mark.parametrize("steps", [1, 3, 5, 8])
@pytest.mark.parametrize(("start", "target"), [(0.0, 1.0), (1.0, 0.0), (0.2, 0.7), (0.7, 0.5)])
def test_ramp_is_monotone_and_lands_exactly(curve, steps, start, target):
    ctrl = AlphaController(start)
    ctrl.retarget(target, steps, curve)
    values, reached = [start], []
    for _ in range(steps):
        reached.append(ctrl.step())
        values.append(ctrl.alpha)
    sign = 1 if target > start else -1
    assert all(sign * (b - a) >= 0 for a, b in pairwise(values))
    assert values[-1] == target  # exact snap, not approximately
    assert reached == [False] * (steps - 1) + [True]
    assert ctrl.mode == AlphaMode.HOLD


def test_linear_values_and_velocity():
    ctrl = AlphaController()
    ctrl.retarget(1.0, 4)
    assert ctrl.velocity == 0.25
    seen = []
    for _ in range(4):
        ctrl.step()
        seen.append(ctrl.alpha)
    assert seen == [0.25, 0.5, 0.75, 1.0]
    assert ctrl.velocity == 0.0


def test_retarget_only_in_hold():
    ctrl = AlphaController()
    ctrl.retarget(1.0, 3)
    with pytest.raises(RuntimeError, match="retarget while ramping"):
        ctrl.retarget(0.5, 3)


def test_zero_steps_snaps():
    ctrl = AlphaController(0.3)
    ctrl.retarget(0.9, 0)
    assert ctrl.alpha == 0.9 and ctrl.mode == AlphaMode.HOLD


def test_step_in_hold_does_nothing():
    ctrl = AlphaController(0.4)
    assert ctrl.step() is False and ctrl.alpha == 0.4


@given(st.sampled_from(list(AlphaCurve)), st.floats(0.1, 50.0))
def test_curves_map_unit_interval_onto_itself(curve, k):
    grid = [i / 20 for i in range(21)]
    values = [curve_progress(curve, t, k) for t in grid]
    assert values[0] == pytest.approx(0.0, abs=1e-12)
    assert values[-1] == pytest.approx(1.0, abs=1e-12)
    assert all(b >= a - 1e-12 for a, b in pairwise(values))


def test_bad_values_rejected():
    with pytest.raises(ValueError, match=r"alpha target must be in \[0, 1\], got 1.5"):
        AlphaController().retarget(1.5, 3)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        AlphaController().retarget(0.5, -1)


def test_state_dict_round_trip():
    ctrl = AlphaController()
    ctrl.retarget(0.7, 5, AlphaCurve.SIGMOID, 6.0)
    ctrl.step()
    other = AlphaController()
    other.load_state_dict(ctrl.state_dict())
    assert other.state_dict() == ctrl.state_dict()
    ctrl.step()
    other.step()
    assert other.alpha == ctrl.alpha
