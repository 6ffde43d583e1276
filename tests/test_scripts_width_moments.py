"""scripts/width_moments.py: the paired reset-minus-copy table and its t interval."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "width_moments.py"


def _load():
    spec = importlib.util.spec_from_file_location("width_moments", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paired_difference_and_its_interval(tmp_path, monkeypatch, capsys):
    rows = tmp_path / "rows.csv"
    copy, reset = [1.0, 2.0, 3.0], [1.1, 2.3, 3.2]  # differences 0.1, 0.3, 0.2
    with rows.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["arm", "episode", "validation_nats"])
        writer.writeheader()
        for episode, (a, b) in enumerate(zip(copy, reset, strict=True)):
            writer.writerow({"arm": "G1w32-1w64@0.1:identity", "episode": episode,
                             "validation_nats": a})
            writer.writerow({"arm": "G1w32-1w64@0.1:identity+reset", "episode": episode,
                             "validation_nats": b})
    monkeypatch.setattr(sys, "argv", ["width_moments.py", "--rows", str(rows)])
    _load().main()
    out = capsys.readouterr().out
    assert "| 1 | 2.0000 | 2.3000 | +0.3000 |" in out
    # Mean 0.2, sd 0.1, t(0.975, 2) = 4.3027: half-width 0.2484.
    mean, low, high = 0.2, 0.2 - 0.2484, 0.2 + 0.2484
    assert f"reset − copy: {mean:+.4f} nats [{low:+.4f}, {high:+.4f}]" in out
