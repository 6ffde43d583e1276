"""The frontier's mathematics on curves whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from esper_lightning.app.frontier.fit import (
    Curve,
    PowerLaw,
    Speedup,
    curves_by_episode,
    frontier,
    geometric_summary,
    jackknife_t,
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


def _law(offset: float, scale: float, exponent: float, budgets=BUDGETS) -> Curve:
    """Loss ``offset + scale * C^-exponent`` at ``budgets``: a power law, exactly."""
    return Curve.of((c, offset + scale * c ** -exponent) for c in budgets)


def test_a_power_law_is_recovered_from_its_points_and_read_between_them():
    law = PowerLaw.fit(_law(1.5, 0.8, 0.6))
    assert (law.offset, law.scale, law.exponent) == pytest.approx((1.5, 0.8, 0.6), abs=1e-6)
    assert (law.low, law.high) == (1.0, 16.0)
    curve = law.curve([3.0, 99.0])  # a measured budget inside is a knot; outside, none
    assert 3.0 in curve.flops and curve.flops[-1] == 16.0
    # Between budgets the law, not the chord: the chord of a convex curve lies above it.
    chord = _law(1.5, 0.8, 0.6).at(math.sqrt(8.0))
    assert curve.at(math.sqrt(8.0)) == pytest.approx(1.5 + 0.8 * 8.0 ** -0.3, abs=1e-5)
    assert chord > curve.at(math.sqrt(8.0)) + 1e-3


def test_a_noisy_curves_law_is_the_least_squares_one():
    """On points no law passes through: at the fitted exponent, the offset and scale are the
    linear least-squares ones (what a solver gives), and no nearby exponent fits better."""
    rng = np.random.default_rng(11)
    flops = np.array([1.0, 1.7, 3.0, 8.0, 20.0, 150.0]) * 1e12
    curve = Curve(flops, 1.4 + 0.9 * (flops / 1e12) ** -0.45 + rng.normal(0, 0.01, 6))
    law = PowerLaw.fit(curve)

    def residual(exponent: float) -> tuple[float, np.ndarray]:
        design = np.stack([np.ones(6), (flops / flops[0]) ** -exponent], axis=1)
        solution, *_ = np.linalg.lstsq(design, curve.loss, rcond=None)
        return float(((design @ solution - curve.loss) ** 2).sum()), solution

    best, (offset, scale) = residual(law.exponent)
    assert (law.offset, law.scale) == pytest.approx((offset, scale), rel=1e-9)
    assert all(residual(law.exponent * factor)[0] >= best for factor in (0.99, 1.01))
    assert float(((law.at(flops) - curve.loss) ** 2).sum()) == pytest.approx(best, rel=1e-9)


def test_a_power_law_needs_three_budgets_and_a_rising_curve_fits_flat():
    with pytest.raises(ValueError, match=r"at least 3 budgets, got 2 \(\[1.0, 2.0\]\)"):
        PowerLaw.fit(Curve.of([(1.0, 2.0), (2.0, 1.9)]))
    rising = PowerLaw.fit(Curve.of([(1.0, 2.0), (2.0, 2.1), (4.0, 2.3)]))
    assert rising.scale == 0.0 and rising.offset == pytest.approx(6.4 / 3)  # their mean


def test_the_jackknife_of_a_mean_is_its_t_interval():
    rng = np.random.default_rng(3)
    values = rng.normal(1.0, 0.2, size=7)
    left_out = [(values.sum() - v) / 6 for v in values]
    low, high, df = jackknife_t(values.mean(), [left_out])
    half = stats.t.ppf(0.975, 6) * values.std(ddof=1) / math.sqrt(7)
    assert (low, high, df) == pytest.approx((values.mean() - half, values.mean() + half, 6.0))


def test_the_jackknife_of_two_independent_groups_is_welchs_interval():
    """A difference of two groups' means: each group left out in turn, variances added,
    Welch-Satterthwaite's degrees of freedom — Welch's t interval exactly."""
    rng = np.random.default_rng(4)
    a, b = rng.normal(1.0, 0.1, size=8), rng.normal(0.5, 0.4, size=4)
    full = a.mean() - b.mean()
    left_out = [[(a.sum() - v) / 7 - b.mean() for v in a], [a.mean() - (b.sum() - v) / 3
                                                            for v in b]]
    low, high, df = jackknife_t(full, left_out)
    va, vb = a.var(ddof=1) / 8, b.var(ddof=1) / 4
    welch = (va + vb) ** 2 / (va ** 2 / 7 + vb ** 2 / 3)
    half = stats.t.ppf(0.975, welch) * math.sqrt(va + vb)
    assert (low, high, df) == pytest.approx((full - half, full + half, welch))
    assert all(math.isnan(x) for x in jackknife_t(1.0, [[1.0], [1.0, 2.0]]))  # one episode


def test_a_frontier_refuses_curves_that_leave_a_gap():
    with pytest.raises(ValueError, match=r"no curve is defined at .* leave a gap"):
        frontier([_line(2.0, 0.1, [1.0, 2.0]), _line(2.0, 0.1, [8.0, 16.0])])
