"""`app.compare.growth`: when each arm grew, read from the seeds it germinated per epoch."""

import json
from types import SimpleNamespace

import pytest

from esper_lightning.app.compare.growth import (
    as_json,
    episode_growth_times,
    growth_rows,
    growth_times,
    markdown,
)
from esper_lightning.app.compare.records import EpisodeRecord, germinated_curve


def record(controller, index, seeds, budget=8.0, blueprints="block_identity"):
    """An episode of ``len(seeds)`` epochs (``seeds``: germinated so far at each), each
    spending an equal share of ``budget`` FLOPs; ``blueprints`` names each seed in order (one
    name for all; None: not recorded)."""
    flops = tuple(budget * (t + 1) / len(seeds) for t in range(len(seeds)))
    if isinstance(blueprints, str):
        blueprints = [blueprints] * (seeds[-1] if seeds else 0)
    named = None if blueprints is None else tuple((f"r1c{i}", b) for i, b in enumerate(blueprints))
    return EpisodeRecord(controller, index, 100 + index, "grow124", {
        "outcome": 0.0, "final_accuracy": 50.0, "total_params": 100, "seed_params": 0,
        "accuracy_curve": (50.0,) * len(seeds), "seeds_germinated": 0, "seeds_fossilized": 0,
        "seeds_pruned": 0, "wall_seconds": 1.0, "budget_flops": budget,
        "train_flops_curve": flops, "germinated_curve": tuple(map(float, seeds)),
        "germinated_seeds": named})


def test_a_growth_is_dated_by_the_decision_before_the_rise():
    # Epoch j's report shows the seed germinated at the decision that ended epoch j - 1: the
    # rise at index 2 happened when the FLOPs of index 1 (2 of 5) were spent.
    assert growth_times([0, 0, 1, 1, 2], [1, 2, 3, 4, 5], 5.0) == (0.4, 0.8)
    assert growth_times([1, 1, 1], [1, 2, 3], 3.0) == ()  # implanted before any decision
    assert growth_times([1, 1, 2], [1, 2, 3], 3.0) == (2 / 3,)
    assert growth_times([0, 0, 0], [1, 2, 3], 3.0) == ()
    assert growth_times([0, 2, 2, 2], [1, 2, 3, 4], 4.0) == (0.25, 0.25)  # two at one decision
    # Without a budget: the share of the epochs, the FLOPs not read.
    assert growth_times([0, 1, 1, 1], [], None) == (0.25,)


def test_the_curve_counts_germinations_not_parameters():
    """A gated blend's gate adds parameters and a prune elsewhere removes some: neither is a
    germination; a new seed id is, also where the parameters fall."""
    def report(*seed_ids):
        return SimpleNamespace(slots=tuple(SimpleNamespace(seed_id=i) for i in seed_ids))

    reports = (report(None, None), report("r1c0:seed0", None),  # germinated
               report("r1c0:seed0", None),  # its gate built: more parameters, the same seed
               report(None, "r1c1:seed0"),  # r1c0 pruned as r1c1 germinated: a growth
               report(None, "r1c1:seed0"))
    episode = SimpleNamespace(reports=reports)
    assert germinated_curve(episode) == (0.0, 1.0, 1.0, 2.0, 2.0)
    assert growth_times(germinated_curve(episode), [1, 2, 3, 4, 5], 5.0) == (0.2, 0.6)


def test_growth_times_refuses_curves_that_do_not_match():
    with pytest.raises(ValueError, match="3 germination points against 2 FLOP points"):
        growth_times([0, 1, 2], [1, 2], 2.0)
    with pytest.raises(ValueError, match="budget_flops must be positive, got 0"):
        growth_times([0, 1], [1, 2], 0.0)


