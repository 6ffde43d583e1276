"""The token value along a growing arm's run (`app/frontier/along.py`), on rows built by hand
whose value at every point is known."""

import math

import numpy as np
import pytest

from esper_lightning.app.frontier.along import along_runs
from esper_lightning.app.frontier.fit import Curve, mean_t
from esper_lightning.app.frontier.report import along_lines

PHI = 1000.0  # the final size's FLOPs per token; the born size costs a quarter of it
BUDGET = 1e9  # the base budget (FLOPs)
RATE = 4e-3


SIZE_BUDGETS = (1.0, 2.0, 4.0, 8.0)


def law(flops):
    """The final size's stable-phase loss: a falling power law."""
    return 1.5 + 40.0 * np.asarray(flops) ** -0.2


def size_points(budget: float) -> list[float]:
    return list(np.linspace(budget * BUDGET / 16, budget * BUDGET, 16))


def stable_phase() -> Curve:
    """What the module should read as the stable phase: the sizes' points before their
    decays, linear in log C between them."""
    flops = sorted({f for b in SIZE_BUDGETS for f in size_points(b) if f <= 0.8 * b * BUDGET})
    return Curve(np.array(flops), law(flops))


def size_rows(episode: int, rate: float = RATE, shift: float = 0.0) -> list[dict]:
    """S4 at 1, 2, 4 and 8× at one rate, branched: their points before each decay lie on the
    stable phase (``shift`` nats higher), their decays lower (which no reading may use)."""
    rows = []
    for budget in SIZE_BUDGETS:
        flops = budget * BUDGET
        points = [(f, f / PHI, float(law(f)) + shift - (0.3 if f > 0.8 * flops else 0.0))
                  for f in size_points(budget)]
        rows.append({"arm": "S4", "episode": episode, "budget": budget, "budget_flops": flops,
                     "spent_flops": flops, "tokens": flops / PHI, "lr": rate,
                     "lr_phases": None, "curve": points, "schedule": None})
    return rows


def arm_row(episode: int, value, tau: float = 0.25, budget: float = 2.0, rate=RATE,
            below: float = 0.0) -> dict:
    """``G1-4@tau`` at ``budget`` whose loss at each point after its growth is the stable
    phase's at the compute its early tokens are worth with token value ``value(c)``; before its
    growth and in its decay the loss is 9 (a reading there would show it)."""
    curve, flops = stable_phase(), budget * BUDGET
    grown, born_tokens = tau * flops, tau * flops / (PHI / 4)
    points = []
    for c in np.linspace(flops / 16, flops, 16):
        tokens = born_tokens + max(c - grown, 0.0) / PHI if c > grown else c / (PHI / 4)
        loss = 9.0
        if grown < c <= 0.8 * flops:
            loss = curve.at(c - grown + value(c) * born_tokens * PHI) - below
        points.append((c, tokens, loss))
    lr, phases = (rate, None) if isinstance(rate, float) else (rate[0], list(rate))
    return {"arm": f"G1-4@{tau}:identity", "episode": episode, "budget": budget,
            "budget_flops": flops, "spent_flops": flops, "tokens": points[-1][1], "lr": lr,
            "lr_phases": phases, "curve": points, "schedule": None}


def test_each_point_after_the_growth_and_before_the_decay_reads_its_token_value():
    def value(c):  # worth lost over the run: 0.9 just after the growth, 0.2 at the decay
        return 0.9 - 0.7 * (c / BUDGET - 0.5) / (1.6 - 0.5)

    along = along_runs([*size_rows(0), arm_row(0, value)])
    assert along.skipped == ()
    (run,) = along.runs
    assert (run.arm, run.budget, run.rate, run.bounds) == ("G1-4@0.25:identity", 2.0, RATE, 0)
    expected = [k / 16 for k in range(5, 13)]  # after 0.25 of the budget, up to its 0.8
    assert run.fractions == pytest.approx(expected)
    for fraction, (mean, low, high), n in zip(run.fractions, run.values, run.episodes,
                                              strict=True):
        assert mean == pytest.approx(value(fraction * 2 * BUDGET), abs=1e-9)
        assert (low, high, n) == (mean, mean, 1)  # one episode: no interval


