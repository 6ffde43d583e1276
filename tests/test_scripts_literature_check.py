"""scripts/literature_check.py: the mid-run readings of a study's curves, per arm and budget."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from helpers import script_module
from test_app_frontier_estimators import AHEAD, LONG_AHEAD, STABLE_BEHIND, _curved_study


def test_each_reading_has_its_closed_form_and_the_long_runs_end_beside_the_frontiers(
        monkeypatch, capsys):
    """The estimators' synthetic study (every reading known in closed form): the script prints
    them per budget, and each size's long-run end beside its frontier-schedule end."""
    rows = _curved_study(shift=lambda e: 0.01 * (e - 1))
    for row in rows:
        row["validation_nats"] = row["test_nats"]
    with script_module("literature_check") as module:
        monkeypatch.setattr(module, "read_study", lambda folder: (SimpleNamespace(
            purpose="tuning", decay_fraction=0.2), rows))
        monkeypatch.setattr(sys, "argv", ["literature_check.py", "study"])
        module.main()
    out = capsys.readouterr().out
    arm = "G1-2@0.5:identity"
    stable = AHEAD * STABLE_BEHIND
    at_1 = (f"| {arm} | 1 | 3 | {LONG_AHEAD:.2f}× [{LONG_AHEAD:.2f}, {LONG_AHEAD:.2f}] | "
            f"{stable:.2f}× [{stable:.2f}, {stable:.2f}] | {AHEAD:.2f}× [{AHEAD:.2f}, "
            f"{AHEAD:.2f}] | 1.00× [1.00, 1.00] |")
    assert at_1 in out
    assert f"| {arm} | 8 | 3 | ≥ 2.00× | ≥ 1.50× |" in out  # past the long and stable runs
    assert "- S2 at 16× base, 3 episodes: frontier schedule" in out
    assert f"- {arm} at 16× base" not in out  # no frontier row of the arm at 16x to set beside
