"""The estimators on rows whose speed-ups, biases and token values are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esper_lightning.app.frontier.estimators import (
    PIECEWISE,
    POWER,
    CurveReadings,
    Pool,
    cross_envelope,
    curve_readings,
    estimates,
    final_size,
    frontier_rows,
    literature,
    long_rows,
    mean_curve,
    minimum_bias,
    row_curve,
    short_sizes,
    sizes_of,
    smooth,
    smooth_sizes,
    too_few_budgets,
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


def test_a_size_of_two_budgets_joins_a_fitted_envelope_as_measured():
    """A power law with an offset needs three budgets: a size measured at two (a plan's small
    size kept below the arms' budgets) enters the fitted envelopes as its chord, where it can
    hold the frontier; a frontier with no fitted size at all is still refused."""
    fitted = Curve.of((b * BASE, s2(b * BASE)) for b in (1, 2, 4, 8, 16))
    short = Curve.of([(1 * BASE, s2(BASE) - 0.05), (2 * BASE, s2(2 * BASE) - 0.05)])
    for kind in (POWER, "chord"):
        law, chord = smooth_sizes([fitted, short], kind)
        assert np.array_equal(law.loss, smooth(fitted, kind).loss) and chord is short
    assert smooth_sizes([fitted, short], PIECEWISE) == [fitted, short]
    front = frontier(smooth_sizes([fitted, short], POWER))
    assert front.at(1.5 * BASE) == pytest.approx(short.at(1.5 * BASE))  # the chord holds it
    assert front.at(4 * BASE) == pytest.approx(s2(4 * BASE), abs=NEAR)  # the law beyond it
    with pytest.raises(ValueError, match=r"needs at least 3 budgets, got 2"):
        smooth_sizes([short, short], POWER)
    # In a study: S1 (never the frontier) kept to two budgets changes no estimate.
    rows = [r for r in _study(shift=lambda e: 0.01 * (e - 1.5))
            if r["arm"] != "S1" or r["budget"] <= 2.0]
    assert short_sizes(rows) == ["S1"]
    for result in estimates(rows, "test_nats"):
        assert result.power.value == pytest.approx(1.5, abs=NEAR)
        assert result.episode_power.mean == pytest.approx(1.5, abs=NEAR)
    assert [m.frontier.value for m in literature([(32, rows)], "test_nats")] == pytest.approx(
        [1.5] * 3, abs=NEAR)


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


# --- the literature's readings, from curves ----------------------------------------------------
#: Points per curve; the arm's lead on its own runs, its long run's over S2's, and how much
#: compute S2's undecayed (stable) run needs for what its decayed runs reach (known readings).
POINTS, AHEAD, LONG_AHEAD, STABLE_BEHIND = 16, 2.0, 3.0, 1.25


def _tokens(arm: str, flops: float, budget_flops: float) -> float:
    """Tokens seen after ``flops`` of a run of ``budget_flops``: the arm's first half of its
    budget at S1's cost per token, the rest at S2's."""
    if arm.startswith("S"):
        return flops / COST[arm]
    half = 0.5 * budget_flops
    return min(flops, half) / COST["S1"] + max(flops - half, 0.0) / COST["S2"]


def _curve(arm: str, budget_flops: float, loss) -> tuple:
    """A curve of ``POINTS`` points at ``k / POINTS`` of the budget, ``loss(FLOPs)`` at each."""
    flops = [budget_flops * k / POINTS for k in range(1, POINTS + 1)]
    return tuple((f, _tokens(arm, f, budget_flops), loss(f)) for f in flops)


def _curved_study(shift=lambda e: 0.0, episodes=(0, 1, 2), long=("cosine", "cosine")
                  ) -> list[dict]:
    """`_study` with curves: the arm ``AHEAD`` times ahead of S2 at every point of its own
    runs (so it ends each run of C at s2(2C) and reaches S2's loss at C after C / 2); S2 before
    its decay (the first 80 %) as good as its decayed runs with 1/1.25 of the compute, then
    straight down to its end at s2(C); each one long run of 16x (on ``long``'s schedules, arm
    and S2; None: none), the arm's ``LONG_AHEAD`` times ahead of S2's at every point."""
    rows = _study(shift=shift, ahead=AHEAD, episodes=episodes, arm_budgets=(1.0, 2.0, 4.0, 8.0))
    for row in rows:
        end, c = row["budget_flops"], row["budget_flops"]
        e = row["episode"]
        if row["arm"] == "S2":
            row["curve"] = _curve("S2", c, lambda f, c=c, e=e: shift(e) + (
                s2(f / STABLE_BEHIND) if f <= 0.8 * c else
                s2(c) + (s2(0.8 * c / STABLE_BEHIND) - s2(c)) * (c - f) / (0.2 * c)))
        elif row["arm"] == ARM:
            row["curve"] = _curve(ARM, end, lambda f, e=e: s2(AHEAD * f) + shift(e))
    for e in episodes if long is not None else ():
        for arm, schedule, ahead in ((ARM, long[0], LONG_AHEAD), ("S2", long[1], 1.0)):
            curve = _curve(arm, 16 * BASE, lambda f, a=ahead, e=e: s2(a * f) + shift(e))
            rows.append({**_row(arm, e, 16.0, curve[-1][2]), "schedule": schedule,
                         "curve": curve})
    return rows


def test_the_literatures_readings_from_curves_have_their_closed_forms():
    """Every episode moved by its own constant (so every leave-one-out reads the same, and
    each interval is the value itself): on one long schedule the arm is 3x ahead of S2 (a
    bound, at least 16/8, where S2's long run ends before it gets there); against S2's stable
    phase 2 x 1.25 (a bound, at least 12/8, past S2's last stable point); to S2's loss 2x in
    compute and 1x in tokens (its first half costs half S2's per token); the frontier still
    says 2x."""
    rows = _curved_study(shift=lambda e: 0.01 * (e - 1))
    measured = {r.budget: r for r in literature([(8, rows)], "test_nats", [0.2])}
    for budget in (1.0, 2.0, 4.0):
        r = measured[budget]
        for estimate, value in ((r.long, LONG_AHEAD), (r.stable, AHEAD * STABLE_BEHIND),
                                (r.reach, AHEAD), (r.reach_tokens, 1.0), (r.frontier, AHEAD)):
            assert (estimate.value, estimate.low, estimate.high) == pytest.approx(
                (value,) * 3, abs=NEAR), budget
            assert estimate.censored is None and estimate.n == 3
    r = measured[8.0]
    assert (r.long.censored, r.long.value) == ("above", pytest.approx(16 / 8))
    assert (r.stable.censored, r.stable.value) == ("above", pytest.approx(12 / 8))
    assert math.isnan(r.long.low) and r.reach.value == pytest.approx(AHEAD, abs=NEAR)
    # The arm's curves moved apart by episode: the readings vary, and the interval says so.
    apart = [{**r, "curve": tuple((f, t, n + 0.003 * r["episode"] ** 2) for f, t, n in r["curve"])}
             if r["arm"] == ARM else r for r in rows]
    reach = curve_readings(apart, ARM, 2.0).reach
    assert reach.low < reach.value < reach.high and reach.value < AHEAD
    # The long runs are rows of their own: the frontier's readings are those of the rows
    # without them.
    plain = {r.budget: r for r in literature([(8, frontier_rows(rows))], "test_nats")}
    assert all(plain[b].final == measured[b].final and plain[b].long is None for b in plain)


def test_a_reading_without_its_curves_says_so():
    """No curves at all: every mid-run reading None (the report's "no curve"); long runs on
    two schedules are not one long schedule; an arm whose run never reaches its final size's
    loss is read as a bound (at most its budget over its run's end)."""
    bare = [{k: v for k, v in r.items() if k != "curve"} for r in _curved_study(long=None)]
    (r, *_) = literature([(8, bare)], "test_nats")
    assert (r.long, r.stable, r.reach, r.reach_tokens) == (None,) * 4
    mixed = _curved_study(long=("cosine", "linear"))
    readings = curve_readings(mixed, ARM, 2.0)
    assert readings.long is None and readings.stable is not None
    assert curve_readings([r for r in mixed if r["arm"] != ARM], ARM, 2.0) == CurveReadings()
    behind = [{**r, "curve": tuple((f, t, n + 1.0) for f, t, n in r["curve"])}
              if r["arm"] == ARM and not r.get("schedule") else r for r in mixed]
    reach = curve_readings(behind, ARM, 2.0).reach
    assert (reach.censored, reach.value) == ("below", pytest.approx(1.0))
    assert long_rows(mixed) and not long_rows(bare)


def test_a_mean_curve_reads_each_episode_at_the_first_ones_points():
    a = Curve.of([(1.0, 3.0), (2.0, 2.0), (4.0, 1.0)])
    b = Curve.of([(1.0, 5.0), (4.0, 1.0)])  # at 2: 3, linear in log C
    mean = mean_curve([a, b])
    assert mean.flops.tolist() == [1.0, 2.0, 4.0] and mean.loss.tolist() == [4.0, 2.5, 1.0]
    assert mean_curve([a, Curve.of([(2.0, 2.0), (4.0, 1.0)])]).flops.tolist() == [2.0, 4.0]
    row = {"curve": ((1.0, 10, 3.0), (2.0, 20, 2.0), (4.0, 40, 1.0))}
    assert row_curve(row, until=2.0).loss.tolist() == [3.0, 2.0] and row_curve({}) is None


def test_the_report_prints_the_literatures_table_and_figure(tmp_path):
    """`frontier report` of a study with curves: one table with every reading, the paragraph
    saying what each measures, and the figure, in the study's report alone (the docs take
    the table from `write_widths`)."""
    from esper_lightning.app.frontier.plan import parse_plan
    from esper_lightning.app.frontier.report import write_report

    plan = parse_plan({"name": "curved", "purpose": "final", "base_flops": BASE,
                       "budgets": [1, 2, 4, 8, 16], "warmup_flops": 1e10, "episodes": 3,
                       "rng_seed": 1, "curve_points": POINTS, "shape": {"width": 8, "n_head": 2},
                       "arms": [{"arm": a, "lr": 1e-3, "long_schedule": "cosine"}
                                for a in ("S1", "S2", ARM)]})
    docs = tmp_path / "results.md"
    docs.write_text("<!-- frontier:curved:begin -->\n<!-- frontier:curved:end -->\n")
    report = write_report(tmp_path, plan, _curved_study(), docs).read_text()
    section = report.split("## As the growth literature measures it")[1]
    assert "**long schedule**" in section and "**WSD stable phase**" in section
    assert ("| G1-2@0.5:identity | 8 | 2 | 3 | 2.00× [2.00, 2.00] | 2.00× [2.00, 2.00] | "
            "2.00× [2.00, 2.00] | 2.00× [2.00, 2.00] | 2.00× [2.00, 2.00] | 3.00× [3.00, 3.00] | "
            "2.50× [2.50, 2.50] | 2.00× [2.00, 2.00] | 1.00× [1.00, 1.00] |") in section
    assert "| G1-2@0.5:identity | 8 | 8 | 3 |" in section and "| ≥ 2.00× | ≥ 1.50× |" in section
    assert (tmp_path / "literature.png").read_bytes().startswith(b"\x89PNG")
    along = report.split("## The token value along the run")[1]  # every size at one rate
    for budget, points in ((1, 4), (2, 4), (4, 4), (8, 1)):  # after 0.5 of C, up to 0.8 of it
        assert along.count(f"| G1-2@0.5:identity | {budget} | 0.001 |") == points
    assert "Readings left out: 9 of a loss the stable phase never reaches" in along  # 8x
    assert (tmp_path / "along.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "images" / "frontier-curved-along.png").exists()  # not marked
    assert "literature" not in docs.read_text()
    assert not (tmp_path / "images" / "frontier-curved-literature.png").exists()


def test_a_wider_final_size_is_found_under_its_plans_own_name():
    """In a width-64 plan the fixed size S4 is the S4w64 a G1w32-4w64 arm ends as: found by
    its parameter count; an S4 of another width (other parameters) is not taken for it."""
    arm = "G1w32-4w64@0.1:identity"
    rows = [{"arm": "S4", "params": 218496}, {"arm": arm, "params": 218496}]
    assert final_size(rows, arm) == "S4"
    assert final_size([{"arm": "S4", "params": 54000}, {"arm": arm, "params": 218496}],
                      arm) == "S4w64"
    assert final_size([*rows, {"arm": "S4w64", "params": 218496}], arm) == "S4w64"
    assert final_size(rows, "G1-4@0.1:identity") == "S4"


def test_an_arm_of_two_budgets_has_every_reading_but_its_time_to_target():
    """Its own fitted curve needs three budgets (the time to the final size's loss reads it);
    the frontier, its final size and the token value need only the sizes' curves."""
    rows = _study()
    short = "G1-2@0.25:identity"
    rows += [_row(short, e, b, s2(1.2 * b * BASE)) for e in (0, 1, 2, 3) for b in (2.0, 4.0)]
    assert too_few_budgets(rows) == [short]
    measured = literature([(32, rows)], "test_nats")
    assert sorted((m.arm, m.budget) for m in measured) == sorted([
        (ARM, 2.0), (ARM, 4.0), (ARM, 8.0), (short, 2.0), (short, 4.0)])
    for m in measured:
        assert (m.target is None) == (m.arm == short)
        assert m.arm != short or m.final.value == pytest.approx(1.2, rel=1e-3)  # S2 at 1.2 C


def test_a_wider_size_in_a_narrow_study_is_a_size_of_its_frontier_and_figure(tmp_path):
    """A study of width 8 that also trains a width-16 size (``S2w16``, named with its width):
    the size joins the study's frontier, ordered after the plan's width, and the loss figure
    draws it (a size's name is not read as a bare depth)."""
    from esper_lightning.app.frontier.plots import loss_figure

    rows = _study(episodes=(0, 1))
    rows += [{**r, "arm": "S2w16", "test_nats": r["test_nats"] - 0.01}
             for r in rows if r["arm"] == "S2"]
    assert sizes_of(rows) == ["S1", "S2", "S2w16"]
    (result, *_) = estimates(rows, "test_nats")
    assert result.power.value < 1.5  # S2w16, below S2 everywhere, holds a lower envelope
    loss_figure(rows, "test_nats", tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_the_report_reads_an_arm_of_two_budgets_with_its_long_run(tmp_path):
    """A final's arm trained at two budgets, with its long run to the plan's largest (the
    long run is not a third budget of its own): the literature's table holds it, every
    reading but the time to target, which says why it has none."""
    from esper_lightning.app.frontier.plan import parse_plan
    from esper_lightning.app.frontier.report import write_report

    plan = parse_plan({"name": "curved", "purpose": "final", "base_flops": BASE,
                       "budgets": [1, 2, 4, 8, 16], "warmup_flops": 1e10, "episodes": 3,
                       "rng_seed": 1, "curve_points": POINTS, "shape": {"width": 8, "n_head": 2},
                       "arms": [{"arm": "S1", "lr": 1e-3},
                                {"arm": "S2", "lr": 1e-3, "long_schedule": "cosine"},
                                {"arm": ARM, "lr": 1e-3, "budgets": [1, 2],
                                 "long_schedule": "cosine"}]})
    rows = [r for r in _curved_study() if r["arm"] != ARM or r.get("schedule")
            or r["budget"] <= 2.0]
    section = write_report(tmp_path, plan, rows).read_text().split(
        "## As the growth literature measures it")[1]
    assert ("| G1-2@0.5:identity | 8 | 2 | 3 | 2.00× [2.00, 2.00] | 2.00× [2.00, 2.00] | "
            "2.00× [2.00, 2.00] | 2.00× [2.00, 2.00] | — | 3.00× [3.00, 3.00] | ") in section
    assert ("No time to the final size's loss (—) for an arm trained at fewer budgets than a "
            "power law of its own needs (3): G1-2@0.5:identity (2)") in section


def test_a_document_that_marks_a_literature_section_gets_the_table_and_figure(tmp_path):
    """`write_report` with ``docs`` that mark ``NAME-literature``: the report's literature
    table goes there too, its figure beside the others; without the marker it does not
    (`test_the_report_prints_the_literatures_table_and_figure`)."""
    from esper_lightning.app.frontier.plan import parse_plan
    from esper_lightning.app.frontier.report import write_report

    plan = parse_plan({"name": "curved", "purpose": "final", "base_flops": BASE,
                       "budgets": [1, 2, 4, 8, 16], "warmup_flops": 1e10, "episodes": 3,
                       "rng_seed": 1, "curve_points": POINTS, "shape": {"width": 8, "n_head": 2},
                       "arms": [{"arm": a, "lr": 1e-3, "long_schedule": "cosine"}
                                for a in ("S1", "S2", ARM)]})
    docs = tmp_path / "docs" / "results.md"
    docs.parent.mkdir()
    docs.write_text("<!-- frontier:curved:begin -->\n<!-- frontier:curved:end -->\ntext\n"
                    "<!-- frontier:curved-literature:begin -->\nold\n"
                    "<!-- frontier:curved-literature:end -->\n")
    report = write_report(tmp_path, plan, _curved_study(), docs).read_text()
    literature = docs.read_text().split("<!-- frontier:curved-literature:begin -->")[1]
    assert "old" not in literature and "**long schedule**" in literature
    assert literature.split("<!-- frontier:curved-literature:end -->")[0].strip() in report
    assert "text\n" in docs.read_text()
    images = tmp_path / "docs" / "images"
    assert (images / "frontier-curved-literature.png").read_bytes() == (
        tmp_path / "literature.png").read_bytes()
