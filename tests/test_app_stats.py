import dataclasses
import itertools
import json

import numpy as np
import pytest

from esper_lightning.app.stats import (
    FIELDNAMES,
    LEGACY_FIELDNAMES,
    MIN_PAIRS_FOR_VERDICT,
    EpisodeRecord,
    append_record_csv,
    bootstrap_ci,
    loss_outcome,
    markdown_table,
    outcome_of,
    paired_differences,
    read_records_csv,
    summarize,
    summary_json,
    wilcoxon_p,
    write_records_csv,
)


def _record(controller, index, outcome, *, total_params=100_000, seed_params=0,
            episode_return=None, curve=None, episode_rng_seed=None, host="baseline"):
    curve = (50.0, outcome - 1.0, outcome, outcome + 1.0) if curve is None else curve
    return EpisodeRecord(
        controller=controller,
        episode_index=index,
        episode_rng_seed=1000 + index if episode_rng_seed is None else episode_rng_seed,
        host=host,
        outcome=outcome,
        final_accuracy=curve[-1],
        seed_params=seed_params,
        total_params=total_params,
        episode_return=episode_return,
        accuracy_curve=tuple(curve),
        seeds_germinated=2,
        seeds_fossilized=1,
        seeds_pruned=1,
        wall_seconds=3.25,
    )


def _paired_table(reference_outcomes, controller_outcomes, name="grower"):
    records = [_record("static", i, float(v)) for i, v in enumerate(reference_outcomes)]
    records += [_record(name, i, float(v), total_params=104_000, seed_params=4_000)
                for i, v in enumerate(controller_outcomes)]
    return records


def _exact_wilcoxon_p(d):
    """Two-sided exact signed-rank p by enumerating every sign assignment (no ties or zeros)."""
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    observed = ranks[d > 0].sum()
    centre = len(d) * (len(d) + 1) / 4
    null = [sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in
            itertools.product([False, True], repeat=len(d))]
    return np.mean(np.abs(np.array(null) - centre) >= abs(observed - centre) - 1e-9)


def _numpy_percentile_bootstrap(x, n_resamples=10_000, confidence=0.95, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return tuple(np.percentile(means, [100 * alpha, 100 * (1 - alpha)]))


def test_outcome_of_is_the_mean_of_the_last_epochs():
    assert outcome_of([10.0, 50.0, 60.0, 62.0, 67.0]) == pytest.approx(63.0)
    assert outcome_of([10.0, 50.0], last=1) == 50.0
    with pytest.raises(ValueError, match="at least 3 epochs, got a curve of 2"):
        outcome_of([10.0, 50.0])
    with pytest.raises(ValueError, match="last must be >= 1"):
        outcome_of([10.0], last=0)


def test_bootstrap_ci_of_constant_samples_is_the_value():
    assert bootstrap_ci([71.5]) == (71.5, 71.5)
    assert bootstrap_ci([0.1] * 7) == (0.1, 0.1)
    for bad, message in [([], "non-empty"), ([1.0, float("nan")], "finite")]:
        with pytest.raises(ValueError, match=message):
            bootstrap_ci(bad)
    with pytest.raises(ValueError, match="confidence must be in"):
        bootstrap_ci([1.0, 2.0], confidence=95)


def test_bootstrap_ci_matches_a_numpy_percentile_bootstrap():
    x = np.array([3.0, 7.5, 1.25, 9.0, 4.0, 6.5])
    for kwargs in [{}, {"n_resamples": 500, "confidence": 0.8, "rng_seed": 7}]:
        expected = _numpy_percentile_bootstrap(x, **kwargs)
        assert bootstrap_ci(x, **kwargs) == pytest.approx(expected, rel=1e-12)


def test_wilcoxon_edge_cases():
    assert wilcoxon_p([0.0, 0.0, 0.0]) == 1.0
    assert wilcoxon_p([2.5]) == 1.0
    assert wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == pytest.approx(2 / 2**6)
    # Below six pairs even unanimous signs cannot reach 5%.
    assert wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 2**5)


def test_identical_controllers_differ_by_exactly_zero():
    outcomes = np.random.default_rng(0).normal(70.0, 3.0, size=8)
    records = _paired_table(outcomes, outcomes, name="twin")
    (comparison,) = paired_differences(records, reference="static")
    assert comparison.controller == "twin" and comparison.reference == "static"
    assert comparison.outcome_diff_mean == 0.0
    assert comparison.outcome_diff_ci == (0.0, 0.0)
    assert comparison.p_value == 1.0
    assert comparison.verdict == "no detectable difference at 8 seeds"
    assert comparison.total_params_diff_mean == 4_000.0
    assert comparison.total_params_diff_ci == (4_000.0, 4_000.0)


