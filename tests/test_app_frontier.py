"""The frontier study: plans, branched cooldowns that equal separate runs, resumable studies."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from esper_lightning.app.frontier.plan import Plan, episode_rng_seed, parse_plan, read_plan
from esper_lightning.app.frontier.study import (
    PLAN_FILE,
    ROWS_FILE,
    read_rows,
    read_study,
    run_study,
)
from esper_lightning.app.frontier.train import load_corpus, train_unit
from esper_lightning.data.text import StepBatches
from esper_lightning.errors import ConfigError

TINY = {"width": 8, "n_head": 2, "block_size": 8, "batch_size": 4}


def _plan(**overrides) -> dict:
    plan = {"name": "tiny", "purpose": "tuning", "shape": TINY, "base_flops": 2e7,
            "budgets": [1, 2, 3], "warmup_flops": 2e6, "arms": [{"arm": "S2", "lr": 1e-2}],
            "episodes": 1, "rng_seed": 5}
    plan.update(overrides)
    return plan


@pytest.fixture
def corpus(text_file: Path):
    return load_corpus(text_file, parse_plan(_plan()).shape, ("validation", "test"))


def test_a_branched_cooldown_is_the_separate_run_of_its_budget(corpus):
    torch.manual_seed(0)
    plan = parse_plan(_plan(purpose="final"))
    (unit,) = plan.units()
    branched = train_unit(unit, plan, corpus)
    assert [r["budget"] for r in branched] == [1, 2, 3]
    for row in branched:
        alone = parse_plan(_plan(purpose="final", budgets=[row["budget"]]))
        (single,) = alone.units()
        (separate,) = train_unit(single, alone, corpus)
        for key in ("steps", "spent_flops", "validation_nats", "test_nats", "tokens"):
            assert separate[key] == row[key], (row["budget"], key)  # to the last bit
    # The budgets are really different runs: each ends fully decayed at its own budget.
    assert len({r["validation_nats"] for r in branched}) == 3
    assert all(r["budget_flops"] <= r["spent_flops"] < r["budget_flops"] + 1e7 for r in branched)


def test_a_curve_is_read_at_equal_flop_intervals_and_costs_no_training(corpus):
    """Each budget's curve: a point after the first step past each quarter of its budget,
    the last the run's end (on every validation block here, so it is the row's loss); a
    branched budget's curve is its separate run's to the last bit; the evaluations change
    nothing the run trains, and their FLOPs are the forwards of the points read."""
    from esper_lightning.app.frontier.train import build_host, curve_subset
    from esper_lightning.core.flops import FlopMeter

    curved = parse_plan(_plan(curve_points=4, curve_blocks=10_000))
    plain = parse_plan(_plan())
    (unit,) = curved.units()
    rows = train_unit(unit, curved, corpus)
    blocks = corpus.blocks["validation"]
    forward = FlopMeter().forward(build_host(curved.shape, 2, 1e-2, 0),
                                  curve_subset(blocks, 10_000)[0])
    for row, bare in zip(rows, train_unit(next(plain.units()), plain, corpus), strict=True):
        step = row["spent_flops"] / row["steps"]  # a fixed size: every step costs the same
        targets = [row["budget_flops"] * k / 4 for k in range(1, 5)]
        assert len(row["curve"]) == 4 and row["curve_flops"] == 4 * forward
        for target, (flops, tokens, _) in zip(targets, row["curve"], strict=True):
            assert target <= flops < target + step
            assert tokens == round(flops / step) * 4 * 8  # the steps' batches of 4 blocks of 8
        assert row["curve"][-1] == (row["spent_flops"], row["tokens"], row["validation_nats"])
        for key in ("steps", "spent_flops", "tokens", "validation_nats", "params"):
            assert row[key] == bare[key], key  # the evaluations trained nothing
        assert bare["curve"] is None and bare["curve_flops"] is None
        alone = parse_plan(_plan(budgets=[row["budget"]], curve_points=4, curve_blocks=10_000))
        (separate,) = train_unit(next(alone.units()), alone, corpus)
        assert separate["curve"] == row["curve"]
    # Before its decay (at 1.6e7) budget 1's points lie on the run the others share: at 1e7
    # budget 2 reads the same point, at 1.5e7 budget 3.
    assert rows[0]["curve"][1] == rows[1]["curve"][0]
    assert rows[0]["curve"][2] == rows[2]["curve"][0] and rows[0]["curve"][2][0] < 1.6e7
    assert len(curve_subset(blocks, 5)[0]) == 5 < len(blocks[0])


def test_a_final_studys_curve_reads_the_test_split_its_tables_read(corpus):
    """A final's curve is on test blocks (its last point on every block is the row's test loss,
    not its validation loss); a tuning study's on validation blocks."""
    final = parse_plan(_plan(purpose="final", curve_points=2, curve_blocks=10_000))
    assert (final.curve_split, parse_plan(_plan()).curve_split) == ("test", "validation")
    (row, *_) = train_unit(next(final.units()), final, corpus)
    assert row["curve"][-1][2] == row["test_nats"] != row["validation_nats"]


