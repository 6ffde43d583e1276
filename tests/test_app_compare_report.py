"""`app.compare.report`: per-controller summaries, paired differences, Markdown and JSON, for every
metric of `records.METRICS`."""

import json

import numpy as np
import pytest

from esper_lightning.app.compare.records import METRICS, EpisodeRecord, Metric
from esper_lightning.app.compare.report import (
    Scope,
    coinciding,
    markdown_table,
    paired_differences,
    summarize,
    summary_json,
)
from esper_lightning.app.compare.stats import holm, mean_ci, min_detectable_effect, wilcoxon_p


def record(controller, index, outcome, *, total_params=100_000, seed_params=0,
           episode_return=None, curve=None, episode_rng_seed=None, host="baseline", **values):
    curve = (50.0, outcome - 1.0, outcome, outcome + 1.0) if curve is None else curve
    return EpisodeRecord(
        controller, index, 1000 + index if episode_rng_seed is None else episode_rng_seed, host,
        {"outcome": outcome, "final_accuracy": curve[-1], "seed_params": seed_params,
         "total_params": total_params, "episode_return": episode_return,
         "accuracy_curve": tuple(curve), "seeds_germinated": 2, "seeds_fossilized": 1,
         "seeds_pruned": 1, "wall_seconds": 3.25, **values},
    )


def paired_table(reference_outcomes, controller_outcomes, name="grower"):
    records = [record("static", i, float(v)) for i, v in enumerate(reference_outcomes)]
    records += [record(name, i, float(v), total_params=104_000, seed_params=4_000)
                for i, v in enumerate(controller_outcomes)]
    return records


def test_identical_controllers_differ_by_exactly_zero():
    outcomes = np.random.default_rng(0).normal(70.0, 3.0, size=8)
    records = paired_table(outcomes, outcomes, name="twin")
    (comparison,) = paired_differences(records, reference="static")
    assert comparison.controller == "twin" and comparison.reference == "static"
    assert comparison.differences["outcome"].mean == 0.0
    assert comparison.differences["outcome"].ci == (0.0, 0.0)
    assert comparison.p_value == 1.0
    assert comparison.verdict == "no detectable difference at 8 episodes"
    assert comparison.differences["total_params"].mean == 4_000.0
    assert comparison.differences["total_params"].ci == (4_000.0, 4_000.0)
    assert comparison.differences["val_loss"] is None  # no losses recorded


@pytest.mark.parametrize(("shift", "expected"), [(5.0, "better"), (-5.0, "worse")])
def test_clear_differences_get_a_verdict(shift, expected):
    rng = np.random.default_rng(1)
    reference = rng.normal(70.0, 3.0, size=10)
    controller = reference + shift + rng.normal(0.0, 0.5, size=10)
    (comparison,) = paired_differences(paired_table(reference, controller))
    outcome = comparison.differences["outcome"]
    assert comparison.verdict == expected and comparison.outcome == "outcome"
    assert outcome.mean == pytest.approx(np.mean(controller - reference))
    assert comparison.p_value == pytest.approx(2 / 2**10)  # unanimous signs, exact test
    low, high = outcome.ci
    assert low < outcome.mean < high and (low > 0 or high < 0)


def test_noisy_small_difference_is_not_detected():
    reference = np.random.default_rng(2).normal(70.0, 3.0, size=10)
    noise = np.array([3.0, -2.9, 2.4, -2.6, 0.5, -1.1, 1.6, -2.0, 2.2, -0.7])
    (comparison,) = paired_differences(paired_table(reference, reference + 0.2 + noise))
    low, high = comparison.differences["outcome"].ci
    assert low < 0.0 < high
    assert comparison.p_value > 0.05
    assert comparison.verdict == "no detectable difference at 10 episodes"


def test_too_few_pairs_get_no_verdict_even_when_the_interval_excludes_zero():
    reference = np.full(6, 70.0)
    steps = np.arange(6, dtype=float)
    (few,) = paired_differences(paired_table(reference[:5], reference[:5] + 5.0 + steps[:5]))
    assert few.differences["outcome"].ci[0] > 0.0
    assert few.p_value == pytest.approx(2 / 2**5)  # the smallest p five pairs can give
    assert few.verdict == "no detectable difference at 5 episodes (p >= 0.05)"
    (enough,) = paired_differences(paired_table(reference, reference + 5.0 + steps))
    assert enough.verdict == "better"


