"""Per-budget tables (`app.compare.report.per_budget`, grouped by `table.by_budget`) and the
regret to the oracle growth time (`app.compare.regret`), on constructed episode records."""

import csv
import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from esper_lightning.app.compare import regret
from esper_lightning.app.compare.records import EpisodeRecord, fieldnames, read_records_csv
from esper_lightning.app.compare.report import (
    budget_json,
    budget_markdown,
    markdown_table,
    paired_differences,
    per_budget,
    summarize,
)
from esper_lightning.app.compare.stats import holm
from esper_lightning.app.compare.table import by_budget

JUDGED = "test_bits"  # what a budgeted comparison judges
SMALL, LARGE = 1e12, 4e12
ARMS = ("stack:4@0.25:identity", "stack:4@0.5:identity", "stack:4@0.75:identity")
#: Mean bits added to an episode's base per arm and budget: the small budget favours growing
#: early (tau 0.25), the large one growing late (tau 0.75).
OFFSETS = {SMALL: {"static": 0.30, ARMS[0]: 0.00, ARMS[1]: 0.05, ARMS[2]: 0.12, "heuristic": 0.04},
           LARGE: {"static": 0.20, ARMS[0]: 0.10, ARMS[1]: 0.04, ARMS[2]: 0.00, "heuristic": 0.02}}
N_PER_BUDGET = 6


def record(controller, index, bits, budget):
    return EpisodeRecord(controller, index, 1000 + index, "gpt-tiny", {
        "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0, "total_params": 1000,
        "accuracy_curve": (50.0, 50.0), "seeds_germinated": 0, "seeds_fossilized": 0,
        "seeds_pruned": 0, "wall_seconds": 1.0, "final_bits": bits, "test_bits": bits,
        "budget_flops": budget})


def table(budgets=(SMALL, LARGE), controllers=("static", *ARMS, "heuristic")):
    """Episodes ``0..N-1`` at the first budget, the next N at the second, ...: a base loss per
    episode shared by every controller, its offset, and a little noise of its own."""
    rng = np.random.default_rng(7)
    records = []
    for b, budget in enumerate(budgets):
        for i in range(b * N_PER_BUDGET, (b + 1) * N_PER_BUDGET):
            base = rng.normal(2.0, 0.3)
            records += [record(name, i, base + OFFSETS[budget][name] + rng.normal(0.0, 0.005),
                               budget) for name in controllers]
    return records


def bits(records, controller, budget=None):
    return np.array([r[JUDGED] for r in records if r.controller == controller
                     and (budget is None or r["budget_flops"] == budget)])


# --- grouping by budget -----------------------------------------------------------------------
def test_episodes_are_grouped_by_their_budget_smallest_first():
    records = table(budgets=(LARGE, SMALL))
    groups = by_budget(records)
    assert list(groups) == [SMALL, LARGE]
    assert set(groups[SMALL]["episode_index"]) == set(range(N_PER_BUDGET, 2 * N_PER_BUDGET))
    assert all(len(g) == N_PER_BUDGET * 5 for g in groups.values())


def test_grouping_refuses_mixed_or_conflicting_budgets():
    records = table()
    with pytest.raises(ValueError, match="known in 59 of 60"):
        by_budget([*records[:-1], record("heuristic", 11, 2.0, None)])
    with pytest.raises(ValueError, match="episode 0 has two budgets"):
        by_budget([*records, record("other", 0, 2.0, LARGE)])


# --- per-budget tables ------------------------------------------------------------------------
def test_per_budget_tables_are_the_statistics_of_each_budgets_episodes():
    records = table()
    tables = per_budget(records, "static", outcome=JUDGED)
    assert [t.budget for t in tables] == [SMALL, LARGE]
    p_values = []
    for t in tables:
        subset = [r for r in records if r["budget_flops"] == t.budget]
        expected = {s.controller: s.metrics[JUDGED] for s in summarize(subset)}
        assert {s.controller: s.metrics[JUDGED] for s in t.summaries} == expected
        for c, alone in zip(t.comparisons, paired_differences(subset, "static", outcome=JUDGED),
                            strict=True):
            d = bits(records, c.controller, t.budget) - bits(records, "static", t.budget)
            assert c.n_pairs == N_PER_BUDGET
            assert c.differences[JUDGED].mean == pytest.approx(d.mean())
            assert c.differences[JUDGED] == alone.differences[JUDGED]
            assert c.p_value == alone.p_value
            p_values.append(c.p_value)
    # one Holm family over both budgets' comparisons
    assert [c.p_holm for t in tables for c in t.comparisons] == holm(p_values)
    text = "\n".join(budget_markdown(tables))
    assert "### Budget 1e+12 FLOPs" in text and "### Budget 4e+12 FLOPs" in text
    assert text.index("1e+12") < text.index("4e+12")
    (small, large) = budget_json(tables)
    assert (small["budget_flops"], large["budget_flops"]) == (SMALL, LARGE)
    assert small["controllers"][1][f"{JUDGED}_mean"] == pytest.approx(bits(records, ARMS[0],
                                                                           SMALL).mean())