def test_a_curves_evaluations_are_kept_out_of_the_wall_clock(monkeypatch, corpus):
    """A clock that moves only while a curve point is evaluated: the run's wall time is 0."""
    from types import SimpleNamespace

    from esper_lightning.app.frontier import train

    clock = [0.0]
    evaluate = train.evaluate

    def slow(host, blocks):
        clock[0] += 1000.0
        return evaluate(host, blocks)

    monkeypatch.setattr(train, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(train, "evaluate", slow)
    plan = parse_plan(_plan(budgets=[1, 2], curve_points=3, arms=[
        {"arm": "S2", "lr": 1e-2}, {"arm": "G1-2@0.5:identity", "lr": 1e-2}]))
    rows = [r for u in plan.units() for r in train_unit(u, plan, corpus)]
    assert all(r["wall_s"] == 0.0 and len(r["curve"]) == 3 for r in rows)
    # S2: 4 on the shared run (one read for both budgets at 1.33e7), 1 in budget 1's branch;
    # 3 and 3 grown; the 4 rows' losses.
    assert clock[0] == 1000.0 * (5 + 3 + 3 + 4)


def test_a_long_schedule_is_one_run_of_the_largest_budget_read_mid_run(corpus):
    """An arm with a long schedule trains one run more: the plan's largest budget, warmed up
    and then decayed once (a half cosine, or linearly) to the floor, growing at tau of it;
    its row says its schedule, and its rate is the one of the arm's largest budget."""
    from esper_lightning.app.frontier.train import long_schedule_of

    plan = parse_plan(_plan(curve_points=4, min_lr_ratio=0.1, budgets=[1, 2], arms=[
        {"arm": "S2", "lr": {"1": 2e-2, "2": 1e-2}, "long_schedule": "cosine"},
        {"arm": "G1-2@0.5:identity", "lr": 1e-2, "budgets": [1], "long_schedule": "linear"}]))
    units = list(plan.units())
    assert [(u.arm.name, u.lr, u.budgets, u.schedule) for u in units] == [
        ("S2", 1e-2, (4e7,), None), ("S2", 2e-2, (2e7,), None), ("S2", 1e-2, (4e7,), "cosine"),
        ("G1-2@0.5:identity", 1e-2, (2e7,), None),
        ("G1-2@0.5:identity", 1e-2, (4e7,), "linear")]
    warm, end = plan.warmup_flops, plan.long_budget
    cosine, linear = (long_schedule_of(plan, kind, end) for kind in ("cosine", "linear"))
    middle = (warm + end) / 2
    assert [cosine.multiplier(f, end) for f in (warm / 2, warm, middle, end)] == pytest.approx(
        [0.5, 1.0, 0.55, 0.1])
    assert linear.multiplier(middle, end) == pytest.approx(0.55)
    assert linear.multiplier(warm + 0.25 * (end - warm), end) == pytest.approx(0.775)
    wsd, long = train_unit(units[0], plan, corpus)[0], train_unit(units[2], plan, corpus)[0]
    assert (long["schedule"], long["budget"], wsd["schedule"]) == ("cosine", 2.0, None)
    assert long["steps"] == wsd["steps"] and long["validation_nats"] != wsd["validation_nats"]
    # Read at the same points as the WSD run of that budget, where it trains at another rate.
    assert [p[:2] for p in long["curve"]] == [p[:2] for p in wsd["curve"]]
    assert long["curve"][1][2] != wsd["curve"][1][2]
    (grown,) = train_unit(units[4], plan, corpus)
    assert grown["final_depth"] == 2 and grown["schedule"] == "linear"
    tokens = [t / f for f, t, _ in grown["curve"]]  # more tokens per FLOP before the growth
    assert tokens[0] == pytest.approx(tokens[1]) and tokens[1] > tokens[3]


def test_tuning_evaluates_validation_only(corpus):
    plan = parse_plan(_plan(budgets=[1]))
    (row,) = train_unit(next(plan.units()), plan, corpus)
    assert row["test_nats"] is None and row["validation_nats"] > 0


def test_step_batches_are_a_function_of_rng_seed_and_step():
    tokens = torch.arange(1000, dtype=torch.uint8)
    batches = StepBatches(tokens, 8, 4, rng_seed=1)
    later = [batches(i)[0] for i in (40, 3, 41)]
    fresh = StepBatches(tokens, 8, 4, rng_seed=1)
    assert all(torch.equal(fresh(i)[0], x) for i, x in zip((40, 3, 41), later, strict=True))
    assert not torch.equal(StepBatches(tokens, 8, 4, rng_seed=2)(3)[0], later[1])
    # Within a pass no token is trained on twice: its blocks do not overlap.
    used = batches.starts(0)[:batches.per_pass * 4].sort().values
    assert bool((used.diff() >= 8).all()) and len(set((used % 8).tolist())) == 1
    assert torch.equal(batches(0)[0][:, 0], tokens[batches.starts(0)[:4]].long())


def test_units_pair_arms_by_episode_and_group_budgets_by_rate():
    plan = parse_plan(_plan(arms=[{"arm": "S1", "lr": [1e-3, 2e-3]},
                                  {"arm": "S2", "lr": {"1": 1e-3, "2": 1e-3, "3": 4e-3}}],
                            episodes=2))
    units = list(plan.units())
    assert [(u.arm.name, u.lr, u.episode, len(u.budgets)) for u in units] == [
        ("S1", 1e-3, 0, 3), ("S1", 2e-3, 0, 3), ("S2", 1e-3, 0, 2), ("S2", 4e-3, 0, 1),
        ("S1", 1e-3, 1, 3), ("S1", 2e-3, 1, 3), ("S2", 1e-3, 1, 2), ("S2", 4e-3, 1, 1)]
    assert {u.rng_seed for u in units if u.episode == 0} == {episode_rng_seed(5, 0)}


@pytest.mark.parametrize(("change", "message"), [
    ({"purpose": "final-ish"}, "unknown purpose 'final-ish'; accepted: tuning, final"),
    ({"budgets": [1, 1]}, "budgets lists a budget twice"),
    ({"arms": [{"arm": "S0", "lr": 1e-3}]}, "unknown arm 'S0'; accepted: S<k>"),
    ({"arms": [{"arm": "S2", "lr": {"1": 1e-3}}]}, "S2: no lr for budget 2"),
    ({"arms": [{"arm": "S2", "lr": {"7": 1e-3}}]}, "S2: lr for budget '7', which the arm"),
    ({"arms": [{"arm": "S2", "lr": -1}]}, "S2: lr must be a number > 0, got -1"),
    ({"warmup_flops": 2e7}, "warmup_flops=2e+07 outlasts the stable phase"),
    ({"shape": {**TINY, "n_head": 3}}, "shape.n_head=3 must divide shape.width=8"),
    ({"seed": 3}, "unknown plan key 'seed'"),
    ({"curve_points": 1}, "curve_points must be an int >= 2, got 1"),
    ({"curve_blocks": 8}, "curve_blocks is the size of a curve point's evaluation; accepted "
                          "with curve_points only"),
    ({"curve_points": 4, "arms": [{"arm": "S2", "lr": 1e-2, "long_schedule": "exp"}]},
     "S2: unknown long_schedule 'exp'; accepted: cosine, linear"),
    ({"arms": [{"arm": "S2", "lr": 1e-2, "long_schedule": "cosine"}]},
     "S2: long_schedule is read mid-run, on curves; accepted with the plan's curve_points"),
])
def test_a_bad_plan_is_refused_in_one_line(change, message):
    with pytest.raises(ConfigError) as err:
        parse_plan(_plan(**change))
    assert message in str(err.value) and "\n" not in str(err.value)


def _no_clock(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


def test_a_study_resumes_where_it_stopped_and_equals_one_run(tmp_path: Path, text_file: Path):
    folder = tmp_path / "study"
    folder.mkdir()
    plan = _plan(arms=[{"arm": "S1", "lr": 1e-2}, {"arm": "S2", "lr": 1e-2}], budgets=[1, 2])
    (folder / PLAN_FILE).write_text(json.dumps(plan))
    whole = run_study(folder, text_file, progress=False)
    assert len(whole) == 4 and read_rows(folder) == whole
    assert read_study(folder) == (read_plan(folder / PLAN_FILE), whole)
    lines = (folder / ROWS_FILE).read_text().splitlines()
    (folder / ROWS_FILE).write_text("\n".join(lines[:3]) + "\n")  # S2's unit was lost
    resumed = run_study(folder, text_file, progress=False)
    assert _no_clock(resumed) == _no_clock(whole)  # everything but the wall time
    assert isinstance(read_plan(folder / PLAN_FILE), Plan)
    other = tmp_path / "other.txt"
    other.write_text(text_file.read_text().upper())
    (folder / ROWS_FILE).write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(ConfigError, match="was trained on another text"):
        run_study(folder, other, progress=False)


# --- growing arms ---------------------------------------------------------------------------------
def test_a_growing_arm_grows_at_tau_of_each_budget_into_the_final_size(corpus):
    plan = parse_plan(_plan(arms=[{"arm": "G1-2@0.5:identity", "lr": 1e-2},
                                  {"arm": "S1", "lr": 1e-2}, {"arm": "S2", "lr": 1e-2}],
                            budgets=[1, 2]))
    rows = {(r["arm"], r["budget"]): r for u in plan.units() for r in train_unit(u, plan, corpus)}
    for budget in (1, 2):
        grown, small, big = (rows[(a, budget)] for a in ("G1-2@0.5:identity", "S1", "S2"))
        assert grown["final_depth"] == 2 and grown["params"] == big["params"]
        # Half the budget at one block's cost per step, half at two blocks': between the two.
        assert big["steps"] < grown["steps"] < small["steps"]
        assert grown["budget_flops"] <= grown["spent_flops"]


def test_width_arms_grow_wider_and_deeper_into_the_natively_built_final_size(corpus):
    # The plan's width is 8 (two heads of 4): S2w16 is born two blocks of four heads.
    plan = parse_plan(_plan(arms=[{"arm": "G1w8-2w16@0.5:identity", "lr": 1e-2},
                                  {"arm": "G2-2w16@0.5:identity", "lr": 1e-2},
                                  {"arm": "S2w16", "lr": 1e-2}, {"arm": "S2", "lr": 1e-2}],
                            budgets=[1]))
    rows = {r["arm"]: r for u in plan.units() for r in train_unit(u, plan, corpus)}
    both, wider, big, small = (rows[a] for a in ("G1w8-2w16@0.5:identity",
                                                 "G2-2w16@0.5:identity", "S2w16", "S2"))
    assert big["params"] > small["params"]
    assert both["params"] == wider["params"] == big["params"]  # the wide model, built natively
    assert both["final_depth"] == wider["final_depth"] == 2
    # Cheaper steps before the growth: more steps than the wide model for the same FLOPs.
    assert big["steps"] < wider["steps"] < small["steps"] and big["steps"] < both["steps"]
    assert all(r["budget_flops"] <= r["spent_flops"] for r in rows.values())
    assert all(math.isfinite(r["validation_nats"]) for r in rows.values())


def test_reset_drops_the_widened_moments_and_trains_otherwise(corpus):
    plan = parse_plan(_plan(arms=[{"arm": "G1w8-1w16@0.5:identity", "lr": 1e-2},
                                  {"arm": "G1w8-1w16@0.5:identity+reset", "lr": 1e-2}],
                            budgets=[1]))
    carried, reset = (r for u in plan.units() for r in train_unit(u, plan, corpus))
    assert carried["params"] == reset["params"] and carried["steps"] == reset["steps"]
    assert carried["validation_nats"] != reset["validation_nats"]  # the moments mattered


@pytest.mark.parametrize("name", ["G1-2w16@0.5:identity+clone",
                                  "G1w8-2w8-4w16@0.2,0.5:identity+reset"])
def test_an_arm_that_widens_takes_the_widening_options(name):
    (arm,) = parse_plan(_plan(arms=[{"arm": name, "lr": 1e-3}])).arms
    assert arm.spec.width_factors(8)[-1] == 2


def test_clone_copies_the_old_heads_and_units_and_trains_otherwise(corpus):
    plan = parse_plan(_plan(arms=[{"arm": "G1w8-1w16@0.5:identity", "lr": 1e-2},
                                  {"arm": "G1w8-1w16@0.5:identity+clone", "lr": 1e-2}],
                            budgets=[1]))
    drawn, cloned = (r for u in plan.units() for r in train_unit(u, plan, corpus))
    assert drawn["params"] == cloned["params"] and drawn["steps"] == cloned["steps"]
    assert math.isfinite(cloned["validation_nats"])
    assert drawn["validation_nats"] != cloned["validation_nats"]  # the new units differed


def test_steady_phase_rates_change_the_peak_without_a_rewarm(corpus):
    plan = parse_plan(_plan(arms=[{"arm": "G1-2@0.5:identity", "lr_phases": [[1e-2, 5e-3]]},
                                  {"arm": "G1-2@0.5:identity+steady",
                                   "lr_phases": [[1e-2, 5e-3]]}], budgets=[1]))
    rewarmed, steady = (r for u in plan.units() for r in train_unit(u, plan, corpus))
    assert rewarmed["steps"] == steady["steps"] and rewarmed["lr_phases"] == (1e-2, 5e-3)
    assert rewarmed["validation_nats"] != steady["validation_nats"]
    with pytest.raises(ConfigError, match=r"\+rewarm re-warms after a growth and \+steady"):
        parse_plan(_plan(arms=[{"arm": "G1-2@0.5:identity+rewarm+steady", "lr": 1e-2}]))


def test_a_widening_keeps_the_function_and_the_phases_step_on():
    # At the growth the logits stay (width growth is function-preserving), so the loss curve
    # has no jump: the unit's own growth stream decides the split, nothing else.
    from esper_lightning.app.frontier.train import build_host
    from esper_lightning.core.width import WidthGrowth, widen

    shape = parse_plan(_plan()).shape
    host = build_host(shape, 1, 1e-2, rng_seed=3)
    tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = host(tokens)
    widen(host, WidthGrowth(2, stack="blocks", rng_seed=1), host.configure_optimizers())
    assert host.config.n_embd == 16 and host.config.n_head == 4
    with torch.no_grad():
        torch.testing.assert_close(host(tokens), before, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("name", "message"), [
    ("G4-1@0.5:copy", "depths must not decrease"),
    ("G2-2@0.5:copy", "each growth must add blocks or width, got 2-2"),
    ("G1w8-2w12@0.5:identity", "width 12 is not a multiple of the width 8 before it"),
    ("S2w6", "width 6 is not a whole number of heads of width 4"),
    ("G1-2-4@0.5:copy", "2 growth(s) need as many taus, got 1"),
    ("G1-2@1.5:copy", "taus must be in (0, 1)"),
    ("G1-2@0.5:copy+fast", "unknown option 'fast'; accepted: moments, rewarm"),
    ("G1-4@0.1:identity+clone", "+clone says how a widening goes and this arm never widens "
                                "(plan width 8)"),
    ("G1w16-2w16@0.5:identity+reset", "+reset says how a widening goes and this arm never"),
    ("G1-2w8@0.5:identity+clone", "+clone says how a widening goes"),  # the plan's width is 8
    ("G1-2@x:copy", "unknown arm 'G1-2@x:copy'"),
])
def test_a_bad_growing_arm_is_refused_in_one_line(name, message):
    with pytest.raises(ConfigError) as err:
        parse_plan(_plan(arms=[{"arm": name, "lr": 1e-3}]))
    assert message in str(err.value)


def test_an_unknown_operator_is_refused_before_anything_trains(tmp_path, text_file):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / PLAN_FILE).write_text(json.dumps(_plan(arms=[{"arm": "G1-2@0.5:zero",
                                                            "lr": 1e-3}])))
    with pytest.raises(ConfigError, match="unknown growth operator 'zero'; accepted: copy"):
        run_study(folder, text_file, progress=False)
    assert not (folder / ROWS_FILE).exists()


# --- select and report ----------------------------------------------------------------------------
def _rows(arms: dict[str, float], lrs=(1e-3, 2e-3), episodes=(0, 1, 2)) -> list[dict]:
    """Synthetic rows: each fixed size ``S<k>`` a line in log C, S2 below S1 at every budget;
    growing arms a fixed factor of compute ahead of S2; the rate 2e-3 better than 1e-3 by
    0.01 on validation."""
    rows = []
    for arm, ahead in arms.items():
        for e in episodes:
            for budget in (1.0, 2.0, 4.0, 8.0):
                for lr in lrs if arm.startswith("S") else lrs[-1:]:
                    size = int(arm[1]) if arm.startswith("S") else 2
                    c = budget * (ahead if not arm.startswith("S") else 1.0)
                    loss = 3.6 - 0.6 * size - 0.1 * size * math.log2(c) + 0.001 * e
                    rows.append({"arm": arm, "episode": e, "rng_seed": e, "lr": lr,
                                 "budget": budget, "budget_flops": budget * 1e12,
                                 "spent_flops": budget * 1e12, "steps": 1, "params": 1,
                                 "final_depth": size, "tokens": 1, "data_passes": 1.0,
                                 "wall_s": budget, "validation_nats": loss + (
                                     0.01 if lr == 1e-3 else 0.0),
                                 "test_nats": loss, "text_sha256": "x"})
    return rows


def test_select_picks_each_budgets_best_rate_and_flags_the_grid_edge():
    from esper_lightning.app.frontier.report import select_lrs

    chosen = select_lrs(_rows({"S1": 1.0}), "S1")
    assert chosen == {b: (2e-3, True) for b in (1.0, 2.0, 4.0, 8.0)}


def test_the_report_reads_a_speedup_a_growing_arm_has_by_construction(tmp_path):
    from esper_lightning.app.frontier.report import speedups, write_report

    rows = _rows({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5}, lrs=(2e-3,))
    results = {r.budget: r for r in speedups(rows, "test_nats")}
    # S2 is the frontier at every budget here; the arm is 1.5x of compute ahead of it.
    for budget in (1.0, 2.0, 4.0):
        assert results[budget].flops.mean == pytest.approx(1.5, rel=1e-6), budget
    for budget in (2.0, 4.0, 8.0):  # the arm's own curve reaches S2's loss at 2/3 its budget
        assert results[budget].target.mean == pytest.approx(1.5, rel=1e-6), budget
    assert results[1.0].target.above == 3  # before its smallest budget: a bound
    assert results[8.0].flops.above == 3  # beyond the frontier's largest budget: a bound
    plan = parse_plan(_plan(purpose="final", budgets=[1, 2, 4, 8], base_flops=1e12,
                            warmup_flops=1e10))
    docs = tmp_path / "evidence.md"
    docs.write_text("before\n<!-- frontier:tiny:begin -->\nold\n<!-- frontier:tiny:end -->\n"
                    "after\n")
    report = write_report(tmp_path, plan, rows, docs)
    text = docs.read_text()
    assert text.startswith("before\n<!-- frontier:tiny:begin -->\nStudy `tiny` (final)")
    assert "old" not in text and text.endswith("<!-- frontier:tiny:end -->\nafter\n")
    assert "| G1-2@0.5:identity | 2 | 3 | 1.50× [1.50, 1.50]" in report.read_text()
    # The estimators' table: every estimator near 1.5 on these lines in log C (piecewise
    # exactly; a power law fitted to a line, nearly), and no chord effect on straight lines.
    estimators = report.read_text().split("Speed-up by estimator")[1]
    row = next(line for line in estimators.splitlines() if line.startswith(
        "| G1-2@0.5:identity | 2 | 3 |"))
    cells = row.split(" | ")[3:]
    assert all(cell.startswith("1.50×") for cell in cells[:4]) and cells[4] == "+0.0% |"
    assert "| 2 | 2 | 3.1754 | S2 | 3.1754 | +0.0000 |" in report.read_text()  # one size leads
    assert (tmp_path / "loss_vs_flops.png").stat().st_size > 0
    assert (tmp_path / "speedup.png").stat().st_size > 0
    # The document's copies, where a docs site finds them.
    for figure in ("loss_vs_flops.png", "speedup.png"):
        copy = tmp_path / "images" / f"frontier-tiny-{figure}"
        assert copy.read_bytes() == (tmp_path / figure).read_bytes()


def test_a_study_too_short_for_a_power_law_says_so_in_its_report():
    from esper_lightning.app.frontier.report import report_lines

    rows = [r for r in _rows({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5}, lrs=(2e-3,))
            if r["budget"] in (1.0, 2.0)]
    plan = parse_plan(_plan(purpose="final", budgets=[1, 2], base_flops=1e12, warmup_flops=1e10))
    assert ("No speed-up by estimator: a power law with an offset needs at least 3 budgets, "
            "got 2 ([1000000000000.0, 2000000000000.0]).") in report_lines(plan, rows)


def test_a_size_too_short_for_a_power_law_is_named_under_the_estimators_table():
    from esper_lightning.app.frontier.report import report_lines

    rows = [r for r in _rows({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5}, lrs=(2e-3,))
            if r["arm"] != "S1" or r["budget"] in (1.0, 2.0)]
    plan = parse_plan(_plan(purpose="final", budgets=[1, 2, 4, 8], base_flops=1e12,
                            warmup_flops=1e10))
    lines = report_lines(plan, rows)
    estimators = lines[lines.index(next(x for x in lines if x.startswith("Speed-up by "
                                                                           "estimator"))):]
    assert next(x for x in estimators if x.startswith("| G1-2@0.5:identity | 2 | 3 |")
                ).split(" | ")[3].startswith("1.50×")  # S2, fitted, holds the frontier
    assert estimators[-1].startswith("Fewer budgets than a power law with an offset needs (3): "
                                     "S1 (2 budgets), in the fitted envelopes as measured")


def test_one_episode_is_reported_without_intervals_it_cannot_have():
    """A one-episode tuning study has no spread: its cells are the values alone, not
    ``[x, x]`` brackets or a ``[nan, nan]`` t interval."""
    from esper_lightning.app.frontier.report import report_lines

    rows = _rows({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5}, lrs=(2e-3,), episodes=(0,))
    plan = parse_plan(_plan(purpose="final", budgets=[1, 2, 4, 8], base_flops=1e12,
                            warmup_flops=1e10))
    text = "\n".join(report_lines(plan, rows))
    assert "1 episode (root" in text
    assert "nan" not in text and "[1.50, 1.50]" not in text
    assert "| G1-2@0.5:identity | 2 | 1 | 1.50× | — | 1.50× | 1.50× | — |" in text


def test_the_token_table_splits_a_speedup_into_its_ceiling_and_the_tokens_worth():
    """S1 costs half of S2 per token: an arm one half of its budget at S1 sees 1.5x the tokens
    S2 would (its ceiling), and 1.5x ahead of S2 it realises all of it (token value 1); the
    arm growing at 0.6, as good as S2 on its last 0.4 of the compute alone, gained nothing from
    its early tokens (value 0)."""
    from esper_lightning.app.frontier.report import token_results, token_table

    cost = {"S1": 0.5e6, "S2": 1e6}
    rows = _rows({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5, "G1-2@0.6:identity": 0.4},
                 lrs=(2e-3,))
    for row in rows:
        tau = {"G1-2@0.5:identity": 0.5, "G1-2@0.6:identity": 0.6}.get(row["arm"])
        flops = row["spent_flops"]
        row["tokens"] = (flops / cost[row["arm"]] if tau is None
                         else tau * flops / cost["S1"] + (1 - tau) * flops / cost["S2"])
    results = {(r.arm, r.budget): r for r in token_results(rows, "test_nats")}
    lossless = results[("G1-2@0.5:identity", 2.0)]
    assert lossless.ceiling == pytest.approx(1.5) and lossless.final.mean == pytest.approx(1.5)
    assert lossless.value == pytest.approx((1.0, 1.0, 1.0))
    worthless = results[("G1-2@0.6:identity", 4.0)]
    assert worthless.ceiling == pytest.approx(1.6)  # 1 + 0.6 * (2 - 1)
    assert worthless.value[0] == pytest.approx(0.0, abs=1e-9)
    assert results[("G1-2@0.6:identity", 1.0)].bounded == 3  # below S2's smallest budget
    assert "| G1-2@0.5:identity | 2 | 3 | 1.50× [1.50, 1.50] | 1.50× | 1.00 [1.00, 1.00] | — |" \
        in token_table(list(results.values()))


def test_widths_puts_the_same_arm_of_two_widths_side_by_side(tmp_path, capsys):
    """Two final studies at widths 8 and 16 (the second of two joined folders): one table row
    per arm, width and budget, each width read against its own frontier; the figure drawn
    beside the document; a study that does not exist is one line."""
    from esper_lightning.app.frontier.command import main
    from esper_lightning.app.frontier.study import _append

    final = dict(purpose="final", budgets=[1, 2, 4, 8], base_flops=1e12, warmup_flops=1e10)
    wide = {**TINY, "width": 16}
    studies = {"narrow": ({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5}, _plan(
                   name="narrow", **final)),
               "wide-sizes": ({"S1": 1.0, "S2": 1.0}, _plan(name="wide-sizes", shape=wide,
                                                             **final)),
               "wide-growth": ({"G1-2@0.5:identity": 2.0}, _plan(name="wide-growth",
                                                                  shape=wide, **final))}
    for name, (arms, plan) in studies.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / PLAN_FILE).write_text(json.dumps(plan))
        _append(tmp_path / name / ROWS_FILE, _rows(arms, lrs=(2e-3,)))
    docs = tmp_path / "docs" / "results.md"
    docs.parent.mkdir()
    docs.write_text("".join(f"<!-- frontier:{name}:begin -->\n<!-- frontier:{name}:end -->\n"
                            for name in ("by-width", "cross-width", "literature")))
    groups = [str(tmp_path / "narrow"), f"{tmp_path / 'wide-growth'}+{tmp_path / 'wide-sizes'}"]
    assert main(["widths", *groups, "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert "| G1-2@0.5:identity | 8 | 2 | 3 | 1.50× [1.50, 1.50]" in text
    assert "| G1-2@0.5:identity | 16 | 2 | 3 | 2.00× [2.00, 2.00]" in text
    assert "| G1-2@0.5:identity | 16 | 8 | 3 | ≥ 1.00×" in text  # beyond the frontier: a bound
    for figure in ("frontier-by-width.png", "frontier-literature.png"):
        assert (docs.parent / "images" / figure).read_bytes().startswith(b"\x89PNG")
    # Both widths' sizes in one envelope (the same sizes here: the widths tie, the first holds).
    assert "| TFLOP | w8 S1 | w8 S2 | w16 S1 | w16 S2 | envelope (piecewise) |" in text
    assert "| 1 | 4.3295 | 3.4639 | 4.3295 | 3.4639 | 3.4639 | w8 S2 |" in text
    assert "Width 8: no tuning study given (`--tuning`)" in text
    # The literature's table: the final size (S2) is the frontier here, so they agree.
    section = text.split("<!-- frontier:literature:begin -->")[1]
    row = next(line for line in section.splitlines()
               if line.startswith("| G1-2@0.5:identity | 8 | 2 | 3 |"))
    frontier, today, every, final = row.split(" | ")[4:8]
    assert today == "1.50× [1.50, 1.50]"  # per episode on these lines in log C: exact
    assert all(cell.startswith("1.50× [1.") for cell in (frontier, every, final))
    capsys.readouterr()
    assert main(["widths", str(tmp_path / "nowhere")]) == 2
    assert "plan '" in capsys.readouterr().err
    assert main(["widths", str(tmp_path / "narrow"), "--tuning", str(tmp_path / "narrow")]) == 2
    assert "--tuning " in capsys.readouterr().err  # a final study is no tuning grid


def test_widths_read_each_rate_against_its_tuning_grid(tmp_path):
    """A rate the tuning chose at the end of its grid is marked; a final rate that is not the
    tuning's choice says which the tuning chose; studies of two splits do not mix."""
    from esper_lightning.app.frontier.report import write_widths

    final = parse_plan(_plan(purpose="final", budgets=[1, 2, 4, 8], base_flops=1e12,
                             warmup_flops=1e10))
    rows = _rows({"S1": 1.0, "S2": 1.0, "G1-2@0.5:identity": 1.5}, lrs=(2e-3,))
    rows = [{**r, "lr": 1e-3} if r["arm"] == "S1" and r["budget"] == 8.0 else r for r in rows]
    tuning = parse_plan(_plan(budgets=[1, 2, 4, 8], base_flops=1e12, warmup_flops=1e10))
    grid = _rows({"S1": 1.0, "S2": 1.0}, lrs=(1e-3, 2e-3))
    lines = write_widths([(final, rows)], tmp_path / "by-width.png", tuning=[(tuning, grid)])
    assert "| 8 | S1 | 0.002 ✱ | 0.002 ✱ | 0.002 ✱ | 0.001 (tuned 0.002 ✱) |" in lines
    assert "| 8 | G1-2@0.5:identity | 0.002 | 0.002 | 0.002 | 0.002 |" in lines  # not tuned
    assert (tmp_path / "frontier-literature.png").stat().st_size > 0
    mixed = write_widths([(final, rows), (tuning, grid)], tmp_path / "by-width.png")
    assert ("No cross width table: the studies read different splits (test and validation); "
            "their losses do not mix.") in mixed


def test_the_commands_refuse_in_one_line(tmp_path, capsys):
    from esper_lightning.app.frontier.command import main

    folder = tmp_path / "study"
    folder.mkdir()
    (folder / PLAN_FILE).write_text(json.dumps(_plan()))
    assert main(["select", str(folder)]) == 2
    assert capsys.readouterr().err == (f"esper-lightning frontier: error: '{folder}' has no rows "
                                       "yet; run it first\n")
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "plan '" in capsys.readouterr().err
    assert main(["walk"]) == 2


def test_the_report_joins_a_study_of_the_same_episodes_and_refuses_another(tmp_path, capsys):
    """Arms registered at different times (each before its own first episode) make one table;
    a study of other episodes, or an arm in both, is refused in one line."""
    from esper_lightning.app.frontier.command import main
    from esper_lightning.app.frontier.study import _append

    final = dict(purpose="final", budgets=[1, 2, 4, 8], base_flops=1e12, warmup_flops=1e10)
    studies = {"sizes": ({"S1": 1.0, "S2": 1.0}, _plan(name="sizes", **final)),
               "growth": ({"G1-2@0.5:identity": 1.5}, _plan(name="growth", **final)),
               "other": ({"G1-2@0.25:identity": 1.5}, _plan(name="other", **{
                   **final, "rng_seed": 6})),
               "again": ({"S2": 1.0}, _plan(name="again", **final))}
    for name, (arms, plan) in studies.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / PLAN_FILE).write_text(json.dumps(plan))
        _append(tmp_path / name / ROWS_FILE, _rows(arms, lrs=(2e-3,)))
    assert main(["report", str(tmp_path / "growth"), "--with", str(tmp_path / "sizes")]) == 0
    report = (tmp_path / "growth" / "report.md").read_text()
    assert "Study `growth` with `sizes` (final)" in report
    assert "| G1-2@0.5:identity | 2 | 3 | 1.50× [1.50, 1.50]" in report
    capsys.readouterr()
    assert main(["report", str(tmp_path / "other"), "--with", str(tmp_path / "sizes")]) == 2
    assert capsys.readouterr().err == (
        f"esper-lightning frontier: error: --with {tmp_path / 'sizes'}: its rng_seed is 5, "
        "this study's 6; only studies of the same episodes join\n")
    assert main(["report", str(tmp_path / "sizes"), "--with", str(tmp_path / "again")]) == 2
    assert "arm 'S2' at lr 0.002 and budget 1 is in both studies" in capsys.readouterr().err
    # The same arm at other rates joins (a later study trying new rates of it).
    (tmp_path / "rates").mkdir()
    (tmp_path / "rates" / PLAN_FILE).write_text(json.dumps(_plan(name="rates", **final)))
    _append(tmp_path / "rates" / ROWS_FILE,
            [{**row, "lr_phases": (1e-3, 2e-3)} for row in _rows({"G1-2@0.5:identity": 1.5},
                                                                  lrs=(2e-3,))])
    assert main(["report", str(tmp_path / "growth"), "--with", str(tmp_path / "sizes"),
                 "--with", str(tmp_path / "rates")]) == 0
    other_text = [{**row, "text_sha256": "y"} for row in _rows({"G1-2@0.25:identity": 1.5},
                                                               lrs=(2e-3,))]
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / PLAN_FILE).write_text(json.dumps(_plan(name="text", **final)))
    _append(tmp_path / "text" / ROWS_FILE, other_text)
    assert main(["report", str(tmp_path / "text"), "--with", str(tmp_path / "sizes")]) == 2
    assert "trained on another text" in capsys.readouterr().err