@pytest.mark.parametrize(("shift", "expected"), [(5.0, "better"), (-5.0, "worse")])
def test_clear_differences_get_a_verdict(shift, expected):
    rng = np.random.default_rng(1)
    reference = rng.normal(70.0, 3.0, size=10)
    controller = reference + shift + rng.normal(0.0, 0.5, size=10)
    (comparison,) = paired_differences(_paired_table(reference, controller))
    assert comparison.verdict == expected
    assert comparison.outcome_diff_mean == pytest.approx(np.mean(controller - reference))
    assert comparison.p_value == pytest.approx(2 / 2**10)  # unanimous signs, exact test
    low, high = comparison.outcome_diff_ci
    assert low < comparison.outcome_diff_mean < high and (low > 0 or high < 0)


def test_noisy_small_difference_is_not_detected():
    reference = np.random.default_rng(2).normal(70.0, 3.0, size=10)
    noise = np.array([3.0, -2.9, 2.4, -2.6, 0.5, -1.1, 1.6, -2.0, 2.2, -0.7])
    (comparison,) = paired_differences(_paired_table(reference, reference + 0.2 + noise))
    low, high = comparison.outcome_diff_ci
    assert low < 0.0 < high
    assert comparison.p_value > 0.05
    assert comparison.verdict == "no detectable difference at 10 seeds"


def test_too_few_pairs_get_no_verdict_even_when_the_interval_excludes_zero():
    reference = np.full(MIN_PAIRS_FOR_VERDICT, 70.0)
    steps = np.arange(MIN_PAIRS_FOR_VERDICT, dtype=float)
    (few,) = paired_differences(_paired_table(reference[:3], reference[:3] + 5.0 + steps[:3]))
    assert few.outcome_diff_ci[0] > 0.0
    assert few.verdict == "no detectable difference at 3 seeds"
    (enough,) = paired_differences(_paired_table(reference, reference + 5.0 + steps))
    assert enough.verdict == "better"


def test_summary_ci_and_wilcoxon_match_a_hand_computation():
    reference = np.array([68.0, 71.5, 66.25, 73.0, 70.5, 69.0, 72.25, 67.75])
    d_wanted = np.array([2.1, -0.4, 3.3, 1.7, -1.2, 2.8, 0.9, 4.5])  # distinct |d|, no zero
    controller = reference + d_wanted
    records = _paired_table(reference, controller)
    d = controller - reference  # the same float operations as the module

    (comparison,) = paired_differences(records)
    assert comparison.outcome_diff_ci == pytest.approx(_numpy_percentile_bootstrap(d), rel=1e-12)
    assert comparison.p_value == pytest.approx(_exact_wilcoxon_p(d), rel=1e-12)
    # W- = 1 + 3 = 4; seven of the 2**8 signings have W- <= 4 ({}, 1, 2, 3, 4, 1+2, 1+3).
    assert comparison.p_value == pytest.approx(2 * 7 / 256)

    static, grower = summarize(records)
    assert grower.outcome_mean == pytest.approx(controller.mean())
    assert grower.outcome_ci == pytest.approx(_numpy_percentile_bootstrap(controller), rel=1e-12)
    assert static.outcome_ci == pytest.approx(_numpy_percentile_bootstrap(reference), rel=1e-12)


def test_summarize_reports_params_returns_and_final_accuracy():
    records = [_record("static", i, 70.0 + i) for i in range(4)]
    records += [_record("ppo", i, 72.0 + i, total_params=100_000 + 1_000 * i,
                        seed_params=1_000 * i, episode_return=float(i)) for i in range(4)]
    static, ppo = summarize(records)
    assert (static.controller, static.n_episodes) == ("static", 4)
    assert static.return_mean is None and static.return_ci is None
    assert static.final_accuracy_mean == pytest.approx(72.5)
    assert static.seed_params_ci == (0.0, 0.0)
    assert ppo.total_params_mean == 101_500.0 and ppo.seed_params_mean == 1_500.0
    assert ppo.return_mean == 1.5
    assert 0.0 <= ppo.return_ci[0] < 1.5 < ppo.return_ci[1] <= 3.0
    mixed = [*records, _record("half", 0, 70.0, episode_return=1.0), _record("half", 1, 70.0)]
    with pytest.raises(ValueError, match="controller 'half' has a return in 1 of 2 episodes"):
        summarize(mixed)