def test_rows_count_episodes_and_average_each_growth_per_budget():
    records = [
        record("static", 0, [0] * 8), record("static", 1, [0] * 8, budget=16.0),
        # Budget 8: one episode grows at 3/8 and 6/8, the other once at 5/8.
        record("stack", 0, [0, 0, 0, 1, 1, 1, 2, 2]),
        record("stack", 2, [0, 0, 0, 0, 0, 1, 1, 1]),
        record("stack", 1, [0, 1, 1, 1, 1, 1, 1, 1], budget=16.0),
        record("static", 2, [0] * 8),
    ]
    rows = {(r.budget, r.controller): r for r in growth_rows(records)}
    assert list(rows) == [(8.0, "static"), (8.0, "stack"), (16.0, "static"), (16.0, "stack")]
    stack8 = rows[8.0, "stack"]
    assert (stack8.episodes, stack8.grew) == (2, (0, 1, 1))
    assert stack8.first == (3 / 8 + 5 / 8) / 2 and stack8.second == 6 / 8
    assert rows[16.0, "stack"].first == 1 / 8 and rows[16.0, "stack"].second is None
    assert rows[8.0, "static"].grew == (2, 0, 0) and rows[8.0, "static"].first is None
    text = "\n".join(markdown(list(rows.values())))
    assert "## When each arm grew" in text
    assert "| 8 | stack | 2 | 0 / 1 / 1 | 0.50 | 0.75 |" in text
    assert "| 16 | static | 1 | 1 / 0 / 0 | — | — |" in text
    data = json.loads(json.dumps(as_json(list(rows.values()))))
    assert data[1] == {"controller": "stack", "budget": 8.0, "episodes": 2, "grew": [0, 1, 1],
                       "first": 0.5, "second": 0.75, "blueprints": True}
    assert "†" not in text


def test_only_a_growth_blueprint_grows_and_older_rows_say_they_count_every_germination():
    # A seed implanted before the first decision, then a LoRA at 2/8 and a block at 5/8.
    mixed = record("all", 0, [1, 1, 2, 2, 2, 3, 3, 3],
                   blueprints=["block_identity", "lora", "block_identity"])
    assert episode_growth_times(mixed) == (5 / 8,)
    only_lora = record("all", 1, [0, 1, 1, 1], blueprints=["lora"])
    older = record("timing", 0, [0, 1, 1, 1], blueprints=None)
    rows = {r.controller: r for r in growth_rows([mixed, only_lora, older])}
    assert (rows["all"].grew, rows["all"].first, rows["all"].blueprints) == (
        (1, 1, 0), 5 / 8, True)
    assert (rows["timing"].grew, rows["timing"].blueprints) == ((0, 1, 0), False)
    text = "\n".join(markdown(list(rows.values())))
    assert "| 8 | timing † | 1 | 0 / 1 / 0 | 0.25 | — |" in text
    assert "Rows marked † hold episodes written before `germinated_seeds`" in text
    with pytest.raises(ValueError, match="'all' episode 2: 2 germinated seeds against 1"):
        episode_growth_times(record("all", 2, [0, 1], blueprints=["lora", "lora"]))


def test_a_table_without_the_curve_or_without_growth_says_so():
    old = EpisodeRecord("static", 0, 1, "grow124", {
        **record("static", 0, [0, 0]).values, "germinated_curve": ()})
    assert growth_rows([old, record("stack", 0, [0, 1])]) is None  # a row written before it
    assert markdown(None)[-1].startswith("Not recorded: some episodes have no `germinated_curve`")
    assert as_json(None) is None
    assert markdown(growth_rows([record("static", 0, [0, 0])]))[-1] == (
        "No arm germinated a growth blueprint's seed in any episode.")


def test_a_comparison_reports_the_time_a_stack_arm_grew(tmp_path, text_file, monkeypatch):
    """End to end: a stack arm told to grow at half its budget is reported growing at 0.5
    (decisions every quarter of it), the static arm never."""
    from esper_lightning.app.compare import runner
    from esper_lightning.app.config import CompareConfig

    monkeypatch.setattr(runner.plots, "save_figures", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "_log_tensorboard", lambda *args, **kwargs: None)
    config = CompareConfig(task="lm", host_preset="grow2", slots=("r1c0",), budget_steps=8,
                           episode_length=4, batch_size=8, block_size=16, val_subset=8, envs=2,
                           data_dir=str(text_file), progress=False,
                           controllers=("static", "stack:2@0.5:identity"), seeds=1,
                           rng_seed=4401, out=str(tmp_path / "cmp"))
    runner.Comparison(config).run()
    growth = json.loads((tmp_path / "cmp" / "summary.json").read_text())["growth"]
    assert [(g["controller"], g["grew"], g["first"], g["blueprints"]) for g in growth] == [
        ("static", [1, 0, 0], None, True),
        ("stack:2@0.5:identity", [0, 1, 0], pytest.approx(0.5), True)]
    assert "## When each arm grew" in (tmp_path / "cmp" / "summary.md").read_text()
    assert (tmp_path / "cmp" / "growth_times.png").stat().st_size > 0
