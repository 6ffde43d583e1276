"""The frontier's mathematics on curves whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esper_lightning.app.frontier.fit import (
    Curve,
    Speedup,
    curves_by_episode,
    frontier,
    geometric_summary,
    speedup,
    time_to_target,
)

BUDGETS = [1.0, 2.0, 4.0, 8.0, 16.0]


def _line(offset: float, slope: float, budgets=BUDGETS) -> Curve:
    """Loss ``offset - slope * log2(C)``: linear in log C, so interpolation is exact."""
    return Curve.of((c, offset - slope * math.log2(c)) for c in budgets)


def test_a_curve_interpolates_in_log_compute_and_says_nothing_outside():
    curve = _line(3.0, 0.1)
    assert curve.at(math.sqrt(2)) == pytest.approx(3.0 - 0.05)
    assert math.isnan(curve.at(0.5)) and math.isnan(curve.at(17.0))
    assert curve.flops_to_reach(3.0 - 0.15) == pytest.approx(2 ** 1.5)
    assert curve.flops_to_reach(5.0) == 1.0 and curve.flops_to_reach(1.0) is None
    with pytest.raises(ValueError, match="one point per budget"):
        Curve.of([(1.0, 2.0), (1.0, 3.0)])


def test_the_frontier_is_the_lower_envelope_with_its_crossing_where_it_is():
    small = _line(2.0, 0.05)  # better at small budgets
    big = _line(2.3, 0.15)   # crosses small where 2.0 - 0.05 x = 2.3 - 0.15 x: x = 3, C = 8
    front = frontier([small, big])
    for c in (1.0, 3.0, 8.0, 11.0, 16.0):
        assert front.at(c) == pytest.approx(min(small.at(c), big.at(c)), abs=1e-12)
    assert front.at(8.0) == pytest.approx(2.0 - 0.15)


def test_a_speedup_is_the_frontiers_compute_over_the_arms():
    front = frontier([_line(2.0, 0.05), _line(2.3, 0.15)])
    # An arm that reaches at C = 4 what the frontier reaches at C = 6: speed-up 1.5.
    loss = front.at(6.0)
    assert speedup(loss, 4.0, front).value == pytest.approx(1.5, rel=1e-9)
    assert speedup(loss, 4.0, front).censored is None
    assert speedup(0.5, 4.0, front) == Speedup(4.0, "above")  # beyond the measured budgets
    assert speedup(9.0, 4.0, front) == Speedup(0.25, "below")  # worse than the smallest


def test_time_to_target_reads_the_arms_own_curve():
    front = _line(2.0, 0.1)
    arm = _line(1.9, 0.1)  # one factor of two ahead everywhere
    assert time_to_target(arm, 8.0, front).value == pytest.approx(2.0)
    assert time_to_target(_line(3.0, 0.1), 8.0, front).censored == "below"


def test_the_geometric_mean_and_its_bootstrap_over_episodes():
    same = geometric_summary([Speedup(1.5)] * 6)
    assert (same.mean, same.low, same.high, same.n) == pytest.approx((1.5, 1.5, 1.5, 6))
    values = [Speedup(v) for v in (1.2, 1.6, 1.4, 1.8, 1.1, 1.5, 1.3, 1.7)]
    summary = geometric_summary(values, rng_seed=1)
    assert summary.mean == pytest.approx(math.exp(np.mean(np.log([v.value for v in values]))))
    assert summary.low < summary.mean < summary.high
    assert geometric_summary(values, rng_seed=1) == summary  # seeded: repeatable
    censored = geometric_summary([Speedup(2.0, "above"), Speedup(1.0)])
    assert (censored.above, censored.below) == (1, 0)


def test_curves_by_episode_read_rows():
    rows = [{"arm": "S1", "episode": e, "budget_flops": c, "test_nats": 2.0 - 0.1 * e - c / 100,
             "wall_s": c / 10} for e in (0, 1) for c in (1.0, 4.0)]
    rows.append({"arm": "S2", "episode": 0, "budget_flops": 1.0, "test_nats": None,
                 "wall_s": 1.0})
    curves = curves_by_episode(rows, "S1", "test_nats")
    assert sorted(curves) == [0, 1] and curves[1].at(4.0) == pytest.approx(1.86)
    assert curves_by_episode(rows, "S2", "test_nats") == {}
    assert curves_by_episode(rows, "S1", "test_nats", x="wall_s")[0].flops.tolist() == [0.1, 0.4]
