"""The estimators on rows whose speed-ups, biases and token values are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esper_lightning.app.frontier.estimators import (
    PIECEWISE,
    Pool,
    cross_envelope,
    estimates,
    literature,
    minimum_bias,
)
from esper_lightning.app.frontier.fit import Curve, PowerLaw, frontier, speedup
from esper_lightning.app.frontier.report import speedups

BASE = 1e12
ARM = "G1-2@0.5:identity"
#: FLOPs per token of each size (S2 twice S1's: r = 2).
COST = {"S1": 1e6, "S2": 2e6}


def s2(flops: float) -> float:
    """The one size that holds the frontier: a power law in compute (nats)."""
    return 1.6 + 1.2 * (flops / BASE) ** -0.6


def _row(arm: str, episode: int, budget: float, loss: float, base: float = BASE) -> dict:
    flops = budget * base
    if arm.startswith("S"):
        tokens = flops / COST[arm]
    else:  # half the budget at S1's cost per token, half at S2's
        tokens = 0.5 * flops / COST["S1"] + 0.5 * flops / COST["S2"]
    return {"arm": arm, "episode": episode, "budget": budget, "budget_flops": flops,
            "spent_flops": flops, "tokens": tokens, "lr": 1e-3, "lr_phases": None,
            "wall_s": budget, "test_nats": loss}


def _study(shift=lambda e: 0.0, ahead: float = 1.5, episodes=(0, 1, 2, 3),
           law=s2, base: float = BASE, arm_budgets=(2.0, 4.0, 8.0)) -> list[dict]:
    """S1 a nat above ``law`` everywhere (never the frontier), S2 on ``law``, the arm ``ahead``
    times ahead of S2 in compute; every loss of episode e moved by ``shift(e)``."""
    rows = []
    for e in episodes:
        for budget in (1.0, 2.0, 4.0, 8.0, 16.0):
            rows.append(_row("S1", e, budget, law(budget * base) + 1.0 + shift(e), base))
            rows.append(_row("S2", e, budget, law(budget * base) + shift(e), base))
        rows += [_row(ARM, e, b, law(ahead * b * base) + shift(e), base) for b in arm_budgets]
    return rows


#: How near a power law read off its fine grid (`fit.GRID_PER_OCTAVE`) is to the law itself.
NEAR = 1e-4


def test_the_pooled_power_law_reads_a_speedup_the_rows_have_by_construction():
    """Every episode moved by its own constant: the fitted laws move with it, so every
    estimate with each episode left out is 1.5 too and the jackknife interval is 1.5 itself;
    chords through the law's points lie above it, so the piecewise reading is larger, by
    exactly the chord effect."""
    rows = _study(shift=lambda e: 0.01 * (e - 1.5))
    for result in estimates(rows, "test_nats"):
        power = result.power
        assert (power.value, power.low, power.high) == pytest.approx((1.5,) * 3, abs=NEAR)
        assert power.n == 4 and power.censored is None
        assert result.episode_power.mean == pytest.approx(1.5, abs=NEAR)
        chords = frontier([Curve.of((b * BASE, s2(b * BASE)) for b in (1, 2, 4, 8, 16))])
        loss = s2(1.5 * result.budget * BASE)
        chord = speedup(loss, result.budget * BASE, chords).value
        assert result.chord == pytest.approx(chord / 1.5 - 1.0, abs=NEAR)
        assert result.chord > 0.005 and result.piecewise.value == pytest.approx(chord)


def test_the_per_episode_piecewise_estimate_is_the_reports_own_table():
    rng = np.random.default_rng(7)
    noise = {(e, k): 0.02 * rng.standard_normal() for e in range(4) for k in range(40)}
    rows = _study()
    for k, row in enumerate(rows):
        row["test_nats"] += noise[(row["episode"], k % 40)]
    table = {(r.arm, r.budget): r.flops for r in speedups(rows, "test_nats")}
    for result in estimates(rows, "test_nats"):
        assert result.episode_piecewise == table[(result.arm, result.budget)]
        power = result.power
        assert power.low < power.value < power.high  # noise: an interval of some width


def test_the_per_episode_minimum_sits_below_the_envelope_of_the_means():
    """Two sizes with equal means at 2x and opposite luck in each episode: each episode's
    minimum is the lucky one, 0.01 nats below the envelope of the means; where one size is
    far better the minimum effect is 0."""
    means = {"S1": (3.0, 2.8, 2.7), "S2": (3.1, 2.8, 2.6)}
    luck = {0: 0.01, 1: -0.01}
    rows = [_row(size, e, b, m + (luck[e] if size == "S1" else -luck[e]))
            for size, losses in means.items() for e in luck
            for b, m in zip((1.0, 2.0, 4.0), losses, strict=True)]
    points = {p.budget: p for p in minimum_bias(rows, "test_nats")}
    assert points[2.0].envelope == pytest.approx(2.8)
    assert points[2.0].episodes - points[2.0].envelope == pytest.approx(-0.01)
    assert points[1.0].episodes - points[1.0].envelope == pytest.approx(0.0, abs=1e-12)
    assert (points[1.0].holder, points[4.0].holder) == ("S1", "S2")


def test_an_arm_of_fewer_episodes_is_pooled_over_its_own():
    """A tuning arm that played episode 0 alone: its estimate pools that episode (the sizes'
    means over it too), with no interval one episode cannot have."""
    rows = [r for r in _study(episodes=(0, 1)) if r["arm"] != ARM or r["episode"] == 0]
    for result in estimates(rows, "test_nats"):
        assert result.power.n == 1 and math.isnan(result.power.low)
        assert result.power.value == pytest.approx(1.5, abs=NEAR)


def test_across_widths_the_wider_sizes_join_the_envelope():
    """A second width whose S2 reaches with C what the first's needs 2C for, from 2 TFLOP
    up: the first width's arm, 1.5x ahead of its own frontier, is 0.75x of the envelope of
    both where the wider size is measured (at 4 and 8 TFLOP; at 2, where the wider size's
    first budget is already below the arm, 1x less the envelope's last grid step before it);
    its own frontier, its final size and its time to its final size's loss say 1.5x (the
    last a bound at 2x); its token value is 1 (all of its 1.5x token ceiling realised, r = 2;
    read per episode on chords, a little more)."""
    narrow = _study(shift=lambda e: 0.0, episodes=(0, 1))
    wide = [r for r in _study(law=lambda c: s2(2.0 * c), base=2 * BASE, episodes=(5, 6, 7))
            if r["arm"] != ARM]
    pool = Pool([narrow, wide], "test_nats", ["w8 ", "w16 "])
    holders = {p.flops / BASE: p.power_holder for p in cross_envelope(pool)}
    assert holders[1.0] == "w8 S2" and holders[4.0] == holders[16.0] == "w16 S2"
    measured = {r.budget: r for r in literature([(8, narrow), (16, wide)], "test_nats")}
    for budget, cross, near in ((2.0, 1.0, 0.01), (4.0, 0.75, NEAR), (8.0, 0.75, NEAR)):
        result = measured[budget]
        assert result.width == 8 and result.cross.value == pytest.approx(cross, abs=near)
        exact = (result.frontier, result.final) + ((result.target,) if budget > 2 else ())
        for estimate in exact:
            assert estimate.value == pytest.approx(1.5, abs=NEAR)
            assert (estimate.low, estimate.high) == pytest.approx((1.5, 1.5), abs=NEAR)
        assert (result.ratio, result.tau, result.ceiling) == pytest.approx((2.0, 0.5, 1.5))
        assert result.value.value == pytest.approx(1.0, abs=1e-3)
        assert result.today_value[0] == pytest.approx(1.0, abs=0.06)  # chords: above 1
    # At 2x the arm's smallest budget already reaches its final size's loss: at least 1x.
    assert (measured[2.0].target.censored, measured[2.0].target.value) == ("above", 1.0)
    with pytest.raises(ValueError, match=r"one study per width across widths, got widths "
                                         r"\[8, 8\]"):
        literature([(8, narrow), (8, wide)], "test_nats")


def test_a_bound_leaves_no_interval():
    """An arm worse than the frontier's smallest budget reaches: at most that budget over
    its own, and no interval around a bound."""
    rows = _study(ahead=0.25, arm_budgets=(2.0, 4.0, 8.0))
    result = {r.budget: r for r in estimates(rows, "test_nats")}[2.0]
    assert result.power.censored == "below" and result.power.value == pytest.approx(0.5)
    assert math.isnan(result.power.low) and math.isnan(result.chord)


def test_a_pool_reads_each_kind_of_curve():
    rows = _study(episodes=(0,))
    pool = Pool([rows], "test_nats")
    law = PowerLaw.fit(pool.curve(0, "S2", pool.everything))
    assert law.exponent == pytest.approx(0.6, abs=1e-6)
    assert pool.front(pool.everything, PIECEWISE).at(3 * BASE) > s2(3 * BASE)
    with pytest.raises(ValueError, match="a pool of 1 studies needs as many labels"):
        Pool([rows], "test_nats", ["a", "b"])