def test_an_interval_that_excludes_zero_without_a_significant_test_is_no_verdict():
    # Nine small gains and one loss of rank 8: the mean difference is clearly positive, the
    # exact signed-rank p is 2 * 25 / 2**10 = 0.0488 alone, and twice that in a table of two
    # (Holm: the smaller p of two is doubled).
    reference = np.random.default_rng(5).normal(70.0, 3.0, size=10)
    gains = np.array([0.30, 0.25, 0.20, 0.35, 0.28, 0.22, 0.31, 0.27, 0.24, -0.305])
    records = paired_table(reference, reference + gains)
    noise = np.array([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8, 0.9, -1.0])
    records += [record("random", i, float(v)) for i, v in enumerate(reference + noise)]
    grower, random = paired_differences(records)
    assert grower.differences["outcome"].ci[0] > 0.0
    assert grower.p_value == pytest.approx(2 * 25 / 2**10)
    assert grower.p_holm == pytest.approx(2 * grower.p_value)
    assert grower.p_holm == pytest.approx(holm([grower.p_value, random.p_value])[0])
    assert grower.verdict == "no detectable difference at 10 episodes (p >= 0.05)"
    (alone,) = paired_differences(paired_table(reference, reference + gains))
    assert alone.p_holm == alone.p_value and alone.verdict == "better"


def test_a_table_of_null_comparisons_rarely_calls_any_of_them_better_or_worse():
    """Three controllers that are the reference in disguise, 10 pairs, 150 seeded tables: the
    rule before (the interval alone) called one of the three better or worse in about a
    quarter of the tables; interval and Holm-adjusted test together keep it near 5 %."""
    rng = np.random.default_rng(6)
    tables, flagged = 150, 0
    for _ in range(tables):
        level = rng.normal(45.0, 2.0, size=10)  # episodes differ, controllers do not
        records = [record("static", i, float(v))
                   for i, v in enumerate(level + rng.normal(0.0, 0.5, 10))]
        for name in ("a", "b", "c"):
            records += [record(name, i, float(v))
                        for i, v in enumerate(level + rng.normal(0.0, 0.5, 10))]
        verdicts = [c.verdict for c in paired_differences(records)]
        flagged += any(v in ("better", "worse") for v in verdicts)
    assert flagged / tables <= 0.09


def test_summary_and_paired_intervals_are_the_stats_of_the_right_arrays():
    reference = np.array([68.0, 71.5, 66.25, 73.0, 70.5, 69.0, 72.25, 67.75])
    controller = reference + np.array([2.1, -0.4, 3.3, 1.7, -1.2, 2.8, 0.9, 4.5])
    records = paired_table(reference, controller)
    d = controller - reference  # the same float operations as the module
    (comparison,) = paired_differences(records)
    assert comparison.differences["outcome"].ci == mean_ci(d)
    assert comparison.p_value == comparison.p_holm == wilcoxon_p(d)  # a family of one
    assert comparison.mde == min_detectable_effect(d)
    static, grower = summarize(records)
    assert grower.metrics["outcome"].mean == pytest.approx(controller.mean())
    assert grower.metrics["outcome"].ci == mean_ci(controller)
    assert static.metrics["outcome"].ci == mean_ci(reference)