def test_a_device_this_machine_lacks_is_refused_before_anything_trains(tmp_path, text_file,
                                                                       capsys):
    from esper_lightning.app.frontier.command import main

    folder = tmp_path / "study"
    folder.mkdir()
    (folder / PLAN_FILE).write_text(json.dumps(_plan()))
    assert main(["run", str(folder), "--text", str(text_file), "--device", "tpu"]) == 2
    assert capsys.readouterr().err == ("esper-lightning frontier: error: device 'tpu' is not "
                                       "accepted; accepted: cpu, cuda, cuda:N\n")
    assert main(["run", str(folder), "--text", str(text_file), "--device", "cuda:x"]) == 2
    assert "device 'cuda:x' is not accepted" in capsys.readouterr().err
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU (cuda:0 on a CPU)
    assert main(["run", str(folder), "--text", str(text_file), "--device", missing]) == 2
    assert f"device '{missing}' " in capsys.readouterr().err
    assert not (folder / ROWS_FILE).exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_study_on_cuda_trains_the_cpus_runs(tmp_path: Path, text_file: Path):
    """The same steps and FLOPs on either device; the losses agree to float32 kernel noise."""
    plan = _plan(arms=[{"arm": "S2", "lr": 1e-2}, {"arm": "G1-2@0.5:identity", "lr": 1e-2}],
                 budgets=[1, 2], curve_points=3)
    rows = {}
    for device in ("cpu", "cuda"):
        folder = tmp_path / device
        folder.mkdir()
        (folder / PLAN_FILE).write_text(json.dumps(plan))
        rows[device] = run_study(folder, text_file, workers=2, progress=False, device=device)
    cpu = {(r["arm"], r["budget"]): r for r in rows["cpu"]}
    assert len(rows["cuda"]) == len(cpu) == 4
    for row in rows["cuda"]:
        twin = cpu[(row["arm"], row["budget"])]
        for key in ("steps", "spent_flops", "params", "final_depth", "tokens", "curve_flops"):
            assert row[key] == twin[key], (row["arm"], key)
        assert row["validation_nats"] == pytest.approx(twin["validation_nats"], abs=2e-3)
        assert [p[:2] for p in row["curve"]] == [p[:2] for p in twin["curve"]]
        assert [p[2] for p in row["curve"]] == pytest.approx([p[2] for p in twin["curve"]],
                                                             abs=2e-3)