def test_one_budget_gives_no_per_budget_tables():
    records = table(budgets=(SMALL,))
    assert per_budget(records, "static", outcome=JUDGED) == []
    assert budget_markdown([]) == [] and budget_json([]) == []


# --- the oracle and the regret ----------------------------------------------------------------
def test_tau_families_group_stack_arms_that_differ_only_in_tau():
    labels = ["static", "stack:4@0.5", "stack:4@0.25:copy", "stack:4@0.5:identity",
              "stack:2@0.5", "stack:2@0.5:copy", "stack:nonsense", "heuristic",
              "stack:4@random"]  # random timing is a baseline, not a grid point
    assert regret.tau_families(labels) == {"stack:4@τ*:copy": ("static", "stack:4@0.25:copy",
                                                                "stack:4@0.5")}
    assert regret.tau_families(["static", ARMS[0]]) == {}  # never and one time: no grid
    assert regret.tau_families(labels[1:]) == {"stack:4@τ*:copy": ("stack:4@0.25:copy",
                                                                    "stack:4@0.5")}


def test_tau_families_of_several_growth_events_are_grids_over_every_time():
    # Host grow124: one growth time per slot, a later time of 1 meaning never; such a grid was
    # once no family at all, so its comparisons had no oracle.
    labels = ["static", "stack:4@0.5,1:identity", "stack:4@0.2,0.5:identity",
              "stack:4@0.2,0.3:identity", "stack:4@0.4:identity", "stack:4@random:identity"]
    assert regret.tau_families(labels) == {
        "stack:4@τ*,τ*:identity": ("static", "stack:4@0.2,0.3:identity",
                                   "stack:4@0.2,0.5:identity", "stack:4@0.5,1:identity")}


def test_a_group_of_arms_has_the_regret_of_its_members_mean():
    records = table()
    members = ("heuristic", ARMS[1])
    _, rows = regret.regrets(records, JUDGED, groups={"pair": members})
    by = {r.controller: r for r in rows}
    assert list(by)[-1] == "pair"  # after every controller
    assert by["pair"].overall.mean == pytest.approx(
        np.mean([by[m].overall.mean for m in members]))
    assert by["pair"].n_episodes == 2 * N_PER_BUDGET
    for budget in (SMALL, LARGE):
        assert by["pair"].per_budget[budget][1].mean == pytest.approx(
            np.mean([by[m].per_budget[budget][1].mean for m in members]))
    fewer = [r for r in records if not (r.controller == "heuristic" and r.episode_index < 2)]
    _, rows = regret.regrets(fewer, JUDGED, groups={"pair": members})
    assert [r.n_episodes for r in rows if r.controller == "pair"] == [2 * N_PER_BUDGET - 2]


def test_the_oracle_may_choose_never_to_grow(monkeypatch):
    # At a small budget no growth time may beat not growing; an oracle without "never" would
    # then be beaten by static and give it (and any late grower) a negative regret.
    monkeypatch.setitem(OFFSETS[SMALL], "static", -0.05)
    oracles, rows = regret.regrets(table(), JUDGED)
    (oracle,) = oracles
    assert oracle.arms == ("static", *ARMS)
    assert oracle.chosen == {SMALL: "static", LARGE: ARMS[2]}
    assert all(r.overall.mean > 0 for r in rows if r.controller != "static")
    (static,) = [r for r in rows if r.controller == "static"]
    assert static.per_budget[SMALL][1].mean == 0.0


def test_the_oracle_picks_the_best_tau_of_each_budget():
    records = table()
    oracles, _ = regret.regrets(records, JUDGED)
    (oracle,) = oracles
    assert oracle.name == "stack:4@τ*:identity" and oracle.arms == ("static", *ARMS)
    assert oracle.chosen == {SMALL: ARMS[0], LARGE: ARMS[2]}
    for budget in (SMALL, LARGE):
        assert oracle.means[budget] == pytest.approx(
            {arm: bits(records, arm, budget).mean() for arm in (*ARMS, "static")})


def hand_regret(records, controller):
    """The controller's bits minus the oracle arm's, episode by episode, by hand."""
    small = bits(records, controller, SMALL) - bits(records, ARMS[0], SMALL)
    large = bits(records, controller, LARGE) - bits(records, ARMS[2], LARGE)
    return small, large


def t_interval(values):
    ci = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values),
                                scale=scipy_stats.sem(values))
    return pytest.approx(ci)


def test_a_controllers_regret_is_its_loss_minus_the_oracle_arms_in_the_same_episode():
    records = table()
    _, rows = regret.regrets(records, JUDGED)
    row = next(r for r in rows if r.controller == "heuristic")
    small, large = hand_regret(records, "heuristic")
    every = np.concatenate([small, large])
    assert row.n_episodes == 2 * N_PER_BUDGET
    assert row.overall.mean == pytest.approx(every.mean())
    assert row.overall.ci == t_interval(every)
    assert row.per_budget[SMALL][0] == N_PER_BUDGET
    assert row.per_budget[SMALL][1].mean == pytest.approx(small.mean())
    assert row.per_budget[LARGE][1].mean == pytest.approx(large.mean())
    assert row.per_budget[LARGE][1].ci == t_interval(large)