def test_episodes_are_averaged_with_a_t_interval():
    rows = [*size_rows(0), *size_rows(1), *size_rows(2)]
    worth = {0: 0.2, 1: 0.5, 2: 0.6}
    rows += [arm_row(e, lambda c, v=v: v) for e, v in worth.items()]
    (run,) = along_runs(rows).runs
    for (mean, low, high), n in zip(run.values, run.episodes, strict=True):
        assert n == 3
        assert (mean, low, high) == pytest.approx(mean_t(list(worth.values())), abs=1e-9)


def test_a_phase_rate_is_read_at_its_last_phase_and_another_rate_not_at_all():
    rows = [*size_rows(0), *size_rows(0, rate=8e-3, shift=1.0)]
    rows += [arm_row(0, lambda c: 0.5, rate=(8e-3, RATE)), arm_row(0, lambda c: 0.5, rate=2e-3)]
    along = along_runs(rows)
    (run,) = along.runs
    assert run.rate == RATE  # the final size's run at 4e-3, not its 8e-3 one (1 nat higher)
    assert all(v[0] == pytest.approx(0.5, abs=1e-9) for v in run.values)
    assert along.skipped == ("G1-4@0.25:identity at 2× (lr 0.002): no S4 run at its peak rate "
                             "0.002",)


def test_a_loss_beyond_the_stable_phase_is_a_bound_not_a_reading():
    rows = [*size_rows(0), arm_row(0, lambda c: 0.5, below=1.0)]  # below anything S4 reaches
    (run,) = along_runs(rows).runs
    assert run.fractions == () and (run.beyond, run.before) == (8, 0)
    rows = [*size_rows(0), arm_row(0, lambda c: 0.5, below=-9.0)]  # above S4's first point
    (run,) = along_runs(rows).runs
    assert run.fractions == () and (run.beyond, run.before) == (0, 8)


def test_the_final_sizes_stable_phase_comes_from_every_row_the_arms_from_those_asked():
    """A report reads its arms at their chosen rates, but a final size's run at the arm's peak
    rate counts whatever rate was chosen for that size; an episode without a curve is left out
    alone."""
    arm = arm_row(0, lambda c: 0.5)
    other = arm_row(0, lambda c: 0.5, rate=8e-3)  # the same arm at a rate not asked for
    rows = [*size_rows(0), arm, other, {**arm_row(1, lambda c: 0.5), "curve": None}]
    (run,) = along_runs(rows, arms=[arm]).runs
    assert run.rate == RATE and set(run.episodes) == {1}  # episode 0 alone: 1 has no curve


def test_an_arm_without_curves_and_long_runs_are_not_read():
    rows = [*size_rows(0), {**arm_row(0, lambda c: 0.5), "curve": None},
            {**arm_row(0, lambda c: 0.5, budget=4.0), "schedule": "cosine"}]
    along = along_runs(rows)
    assert along.runs == ()
    assert along.skipped == ("G1-4@0.25:identity at 2× (lr 0.004): no curve",)


def test_the_formula_is_the_token_value_at_each_point():
    """Independent of the module: a worthless early phase reads 0, a lossless one 1."""
    rows = [*size_rows(0), arm_row(0, lambda c: 0.0, tau=0.125), arm_row(0, lambda c: 1.0)]
    runs = {r.arm: r for r in along_runs(rows).runs}
    assert [len(r.values) for r in runs.values()] == [10, 8]
    assert all(math.isclose(v[0], 0.0, abs_tol=1e-9) for v in runs["G1-4@0.125:identity"].values)
    assert all(math.isclose(v[0], 1.0, abs_tol=1e-9) for v in runs["G1-4@0.25:identity"].values)


def test_the_reports_lines_say_what_was_not_read():
    rows = [*size_rows(0), arm_row(0, lambda c: 0.5), arm_row(0, lambda c: 0.5, rate=2e-3)]
    lines = along_lines(along_runs(rows))
    assert sum(line.startswith("| G1-4@0.25:identity | 2 | 0.004 |") for line in lines) == 8
    assert lines[-1] == ("Not read: G1-4@0.25:identity at 2× (lr 0.002): no S4 run at its peak "
                         "rate 0.002.")
    assert along_lines(along_runs(rows[:-2] + rows[-1:])) == [
        "No token value along the run: G1-4@0.25:identity at 2× (lr 0.002): no S4 run at its "
        "peak rate 0.002."]
    uncurved = [*size_rows(0), {**arm_row(0, lambda c: 0.5), "curve": None}]
    assert along_lines(along_runs(uncurved)) == [
        "No token value along the run: no growing arm's row has a curve (a plan's "
        "`curve_points`)."]