def test_summarize_reports_params_returns_and_final_accuracy():
    records = [record("static", i, 70.0 + i) for i in range(4)]
    records += [record("ppo", i, 72.0 + i, total_params=100_000 + 1_000 * i,
                       seed_params=1_000 * i, episode_return=float(i)) for i in range(4)]
    static, ppo = summarize(records)
    assert (static.controller, static.n_episodes) == ("static", 4)
    assert static.metrics["episode_return"] is None
    assert static.metrics["final_accuracy"].mean == pytest.approx(72.5)
    assert static.metrics["final_accuracy"].ci is None  # a mean-only metric
    assert static.metrics["seed_params"].ci == (0.0, 0.0)
    assert ppo.metrics["total_params"].mean == 101_500.0
    assert ppo.metrics["seed_params"].mean == 1_500.0
    assert ppo.metrics["episode_return"].mean == 1.5
    assert ppo.metrics["episode_return"].ci == mean_ci([0.0, 1.0, 2.0, 3.0])
    assert set(ppo.metrics) == {m.name for m in METRICS.values() if m.summary}
    mixed = [*records, record("half", 0, 70.0, episode_return=1.0), record("half", 1, 70.0)]
    with pytest.raises(ValueError, match="controller 'half' has episode_return in 1 of 2"):
        summarize(mixed)


def test_pairing_uses_only_common_episode_indices():
    records = [record("static", i, 60.0 + i) for i in range(8)]
    records += [record("ppo", i, 62.0 + i) for i in range(11, 3, -1)]  # 11..4, out of order
    (comparison,) = paired_differences(records)
    assert comparison.episode_indices == (4, 5, 6, 7)
    assert comparison.n_pairs == 4
    assert comparison.differences["outcome"].mean == 2.0
    assert comparison.differences["outcome"].ci == (2.0, 2.0)
    disjoint = [record("static", 0, 60.0), record("ppo", 1, 61.0)]
    with pytest.raises(ValueError, match="controller 'ppo' shares no episode index with 'static'"):
        paired_differences(disjoint)


def test_pairing_refuses_unlike_episodes_and_duplicates():
    unlike = [record("static", 0, 60.0), record("ppo", 0, 61.0, episode_rng_seed=7)]
    with pytest.raises(ValueError, match="episode 0 differs between 'ppo'"):
        paired_differences(unlike)
    duplicated = [record("static", 0, 60.0), record("static", 0, 61.0)]
    with pytest.raises(ValueError, match="'static' has two records of episode 0"):
        summarize(duplicated)


def test_pair_selection():
    records = [record(name, i, 60.0 + k + i) for k, name in enumerate(["static", "a", "b"])
               for i in range(6)]
    default = paired_differences(records)
    assert [(c.controller, c.reference) for c in default] == [("a", "static"), ("b", "static")]
    every = paired_differences(records, pairs="all")
    assert [(c.controller, c.reference, c.differences["outcome"].mean) for c in every] == [
        ("a", "static", 1.0), ("b", "static", 2.0), ("b", "a", 1.0)]
    explicit = paired_differences(records, pairs=[("static", "b")])
    assert explicit[0].differences["outcome"].mean == -2.0 and explicit[0].verdict == "worse"
    assert paired_differences([record("static", 0, 60.0)]) == []
    with pytest.raises(ValueError, match="reference controller 'heuristic' has no episodes"):
        paired_differences(records, reference="heuristic")
    with pytest.raises(ValueError, match="unknown pairs 'every'"):
        paired_differences(records, pairs="every")
    with pytest.raises(ValueError, match="controller 'c' has no episodes"):
        paired_differences(records, pairs=[("c", "a")])
    with pytest.raises(ValueError, match="outcome 'seed_params' must be a paired"):
        paired_differences(records, outcome="seed_params")