def test_a_random_growth_draws_from_its_units_own_stream(corpus):
    """A row must not depend on what its worker trained before: the random operator's new
    blocks come from the episode's growth stream, not the process's generator."""
    plan = parse_plan(_plan(arms=[{"arm": "G1-2@0.5:random", "lr": 1e-2}], budgets=[1]))
    (unit,) = plan.units()
    torch.manual_seed(1)
    (first,) = train_unit(unit, plan, corpus)
    torch.manual_seed(2)
    torch.randn(1000)  # another unit's draws
    (second,) = train_unit(unit, plan, corpus)
    assert first["final_depth"] == 2
    assert second["validation_nats"] == first["validation_nats"]


# --- a learning rate per phase ----------------------------------------------------------------
def test_lr_phases_takes_the_three_forms_of_lr_and_adds_to_it():
    """One phase rate for every budget, a grid of them, or a map from budget to either; with
    ``lr`` beside it the arm trains both kinds, one unit per rate, the phase rates last."""
    arm = "G1-2@0.5:identity"
    forms = {"one": [1e-3, 2e-3], "grid": [[1e-3, 2e-3], [2e-3, 2e-3]],
             "map": {"1": [1e-3, 2e-3], "2": [[1e-3, 2e-3], [2e-3, 2e-3]], "3": [2e-3, 2e-3]}}
    units = {name: list(parse_plan(_plan(arms=[{"arm": arm, "lr_phases": form}])).units())
             for name, form in forms.items()}
    assert [(u.lr, u.phases, len(u.budgets)) for u in units["one"]] == [(1e-3, (1e-3, 2e-3), 3)]
    assert [(u.phases, len(u.budgets)) for u in units["grid"]] == [((1e-3, 2e-3), 3),
                                                                  ((2e-3, 2e-3), 3)]
    assert [(u.phases, [b / 2e7 for b in u.budgets]) for u in units["map"]] == [
        ((1e-3, 2e-3), [1, 2]), ((2e-3, 2e-3), [2, 3])]
    both = list(parse_plan(_plan(arms=[{"arm": arm, "lr": {"1": 4e-3, "2": 4e-3},
                                        "lr_phases": {"3": [1e-3, 2e-3]}}])).units())
    assert [(u.rate, len(u.budgets)) for u in both] == [(4e-3, 2), ((1e-3, 2e-3), 1)]
    assert both[0].key != both[1].key and both[1].key == (arm, (1e-3, 2e-3), 0)