def test_pairing_uses_only_common_episode_indices():
    records = [_record("static", i, 60.0 + i) for i in range(8)]
    records += [_record("ppo", i, 62.0 + i) for i in range(11, 3, -1)]  # 11..4, out of order
    (comparison,) = paired_differences(records)
    assert comparison.episode_indices == (4, 5, 6, 7)
    assert comparison.n_pairs == 4
    assert comparison.outcome_diff_mean == 2.0 and comparison.outcome_diff_ci == (2.0, 2.0)

    disjoint = [_record("static", 0, 60.0), _record("ppo", 1, 61.0)]
    with pytest.raises(ValueError, match="controller 'ppo' shares no episode index with 'static'"):
        paired_differences(disjoint)


def test_pairing_refuses_unlike_episodes_and_duplicates():
    unlike = [_record("static", 0, 60.0), _record("ppo", 0, 61.0, episode_rng_seed=7)]
    with pytest.raises(ValueError, match="episode 0 differs between 'ppo'"):
        paired_differences(unlike)
    duplicated = [_record("static", 0, 60.0), _record("static", 0, 61.0)]
    with pytest.raises(ValueError, match="'static' has two records of episode 0"):
        summarize(duplicated)


def test_pair_selection():
    records = [_record(name, i, 60.0 + k + i) for k, name in enumerate(["static", "a", "b"])
               for i in range(6)]
    default = paired_differences(records)
    assert [(c.controller, c.reference) for c in default] == [("a", "static"), ("b", "static")]
    every = paired_differences(records, pairs="all")
    assert [(c.controller, c.reference, c.outcome_diff_mean) for c in every] == [
        ("a", "static", 1.0), ("b", "static", 2.0), ("b", "a", 1.0)]
    explicit = paired_differences(records, pairs=[("static", "b")])
    assert explicit[0].outcome_diff_mean == -2.0 and explicit[0].verdict == "worse"
    assert paired_differences([_record("static", 0, 60.0)]) == []
    with pytest.raises(ValueError, match="reference controller 'heuristic' has no episodes"):
        paired_differences(records, reference="heuristic")
    with pytest.raises(ValueError, match="unknown pairs 'every'"):
        paired_differences(records, pairs="every")
    with pytest.raises(ValueError, match="controller 'c' has no episodes"):
        paired_differences(records, pairs=[("c", "a")])


def test_record_validation():
    with pytest.raises(ValueError, match=r"seed_params \(5\) exceeds total_params \(4\)"):
        _record("static", 0, 60.0, total_params=4, seed_params=5)
    with pytest.raises(ValueError, match="non-finite"):
        _record("static", 0, float("nan"))
    with pytest.raises(ValueError, match="episode_index must be >= 0"):
        _record("static", -1, 60.0)
    with pytest.raises(ValueError, match="accuracy_curve must have at least one epoch"):
        EpisodeRecord("static", 0, 1, "baseline", 60.0, 60.0, 0, 1, None, (), 0, 0, 0, 1.0)
    assert _record("static", 0, 60.0, curve=[59.0, 60.0]).accuracy_curve == (59.0, 60.0)


def test_csv_round_trip(tmp_path):
    records = [
        _record("static", 0, 0.1 + 0.2, curve=(12.5, 33.33333333333333, 0.30000000000000004)),
        _record("ppo", 0, 61.0, episode_return=-1.0 / 3.0, seed_params=10, total_params=20),
        _record("a, \"quoted\" name", 1, 62.0, curve=(62.0,)),
    ]
    path = tmp_path / "episodes.csv"
    write_records_csv(path, records)
    assert read_records_csv(path) == records
    assert path.read_text().splitlines()[0] == ",".join(FIELDNAMES)
    assert not list(tmp_path.glob("*.tmp"))


def test_atomic_write_keeps_the_old_table_on_failure(tmp_path):
    path = tmp_path / "episodes.csv"
    write_records_csv(path, [_record("static", 0, 60.0)])
    before = path.read_bytes()

    def failing():
        yield _record("static", 1, 61.0)
        raise RuntimeError("runner crashed")

    with pytest.raises(RuntimeError, match="runner crashed"):
        write_records_csv(path, failing())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes.csv"]


def test_append_then_read(tmp_path):
    path = tmp_path / "episodes.csv"
    records = [_record("static", i, 60.0 + i, episode_return=float(i)) for i in range(3)]
    for record in records:
        append_record_csv(path, record)
    assert read_records_csv(path) == records
    assert path.read_text().count("controller,") == 1  # one header
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"malformed records file .*other\.csv: header"):
        append_record_csv(other, records[0])