def test_markdown_and_json_reports():
    rng = np.random.default_rng(3)
    reference = rng.normal(70.0, 3.0, size=8)
    records = paired_table(reference, reference + 5.0 + rng.normal(0.0, 0.3, size=8))
    records += [record("ppo|v2", i, float(v), episode_return=0.5)
                for i, v in enumerate(reference + 0.1 * rng.normal(size=8))]
    summaries, comparisons = summarize(records), paired_differences(records)
    text = markdown_table(summaries, comparisons)
    for name in ["static", "grower", "ppo\\|v2"]:
        assert f"| {name} |" in text
    assert ("| controller | episodes | outcome (%) [95% CI] | final acc. (%) | total params "
            "[95% CI] | seed params [95% CI] | return [95% CI] |") in text
    assert ("| controller | reference | pairs | Δ outcome (pp) [95% CI] | p (Wilcoxon) | "
            "p (Holm) | verdict | MDE (pp) | Δ total params [95% CI] |\n"
            "|---|---|---:|---:|---:|---:|---|---:|---:|") in text
    assert "| better |" in text and "| no detectable difference at 8 episodes |" in text
    assert "n/a" in text and "104,000" in text and "+4,000 [+4,000, +4,000]" in text
    assert text.count("\n|---") == 2 and "Validation loss" not in text  # no losses recorded

    report = json.loads(json.dumps(summary_json(summaries, comparisons)))
    assert [c["controller"] for c in report["controllers"]] == ["static", "grower", "ppo|v2"]
    assert report["controllers"][0]["episode_return_ci"] is None
    assert "final_accuracy_ci" not in report["controllers"][0]  # a mean-only metric
    assert report["comparisons"][0]["verdict"] == "better"
    outcome = comparisons[0].differences["outcome"]
    assert report["comparisons"][0]["outcome_diff_ci"] == list(outcome.ci)
    assert report["comparisons"][0]["outcome_diff_mean"] == outcome.mean
    assert report["comparisons"][0]["p_holm"] == comparisons[0].p_holm
    assert report["comparisons"][0]["mde"] == comparisons[0].mde
    assert f"| {comparisons[0].mde:.2f} |" in text
    assert (report["alpha"], report["power"]) == (0.05, 0.8)


def with_losses(r, losses):
    values = {**r.values, "loss_curve": tuple(losses), "val_loss": float(np.mean(losses[-3:]))}
    return EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host, values)


def test_validation_losses_are_summarised_and_paired_in_their_section():
    records = []
    for i in range(6):
        records.append(with_losses(record("static", i, 60.0), (3.0, 2.0 + i, 2.0 + i, 2.0 + i)))
        records.append(with_losses(record("grown", i, 61.0), (3.0, 1.9 + i, 1.9 + i, 1.8 + i)))
    static, grown = summarize(records)
    assert static.metrics["val_loss"].mean == pytest.approx(4.5)
    (pair,) = paired_differences(records, "static")
    assert pair.differences["val_loss"].mean == pytest.approx(-0.4 / 3)
    assert pair.differences["val_loss"].ci == pytest.approx((-0.4 / 3, -0.4 / 3))
    text = markdown_table([static, grown], [pair], scope=Scope(example="byte"))
    assert ("## Validation loss\n\nMean validation loss of the last 3 epochs, in nats per "
            "byte (lower is better).\n\n| controller | val loss [95% CI] |") in text
    assert "| grown | static | 6 | -0.1333 [-0.1333, -0.1333] |" in text
    no_losses = [record("static", i, 60.0) for i in range(2)]
    assert summarize(no_losses)[0].metrics["val_loss"] is None
    assert "Validation loss" not in markdown_table(summarize(no_losses), [])


#: A metric of the test alone: the outcome shifted by a constant, lower is better, in a section
#: of its own. Added below in this one place; every output must show it.
SHIFTED = Metric("shifted", lambda e: METRICS["outcome"].read(e) + 10.0, "shifted", fmt=".3f",
                 better="lower", paired=True, section="Shifted outcome",
                 description="the outcome plus ten")


def test_a_metric_added_in_one_place_is_summarised_paired_and_reported(monkeypatch):
    rng = np.random.default_rng(4)
    reference = rng.normal(70.0, 3.0, size=8)
    table = paired_table(reference, reference + 2.0 + rng.normal(0, 0.2, size=8))
    monkeypatch.setitem(METRICS, SHIFTED.name, SHIFTED)
    records = [EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host,
                             {**r.values, "shifted": r["outcome"] + 10.0}) for r in table]
    summaries, comparisons = summarize(records), paired_differences(records)
    for s in summaries:
        assert s.metrics["shifted"].mean == pytest.approx(s.metrics["outcome"].mean + 10.0)
    (pair,) = comparisons
    assert pair.differences["shifted"].mean == pytest.approx(pair.differences["outcome"].mean)
    shifted_ci, outcome_ci = pair.differences["shifted"].ci, pair.differences["outcome"].ci
    assert shifted_ci == pytest.approx(outcome_ci)
    text = markdown_table(summaries, comparisons)
    assert "## Shifted outcome\n\nThe outcome plus ten (lower is better)." in text
    grower = summaries[1].metrics["shifted"]
    assert f"| grower | {grower.mean:.3f} [{grower.ci[0]:.3f}, {grower.ci[1]:.3f}] |" in text
    assert f"| grower | static | 8 | {pair.differences['shifted'].mean:+.3f} [" in text
    report = summary_json(summaries, comparisons)
    assert report["controllers"][1]["shifted_mean"] == grower.mean
    assert report["comparisons"][0]["shifted_diff_ci"] == list(shifted_ci)
    # Judged as the outcome, the same shift is worse: lower is better for this metric.
    (judged,) = paired_differences(records, outcome="shifted")
    assert pair.verdict == "better" and judged.verdict == "worse"


