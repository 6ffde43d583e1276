"""scripts/cosine_frontier.py: a size's long cosine endpoint replaces its WSD point at that
budget only when it ends lower on the mean, and then the speed-ups read against it fall."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import script_module
from test_app_frontier_estimators import _curved_study

from esper_lightning.app.frontier.estimators import estimates, frontier_rows


@pytest.fixture(scope="module")
def cosine():
    with script_module("cosine_frontier") as module:
        yield module


def _long_moved(rows: list[dict], by: float) -> list[dict]:
    """The study with S2's long runs (to 16x) ending ``by`` nats from where they end."""
    return [{**r, "test_nats": r["test_nats"] + by} if r["arm"] == "S2" and r.get("schedule")
            else r for r in rows]


def test_a_lower_cosine_endpoint_lowers_the_frontier_and_the_speedups(cosine):
    rows = _long_moved(_curved_study(shift=lambda e: 0.01 * (e - 1)), -0.05)
    swapped, notes = cosine.cosine_swapped(rows, "test_nats")
    assert len(notes) == 1 and notes[0].startswith("S2 at 16x over 3 episodes: WSD ")
    assert notes[0].endswith("cosine taken")
    wsd = {r["episode"]: r["test_nats"] for r in frontier_rows(rows)
           if r["arm"] == "S2" and r["budget"] == 16.0}
    moved = {r["episode"]: r["test_nats"] for r in swapped
             if r["arm"] == "S2" and r["budget"] == 16.0}
    assert moved == pytest.approx({e: v - 0.05 for e, v in wsd.items()})
    assert len(swapped) == len(frontier_rows(rows))  # the same rows, one point each moved
    before = {e.budget: e for e in estimates(frontier_rows(rows), "test_nats")}
    after = {e.budget: e for e in estimates(swapped, "test_nats")}
    # The arm at 8x ends where S2 ends at 16x: read against the lower point, it is slower by
    # both estimators. Chords are local, so below 8x a piecewise reading does not move; a
    # power law is refitted through every point, so each of its readings may.
    for estimator in ("power", "piecewise"):
        assert getattr(after[8.0], estimator).value < getattr(before[8.0], estimator).value
    assert all(after[b].piecewise.value == pytest.approx(before[b].piecewise.value)
               for b in (1.0, 2.0, 4.0))


def test_a_higher_cosine_endpoint_leaves_the_frontier_as_it_was(cosine):
    rows = _long_moved(_curved_study(), +0.05)
    swapped, notes = cosine.cosine_swapped(rows, "test_nats")
    assert notes[0].endswith("WSD kept") and swapped == frontier_rows(rows)


def test_long_runs_of_other_episodes_are_refused(cosine):
    rows = [r for r in _curved_study() if not (r["arm"] == "S2" and r["budget"] == 16.0
                                               and not r.get("schedule") and r["episode"] == 2)]
    with pytest.raises(SystemExit, match="S2: the long runs' episodes are not its WSD runs'"):
        cosine.cosine_swapped(rows, "test_nats")


def test_the_command_prints_both_tables(cosine, monkeypatch, capsys):
    rows = _long_moved(_curved_study(), -0.05)
    monkeypatch.setattr(cosine, "read_study",
                        lambda folder: (SimpleNamespace(purpose="final"), rows))
    cosine.main(["study"])
    out = capsys.readouterr().out
    assert "Against the frontier's WSD runs" in out and "With the sizes' long cosine" in out
    assert out.count("| G1-2@0.5:identity | 8 |") == 2