@pytest.mark.parametrize(("arm", "message"), [
    ({"arm": "S2", "lr_phases": [1e-3, 2e-3]}, "S2: lr_phases is for a growing arm (one rate "
                                               "per phase); a fixed size takes lr"),
    ({"arm": "G1-2@0.5:copy", "lr_phases": [1e-3]}, "G1-2@0.5:copy: lr_phases needs one rate "
                                                    "per phase (2: 1 -> 2 blocks)"),
    ({"arm": "G1-2-4@0.2,0.5:copy", "lr_phases": [[1e-3, 2e-3]]}, "needs one rate per phase (3"),
    ({"arm": "G1-2@0.5:copy", "lr_phases": []}, "needs one rate per phase (2: 1 -> 2 blocks), "
                                                "or a list of such lists; got []"),
    ({"arm": "G1-2@0.5:copy", "lr_phases": [1e-3, 0]}, "lr_phases must be a number > 0, got 0"),
    ({"arm": "G1-2@0.5:copy", "lr_phases": {"7": [1e-3, 1e-3]}}, "lr for budget '7', which"),
    ({"arm": "G1-2@0.5:copy", "lr": {"1": [1e-3, 2e-3], "2": 1e-3, "3": 1e-3}},
     "lr for budget '1' is a list, [0.001, 0.002]; an lr map takes one rate per budget, and a "
     "rate per phase goes in lr_phases"),
    ({"arm": "G1-2@0.5:copy", "lr": {"1": 1e-3}, "lr_phases": {"2": [1e-3, 1e-3]}},
     "G1-2@0.5:copy: no lr for budget 3"),
    ({"arm": "G1-2@0.5:copy"}, "each arm is an object with 'arm' and 'lr' (or 'lr_phases')"),
    ({"arm": "G1-2@0.5:copy", "lr": 1e-3, "lr_phase": [1e-3, 1e-3]},
     "unknown arm key 'lr_phase'; accepted: arm, lr, lr_phases, budgets"),
])
def test_bad_phase_rates_are_refused_in_one_line(arm, message):
    with pytest.raises(ConfigError) as err:
        parse_plan(_plan(arms=[arm]))
    assert message in str(err.value) and "\n" not in str(err.value)