def with_compute(r, train_flops, budget_flops=None):
    values = {**r.values, "train_flops": train_flops, "budget_flops": budget_flops,
              "data_passes": 1.0, "loss_curve": (3.0, 2.5, 2.0, 1.5),
              "val_loss": 2.0, "final_bits": 1.5 / np.log(2.0)}
    return EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host, values)


def test_scope_of_records_reads_budget_and_flops_per_episode():
    equal = [with_compute(record(c, i, 60.0), 1e9) for i in range(3) for c in ("a", "b")]
    assert Scope.of(equal, bits=False, example="image") == Scope(
        budgeted=False, flops_differ=False, bits=False, example="image")
    # Different FLOPs on different episodes of one controller are no difference between
    # controllers; on one episode index they are.
    by_episode = [with_compute(record(c, i, 60.0), 1e9 * (i + 1)) for i in range(3)
                  for c in ("a", "b")]
    assert not Scope.of(by_episode, bits=False, example="image").flops_differ
    grown = [*equal[:-1], with_compute(record("b", 2, 60.0), 2e9)]
    assert Scope.of(grown, bits=False, example="image").flops_differ
    budgeted = [with_compute(record("a", 0, 60.0), 1e9, budget_flops=1e9)]
    assert Scope.of(budgeted, bits=True, example="byte").budgeted


@pytest.mark.parametrize("scope, shown, hidden", [
    (Scope(budgeted=False, flops_differ=False, bits=False, example="image"),
     ["## Validation loss", "nats per image"],
     ["## Compute", "final loss (bits)", "byte"]),
    (Scope(budgeted=False, flops_differ=True, bits=False, example="image"),
     ["## Compute", "Training images seen"], ["final loss (bits)"]),
    (Scope(budgeted=True, flops_differ=False, bits=True, example="byte"),
     ["## Compute", "final loss (bits)", "in bits per byte"], ["image"]),
])
def test_the_report_shows_only_the_sections_its_scope_applies(scope, shown, hidden):
    records = [with_compute(record(c, i, 60.0 + i + (c == "b")), 1e9 + (c == "b"),
                            budget_flops=1e9 if scope.budgeted else None)
               for i in range(6) for c in ("a", "b")]
    text = markdown_table(summarize(records), paired_differences(records, "a"), scope=scope)
    for words in shown:
        assert words in text
    for words in hidden:
        assert words not in text


def test_coinciding_controllers_are_found_and_named_under_the_first_table():
    records = [record(c, i, 60.0 + i) for i in range(4) for c in ("static", "idle", "grower")]
    records = [r if r.controller != "grower" else record("grower", r.episode_index, 70.0)
               for r in records]
    # A different wall time is the same play; one differing value in one episode is not.
    records.append(record("slow", 0, 60.0, wall_seconds=99.0))
    records += [record("slow", i, 60.0 + i) for i in range(1, 4)]
    records += [record("late", i, 60.0 + i + (i == 3)) for i in range(4)]
    same = coinciding(records)
    assert same == [("static", "idle", "slow")]
    text = markdown_table(summarize(records), paired_differences(records, "static"), same=same)
    assert ("idle and slow played exactly as static in every episode (every value and curve "
            "equal, wall time aside)") in text
    assert coinciding([record("a", 0, 1.0), record("b", 1, 1.0)]) == []  # other episodes
