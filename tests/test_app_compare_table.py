"""The episode table (`app.compare.table`): records as one DataFrame, and the group-bys the
report's sections read (per controller, per budget, side by side, paired)."""

from __future__ import annotations

import numpy as np
import pytest

from esper_lightning.app.compare.records import EpisodeRecord
from esper_lightning.app.compare.table import (
    RECORD,
    by_budget,
    by_controller,
    episode_table,
    pair_episodes,
    records_by_controller,
    records_of,
    shared,
    side_by_side,
)


def record(controller: str, index: int, bits: float | None, budget: float | None = None,
           host: str = "grow2", rng_seed: int | None = None) -> EpisodeRecord:
    return EpisodeRecord(controller, index, 100 + index if rng_seed is None else rng_seed, host, {
        "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0, "total_params": 1000,
        "accuracy_curve": (50.0, 51.0), "seeds_germinated": 0, "seeds_fossilized": 0,
        "seeds_pruned": 0, "wall_seconds": 1.0, "final_bits": bits, "test_bits": bits,
        "budget_flops": budget})


def played(order: list[tuple[str, int]]) -> list[EpisodeRecord]:
    """Records in the given (controller, index) order, each with bits of its own."""
    rng = np.random.default_rng(3)
    return [record(c, i, float(rng.normal(2.0, 0.1))) for c, i in order]


def test_the_table_holds_every_value_as_recorded():
    records = [record("a", 0, 2.0), record("b", 0, None)]
    table = episode_table(records)
    assert list(table["controller"]) == ["a", "b"]
    assert table["test_bits"].tolist() == [2.0, None]  # a missing value stays None, not NaN
    assert table["test_bits"].tolist()[1] is None
    assert table["accuracy_curve"].tolist() == [(50.0, 51.0)] * 2
    assert records_of(table) == records
    assert episode_table(table) is table  # a table is taken as it is


def test_controllers_in_order_of_first_appearance_and_episodes_ascending():
    records = played([("b", 2), ("a", 1), ("b", 0), ("a", 0), ("b", 1)])
    groups = by_controller(records)
    assert list(groups) == ["b", "a"]
    assert groups["b"]["episode_index"].tolist() == [0, 1, 2]
    assert [r.episode_index for r in records_by_controller(records)["a"]] == [0, 1]
    by_index = {(r.controller, r.episode_index): r["test_bits"] for r in records}
    assert groups["b"]["test_bits"].tolist() == [by_index["b", i] for i in (0, 1, 2)]


def test_a_repeated_episode_or_no_records_are_refused():
    with pytest.raises(ValueError, match="controller 'a' has two records of episode 1"):
        by_controller(played([("a", 1), ("b", 1), ("a", 1)]))
    with pytest.raises(ValueError, match="no episode records to compare"):
        by_controller([])
    with pytest.raises(ValueError, match="no episode records to compare"):
        by_budget([])


def test_budgets_smallest_first_rows_in_table_order():
    records = [record("a", 0, 1.0, 4e12), record("a", 1, 1.0, 1e12), record("b", 1, 1.0, 1e12),
               record("b", 0, 1.0, 4e12)]
    groups = by_budget(records)
    assert list(groups) == [1e12, 4e12]
    assert [(r.controller, r.episode_index) for r in records_of(groups[4e12])] == [
        ("a", 0), ("b", 0)]
    assert list(by_budget([record("a", 0, 1.0)])) == [None]


def test_budgets_known_in_some_rows_or_twice_for_one_episode_are_refused():
    with pytest.raises(ValueError, match="known in 1 of 2 records"):
        by_budget([record("a", 0, 1.0, 1e12), record("a", 1, 1.0)])
    with pytest.raises(ValueError,
                       match=r"episode 0 has two budgets: 1000000000000.0 and 2000000000000.0"):
        by_budget([record("a", 0, 1.0, 1e12), record("b", 0, 1.0, 2e12)])


def test_side_by_side_keeps_the_episodes_every_arm_played():
    records = played([("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("a", 2), ("c", 2),
                      ("b", 2), ("c", 1)])
    records = [r for r in records if (r.controller, r.episode_index) != ("c", 1)]
    wide = shared(records, ["c", "a"], "g", "test_bits")
    assert list(wide.columns) == ["c", "a"]
    assert wide.index.tolist() == [0, 2]
    by_index = {(r.controller, r.episode_index): r["test_bits"] for r in records}
    assert wide["a"].tolist() == [by_index["a", 0], by_index["a", 2]]
    assert side_by_side(records, ["a", "missing"], "test_bits") is None


def test_shared_names_the_group_in_its_errors():
    records = played([("a", 0), ("b", 1)])
    with pytest.raises(ValueError, match="group 'g': 'z' has no episodes"):
        shared(records, ["a", "z"], "g", "test_bits")
    with pytest.raises(ValueError, match="group 'g': no episode that every one of a, b played"):
        shared(records, ["a", "b"], "g", "test_bits")


def test_pairing_joins_on_the_episode_index_in_the_controllers_order():
    groups = by_controller(played([("a", 2), ("a", 0), ("b", 0), ("b", 1), ("b", 2)]))
    joined = pair_episodes(groups["a"], groups["b"])
    assert joined["episode_index"].tolist() == [0, 2]
    assert joined["controller_ref"].tolist() == ["b", "b"]
    assert [r.controller for r in joined[f"{RECORD}_ref"]] == ["b", "b"]


def test_pairing_refuses_unlike_or_disjoint_episodes():
    groups = by_controller([record("a", 0, 1.0), record("b", 0, 1.0, rng_seed=7),
                            record("c", 1, 1.0)])
    with pytest.raises(ValueError, match=r"episode 0 differs between 'a' \(rng seed 100"):
        pair_episodes(groups["a"], groups["b"])
    with pytest.raises(ValueError, match="'a' shares no episode index with 'c'"):
        pair_episodes(groups["a"], groups["c"])