def _rates_seen(monkeypatch, unit, plan, corpus) -> tuple[list[tuple], dict]:
    """Train ``unit`` and return, for every step, (the multiplier the run's ledger applied,
    every group's rate, the optimizer's parameter count), and the row."""
    from esper_lightning.core import compute

    seen = []

    def spy(groups, multiplier):
        ledger_apply(groups, multiplier)
        seen.append((multiplier, [g["lr"] for g in groups],
                     sum(len(g["params"]) for g in groups)))

    ledger_apply = compute.apply_multiplier
    monkeypatch.setattr(compute, "apply_multiplier", spy)
    (row,) = train_unit(unit, plan, corpus)
    return seen, row


def test_each_phase_trains_at_its_rate_and_the_second_rewarms_to_it(monkeypatch, corpus):
    """Before the growth every group's rate is the first phase's times the schedule; after it
    the second phase's times the schedule, re-warmed linearly from 0 over the warmup compute
    (equal steps of the multiplier from one step's share of it up to 1)."""
    plan = parse_plan(_plan(arms=[{"arm": "G1-2@0.5:identity", "lr_phases": [1e-2, 3e-3]}],
                            budgets=[1], warmup_flops=4e6))  # a re-warm of several steps
    (unit,) = plan.units()
    seen, row = _rates_seen(monkeypatch, unit, plan, corpus)
    grown = next(i for i, (_, _, n) in enumerate(seen) if n > seen[0][2])
    assert 0 < grown < len(seen) == row["steps"] and row["lr_phases"] == (1e-2, 3e-3)
    for i, (multiplier, rates, _) in enumerate(seen):
        expected = (1e-2 if i < grown else 3e-3) * multiplier
        assert rates == pytest.approx([expected] * len(rates), rel=1e-12), i
    assert seen[grown - 1][0] == 1.0  # the stable phase: the first rate at its peak
    ramp = [m for m, _, _ in seen[grown:]]
    top = ramp.index(1.0)
    steps = np.diff(ramp[:top])
    assert top >= 4 and ramp[0] == pytest.approx(steps[0] / 2)  # from 0, at the batches' middles
    assert steps == pytest.approx(np.full(len(steps), steps[0]), rel=1e-9)
    assert steps[0] * seen[grown][1][0] > 0  # it trains from the first step after growth