def test_the_oracle_arms_own_regret_is_zero_on_its_budget():
    _, rows = regret.regrets(table(), JUDGED)
    early = next(r for r in rows if r.controller == ARMS[0])
    late = next(r for r in rows if r.controller == ARMS[2])
    assert early.per_budget[SMALL][1].mean == 0.0 and early.per_budget[SMALL][1].ci == (0, 0)
    assert late.per_budget[LARGE][1].mean == 0.0 and late.per_budget[LARGE][1].ci == (0, 0)
    assert early.per_budget[LARGE][1].mean > 0.05 and late.per_budget[SMALL][1].mean > 0.05


def test_regret_is_signed_so_that_positive_is_worse_for_a_higher_is_better_metric():
    records = [EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host,
                             {**r.values, "outcome": -r[JUDGED]}) for r in table()]
    oracles, rows = regret.regrets(records, "outcome")
    assert oracles[0].chosen == {SMALL: ARMS[0], LARGE: ARMS[2]}
    heuristic = next(r for r in rows if r.controller == "heuristic")
    assert heuristic.overall.mean == pytest.approx(np.concatenate(
        hand_regret(table(), "heuristic")).mean())


def test_the_regret_report_is_per_budget_only_with_two_budgets():
    oracles, rows = regret.regrets(table(), JUDGED)
    text = "\n".join(regret.markdown(oracles, rows, JUDGED))
    assert "## Regret to stack:4@τ*:identity" in text and "at 4e+12 FLOPs |" in text
    assert f"{ARMS[0]} at 1e+12 FLOPs; {ARMS[2]} at 4e+12 FLOPs" in text
    (data,) = regret.as_json(oracles, rows)
    assert [b["chosen"] for b in data["budgets"]] == [ARMS[0], ARMS[2]]
    assert len(data["controllers"]) == 5 and len(data["controllers"][0]["per_budget"]) == 2

    oracles, rows = regret.regrets(table(budgets=(LARGE,)), JUDGED)
    assert oracles[0].chosen == {LARGE: ARMS[2]}
    header = next(line for line in regret.markdown(oracles, rows, JUDGED)
                  if line.startswith("| controller"))
    assert "FLOPs" not in header


def test_no_tau_grid_no_regret():
    assert regret.regrets(table(controllers=("static", ARMS[1], "heuristic")), JUDGED) == ([], [])


def test_a_table_without_budget_column_reports_without_per_budget_section(tmp_path):
    records = table(budgets=(SMALL,))
    columns = [c for c in fieldnames() if c != "budget_flops"]
    path = tmp_path / "episodes.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(r.to_row() for r in records)
    old = read_records_csv(path)
    assert all(r["budget_flops"] is None for r in old)
    assert list(by_budget(old)) == [None]
    assert per_budget(old, "static", outcome=JUDGED) == []
    oracles, rows = regret.regrets(old, JUDGED)
    assert oracles[0].chosen == {None: ARMS[0]}  # the small budget's offsets
    report = markdown_table(summarize(old), paired_differences(old, "static", outcome=JUDGED))
    report += "\n".join(regret.markdown(oracles, rows, JUDGED))
    assert "Per budget" not in report and "FLOPs" not in report


# --- in the comparison's report -----------------------------------------------------------------
def test_the_comparison_report_has_the_per_budget_tables_and_the_regret(text_file, tmp_path,
                                                                       monkeypatch):
    from esper_lightning.app.compare import runner as compare
    from esper_lightning.app.config import CompareConfig

    # The figures and TensorBoard take most of a minute and are not what this test is about.
    monkeypatch.setattr(compare.plots, "save_figures", lambda *args, **kwargs: None)
    monkeypatch.setattr(compare, "_log_tensorboard", lambda *args, **kwargs: None)

    config = CompareConfig(
        task="lm", host_preset="grow4", slots=("r1c0",), controllers=("static", *ARMS,
                                                                      "heuristic"),
        budget_steps=6, budget_scales=(1.0, 4.0), data_dir=str(text_file),
        out=str(tmp_path / "out"), progress=False)
    (tmp_path / "out").mkdir()  # `Comparison.run` makes it before it plays
    text = compare.Comparison(config).report(table())
    assert "## Per budget" in text and "## Regret to stack:4@τ*:identity" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [t["budget_flops"] for t in summary["per_budget"]] == [SMALL, LARGE]
    assert [b["chosen"] for b in summary["regret"][0]["budgets"]] == [ARMS[0], ARMS[2]]
    assert (tmp_path / "out" / "regret.png").read_bytes().startswith(b"\x89PNG")