def test_malformed_files_name_themselves(tmp_path):
    path = tmp_path / "episodes.csv"
    write_records_csv(path, [_record("static", 0, 60.0), _record("static", 1, 61.0)])
    lines = path.read_text().splitlines()
    bad_int = lines[2].replace(",1,1001,", ",one,1001,", 1)
    cases = {
        "bad_int.csv": [lines[0], lines[1], bad_int],
        "short.csv": [lines[0], "static,0,1"],
        "header.csv": ["controller,episode_index", "static,0"],
        "empty.csv": [],
    }
    expected = {
        "bad_int.csv": r"line 3: bad episode_index 'one'",
        "short.csv": "line 2: row has the wrong number of fields",
        "header.csv": "header",
        "empty.csv": "header",
    }
    for name, content in cases.items():
        (tmp_path / name).write_text("\n".join(content) + ("\n" if content else ""))
        with pytest.raises(ValueError, match=f"malformed records file .*{name}: .*{expected[name]}"
                           ) as info:
            read_records_csv(tmp_path / name)
        assert "\n" not in str(info.value)


def test_markdown_and_json_reports():
    rng = np.random.default_rng(3)
    reference = rng.normal(70.0, 3.0, size=8)
    records = _paired_table(reference, reference + 5.0 + rng.normal(0.0, 0.3, size=8))
    records += [_record("ppo|v2", i, float(v), episode_return=0.5)
                for i, v in enumerate(reference + 0.1 * rng.normal(size=8))]
    summaries, comparisons = summarize(records), paired_differences(records)
    text = markdown_table(summaries, comparisons)
    for name in ["static", "grower", "ppo\\|v2"]:
        assert f"| {name} |" in text
    assert "| better |" in text and "| no detectable difference at 8 seeds |" in text
    assert "95% CI" in text and "n/a" in text and "104,000" in text
    assert text.count("\n|---") == 2

    report = json.loads(json.dumps(summary_json(summaries, comparisons)))
    assert [c["controller"] for c in report["controllers"]] == ["static", "grower", "ppo|v2"]
    assert report["controllers"][0]["return_ci"] is None
    assert report["comparisons"][0]["verdict"] == "better"
    assert report["comparisons"][0]["outcome_diff_ci"] == list(comparisons[0].outcome_diff_ci)


def _with_losses(record, losses):
    return dataclasses.replace(record, loss_curve=tuple(losses))


def test_losses_round_trip_and_tables_without_them_still_read_and_grow(tmp_path):
    with_loss = _with_losses(_record("static", 0, 60.0), (2.5, 2.25, 2.0, 1.0 / 3.0))
    path = tmp_path / "episodes.csv"
    write_records_csv(path, [with_loss])
    assert read_records_csv(path) == [with_loss]
    # A table written before losses were recorded: read without them, appended to as it is.
    legacy = tmp_path / "legacy.csv"
    rows = path.read_text().splitlines()
    cut = [line.rsplit(",", 1)[0] for line in rows]
    assert rows[0].endswith(",loss_curve") and ",".join(LEGACY_FIELDNAMES) == cut[0]
    legacy.write_text("\n".join(cut) + "\n")
    append_record_csv(legacy, _with_losses(_record("static", 1, 61.0), (1.0,) * 4))
    assert legacy.read_text().splitlines()[0] == cut[0]
    assert [r.loss_curve for r in read_records_csv(legacy)] == [(), ()]
    with pytest.raises(ValueError, match="loss_curve has 2 epochs, accuracy_curve 4"):
        _with_losses(_record("static", 0, 60.0), (1.0, 2.0))


def test_validation_losses_are_summarised_and_paired():
    records = []
    for i in range(6):
        records.append(_with_losses(_record("static", i, 60.0), (3.0, 2.0 + i, 2.0 + i, 2.0 + i)))
        records.append(_with_losses(_record("grown", i, 61.0), (3.0, 1.9 + i, 1.9 + i, 1.8 + i)))
    assert loss_outcome(records[1]) == pytest.approx((1.9 + 1.9 + 1.8) / 3)
    static, grown = summarize(records)
    assert static.val_loss_mean == pytest.approx(4.5) and grown.val_loss_mean < 4.5
    (pair,) = paired_differences(records, "static")
    assert pair.val_loss_diff_mean == pytest.approx(-0.4 / 3)
    assert pair.val_loss_diff_ci == pytest.approx((-0.4 / 3, -0.4 / 3))  # constant differences
    text = markdown_table([static, grown], [pair])
    assert "## Validation loss" in text
    assert "| grown | static | 6 | -0.1333 [-0.1333, -0.1333] |" in text
    no_losses = [_record("static", i, 60.0) for i in range(2)]
    assert summarize(no_losses)[0].val_loss_mean is None
    assert "Validation loss" not in markdown_table(summarize(no_losses), [])