def test_equal_phase_rates_are_the_rewarmed_arm_at_that_rate(corpus):
    """A phase rate [r, r] is the arm with ``+rewarm`` at r, to the last bit: the same re-warm,
    the same base rate; another second rate is another run."""
    plan = parse_plan(_plan(arms=[{"arm": "G1-2@0.5:identity", "lr_phases": [[1e-2, 1e-2],
                                                                            [1e-2, 3e-3]]},
                                  {"arm": "G1-2@0.5:identity+rewarm", "lr": 1e-2}],
                            budgets=[1]))
    lower, equal, rewarmed = (train_unit(u, plan, corpus)[0] for u in plan.units())
    assert (lower["lr_phases"], equal["lr_phases"]) == ((1e-2, 3e-3), (1e-2, 1e-2))
    assert equal["lr"] == lower["lr"] == rewarmed["lr"] == 1e-2
    assert equal["validation_nats"] == rewarmed["validation_nats"]
    assert lower["validation_nats"] != equal["validation_nats"]
    assert rewarmed["lr_phases"] is None


def _old_rows_file(folder: Path, rows: list[dict]) -> None:
    """A rows file as written before phase rates existed (no lr_phases column, nor any after)."""
    from esper_lightning.app.frontier.study import ROW_FORMATS
    from esper_lightning.app.frontier.train import ROW_FIELDS

    fields = ROW_FIELDS[:ROW_FORMATS[0]]
    lines = [",".join(fields)] + [",".join("" if r.get(f) is None else str(r[f]) for f in fields)
                                  for r in rows]
    (folder / ROWS_FILE).write_text("\n".join(lines) + "\n")


