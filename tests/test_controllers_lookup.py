"""A growth schedule looked up by budget: `GrowthLookup` (its interpolation in log budget, its
file, its refusals) and `LookupController` growing in a real engine at the looked-up time."""

from __future__ import annotations

import json
import math
import re

import pytest
from test_controllers_stack import Episode

from esper_lightning.controllers.lookup import GrowthLookup, LookupController, read_lookup
from esper_lightning.core.actions import LifecycleOp
from esper_lightning.errors import ConfigError

#: Never at half the base budget, 0.4 at the base, 0.2 at twice it.
TABLE = GrowthLookup("identity", 2, ((0.5, None), (1.0, (0.4,)), (2.0, (0.2,))))


@pytest.mark.parametrize(("scale", "taus"), [
    (1.0, (0.4,)), (2.0, (0.2,)),  # tabled budgets: their own times
    (8.0, (0.2,)), (0.1, None),  # outside the table: its nearest budget's
    (2 ** 0.5, (0.3,)), (2 ** 0.25, (0.35,)),  # linear in log2 of the budget
    (2 ** -0.5, (0.7,)), (2 ** -0.75, (0.85,)),  # towards "never" (1.0): later and later
])
def test_the_lookup_interpolates_growth_times_in_log_budget(scale, taus):
    found = TABLE.taus_at(scale)
    assert (found is None) == (taus is None)
    if taus is not None:
        assert found == pytest.approx(taus, abs=1e-12)


def test_several_growth_times_interpolate_one_by_one_and_stay_in_order():
    table = GrowthLookup("identity", 4, ((1.0, (0.2, 0.6)), (4.0, (0.1, 0.3))))
    assert table.slots == 2
    assert table.taus_at(2.0) == pytest.approx((0.15, 0.45))
    never = GrowthLookup("copy", 4, ((1.0, None), (4.0, (0.2, 0.6))))
    assert never.taus_at(2.0) == pytest.approx((0.6, 0.8))  # (1, 1) halfway to (0.2, 0.6)
    assert never.taus_at(1.0) is None
    once = GrowthLookup("identity", 4, ((1.0, (0.4, 1.0)), (4.0, (0.2, 0.6))))
    assert once.taus_at(2.0) == pytest.approx((0.3, 0.8))  # the second slot's never, halfway
    assert once.taus_at(1.0) == (0.4, 1.0)


@pytest.mark.parametrize(("points", "message"), [
    (((2.0, (0.2,)), (1.0, (0.4,))), "distinct budget scales > 0, ascending; got [2.0, 1.0]"),
    (((1.0, (0.2,)), (1.0, (0.4,))), "distinct budget scales > 0, ascending"),
    (((0.0, (0.2,)),), "distinct budget scales > 0"),
    (((1.0, (0.2,)), (2.0, (0.1, 0.3))), "one tau per growth slot at every budget; got [1, 2]"),
    (((1.0, (1.0,)),), "at budget scale 1: taus must be in [0, 1) (a later slot's may be 1: "
                       "never) and not decrease, got [1.0]"),
    (((1.0, (0.5, 0.2)),), "and not decrease, got [0.5, 0.2]"),
    (((1.0, (0.5, 1.5)),), "and not decrease, got [0.5, 1.5]"),
])
def test_a_bad_table_is_refused_in_one_line(points, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        GrowthLookup("identity", 2, points)


def test_the_file_round_trips_and_a_bad_file_is_one_line(tmp_path):
    table = GrowthLookup("identity", 2, TABLE.points, {"episodes": 12})
    path = table.write(tmp_path / "lookups" / "grow2.json")
    assert read_lookup(path) == table and read_lookup(path).tuning == {"episodes": 12}
    with pytest.raises(ConfigError, match=r"growth lookup '.*missing\.json' not found"):
        read_lookup(tmp_path / "missing.json")
    for data, message in (({"kind": "policy"}, "is not a growth lookup (its kind must be "
                                                "'growth-lookup')"),
                          ({**table.to_dict(), "version": 9}, "has version 9; accepted: 1"),
                          ({**table.to_dict(), "points": [{"scale": 1.0}]},
                           "is not a well-formed growth lookup")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=re.escape(message)):
            read_lookup(bad)
    (tmp_path / "cut.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read growth lookup"):
        read_lookup(tmp_path / "cut.json")


def _growth_fractions(scale: float, table: GrowthLookup = TABLE,
                      preset: str = "grow2") -> list[float]:
    """Where a LookupController of ``table`` germinates on ``preset`` at budget ``scale``: the
    spent fractions of its germinations (5 % of the budget per epoch)."""
    episode = Episode(LookupController(table), preset=preset)
    episode.engine.compute.reset(100.0, scale)
    for k in range(1, 20):
        episode.epoch(spent=5.0 * k)
    return [f for f, op, _ in episode.decisions if op == LifecycleOp.GERMINATE]


def test_the_controller_grows_at_the_time_the_budget_looks_up():
    assert _growth_fractions(2.0) == [pytest.approx(0.2)]  # tabled: 0.2
    assert _growth_fractions(2 ** 0.5) == [pytest.approx(0.3)]  # between: 0.3
    assert _growth_fractions(0.5) == []  # never
    assert _growth_fractions(2 ** -0.5) == [pytest.approx(0.7)]  # towards never: late
    # Two growth slots (1 -> 2 -> 4 blocks), the second never at the base budget: one growth.
    # (Times off the 5 % grid: each growth comes at the first decision past its time.)
    once = GrowthLookup("identity", 4, ((1.0, (0.42, 1.0)), (4.0, (0.22, 0.62))))
    assert _growth_fractions(1.0, once, "grow124") == [pytest.approx(0.45)]
    # Halfway in log budget: (0.32, 0.81).
    assert _growth_fractions(2.0, once, "grow124") == [pytest.approx(0.35), pytest.approx(0.85)]


def test_its_state_names_its_table_and_refuses_another():
    controller = LookupController(TABLE)
    state = controller.state_dict()
    assert state["controller"] == "lookup"
    LookupController(TABLE).load_state_dict(json.loads(json.dumps(state)))
    other = GrowthLookup("identity", 2, ((1.0, (0.5,)),))
    with pytest.raises(ValueError, match="the saved lookup controller played another table"):
        LookupController(other).load_state_dict(state)
    assert math.isclose(controller.tau, 0.4)  # the first growing row until a report is read