def test_old_rows_files_load_and_take_phase_rows(tmp_path: Path):
    """A rows file without lr_phases loads (every row one rate); rows without phase rates are
    appended under its columns, and the first with phase rates rewrites it with the column, every
    row kept; a unit of phase rates is pending until its own rows are in, whatever rows of
    one rate the arm has."""
    from esper_lightning.app.frontier.study import _append, pending_units

    rows = _rows({"S1": 1.0, "G1-2@0.5:identity": 1.5}, lrs=(2e-3,), episodes=(0,))
    _old_rows_file(tmp_path, rows[:4])
    old = read_rows(tmp_path)
    assert len(old) == 4 and all(r["lr_phases"] is None for r in old)
    assert old[0]["lr"] == 2e-3 and old[0]["validation_nats"] == rows[0]["validation_nats"]
    _append(tmp_path / ROWS_FILE, rows[4:5])
    assert "lr_phases" not in (tmp_path / ROWS_FILE).read_text().splitlines()[0]
    phased = [{**r, "lr_phases": (1e-3, 2e-3), "lr": 1e-3} for r in rows[4:]]
    _append(tmp_path / ROWS_FILE, phased)
    assert (tmp_path / ROWS_FILE).read_text().splitlines()[0].endswith(",lr_phases")
    back = read_rows(tmp_path)
    assert [r["lr_phases"] for r in back] == [None] * 5 + [(1e-3, 2e-3)] * 4
    assert _no_clock(back[:5]) == _no_clock(old + read_rows(tmp_path)[4:5])
    plan = parse_plan(_plan(budgets=[1, 2, 4, 8], base_flops=1e12, warmup_flops=1e10, arms=[
        {"arm": "G1-2@0.5:identity", "lr": {"1": 2e-3},
         "lr_phases": [[1e-3, 2e-3], [2e-3, 2e-3]]}]))
    assert [u.rate for u in pending_units(plan, back)] == [(2e-3, 2e-3)]


def test_rows_with_curves_round_trip_and_a_long_run_is_a_unit_of_its_own(tmp_path, text_file):
    """A study with curves and long runs: its rows read back as trained (curves to the last
    bit, through JSON); without its long run's row that unit alone is pending, though the
    arm's WSD row of the same budget is there; an old rows file takes curve rows by being
    rewritten with every column, its rows read with none."""
    from esper_lightning.app.frontier.study import _append, pending_units

    folder = tmp_path / "study"
    folder.mkdir()
    plan = _plan(budgets=[1, 2], curve_points=3, curve_blocks=4,
                 arms=[{"arm": "S1", "lr": 1e-2, "long_schedule": "linear"}])
    (folder / PLAN_FILE).write_text(json.dumps(plan))
    whole = run_study(folder, text_file, progress=False)
    assert read_rows(folder) == whole and [r["schedule"] for r in whole] == [None, None, "linear"]
    assert all(len(r["curve"]) == 3 and r["curve_flops"] > 0 for r in whole)
    assert pending_units(parse_plan(plan), whole[:2]) == [u for u in parse_plan(plan).units()
                                                          if u.schedule == "linear"]
    old = tmp_path / "old"
    old.mkdir()
    bare = _rows({"S1": 1.0}, lrs=(2e-3,), episodes=(0,))
    _old_rows_file(old, bare)
    _append(old / ROWS_FILE, whole)
    assert (old / ROWS_FILE).read_text().splitlines()[0].endswith(",schedule,curve,curve_flops")
    back = read_rows(old)
    assert back[len(bare):] == whole and all(r["curve"] is None for r in back[:len(bare)])


def test_every_committed_study_still_loads():
    """The committed results load. Those of a plan without curves (written before lr_phases
    and curves existed) are rows of one rate on the frontier's schedule, without curves: every
    literature reading from curves is None (the report's "no curve"), and the frontier's
    readings see every row; a plan that reads curves has them on every row."""
    from esper_lightning.app.frontier.estimators import (
        CurveReadings,
        curve_readings,
        frontier_rows,
        growing_arms,
    )
    from esper_lightning.app.frontier.report import at_chosen_rates

    folders = sorted(Path(__file__).parents[1].glob("results/frontier/*/" + PLAN_FILE))
    if not folders:
        pytest.skip("no committed frontier results in this checkout")
    played = 0
    for plan_file in folders:
        plan = read_plan(plan_file)
        rows = read_rows(plan_file.parent)
        if rows:  # a plan committed before its first episode (pre-registered) has none yet
            assert at_chosen_rates(rows), plan_file
            if plan.curve_points:  # a study that reads curves has them on every row
                assert all(r["curve"] and r["curve_flops"] for r in rows), plan_file
                played += 1
                continue
            assert frontier_rows(rows) == rows and not any(
                r["schedule"] or r["curve"] or r["curve_flops"] for r in rows)
            for arm in growing_arms(rows):
                budget = next(r["budget"] for r in rows if r["arm"] == arm)
                assert curve_readings(rows, arm, budget) == CurveReadings()
            played += 1
    assert played


def test_select_prints_a_winning_phase_rate_as_lr_phases(tmp_path, capsys):
    """Where a phase rate has the lowest validation loss ``select`` names it under lr_phases,
    the other budgets under lr, and the arm it prints is a plan's arm again."""
    from esper_lightning.app.frontier.command import main
    from esper_lightning.app.frontier.report import at_chosen_rates, select_lrs
    from esper_lightning.app.frontier.study import _append

    arm = "G1-2@0.5:identity"
    rows = _rows({arm: 1.5}, lrs=(2e-3,), episodes=(0, 1))
    phased = [{**r, "lr": 1e-3, "lr_phases": (1e-3, 4e-3), "validation_nats":
               r["validation_nats"] + (-0.02 if r["budget"] == 8.0 else 0.02)} for r in rows]
    chosen = select_lrs(rows + phased, arm)
    assert chosen[8.0] == ((1e-3, 4e-3), False) and chosen[1.0] == (2e-3, False)
    assert {r["lr_phases"] for r in at_chosen_rates(rows + phased) if r["budget"] == 8.0} == {
        (1e-3, 4e-3)}
    final = dict(budgets=[1, 2, 4, 8], base_flops=1e12, warmup_flops=1e10)
    (tmp_path / PLAN_FILE).write_text(json.dumps(_plan(**final)))
    _append(tmp_path / ROWS_FILE, rows + phased)
    assert main(["select", str(tmp_path)]) == 0
    (printed,) = json.loads(capsys.readouterr().out)
    assert printed == {"arm": arm, "lr": {"1": 2e-3, "2": 2e-3, "4": 2e-3},
                       "lr_phases": {"8": [1e-3, 4e-3]}}
    (again,) = parse_plan(_plan(arms=[printed], **final)).arms
    assert again.lrs[8.0] == ((1e-3, 4e-3),) and again.lrs[1.0] == (2e-3,)
