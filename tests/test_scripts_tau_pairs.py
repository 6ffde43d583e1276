"""scripts/tau_pairs.py: each τ's paired difference against τ 0.05 and its t interval."""

from __future__ import annotations

import csv
import sys

from helpers import script_module


def test_the_paired_differences_read_2x_rows_of_the_same_episode(tmp_path, monkeypatch, capsys):
    with script_module("tau_pairs") as module:
        rows = tmp_path / "rows.csv"
        reference = [1.0, 2.0, 3.0]
        shifts = {"G1w32-4w64@0.1:identity": [0.1, 0.3, 0.2],  # mean 0.2, sd 0.1
                  "G1w32-4w64@0.15:identity": [0.5, 0.5, 0.5], "S4": [0.0, 0.0, 0.0]}
        with rows.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["arm", "episode", "budget",
                                                        "validation_nats"])
            writer.writeheader()
            for episode, loss in enumerate(reference):
                writer.writerow({"arm": module.REFERENCE, "episode": episode, "budget": 2.0,
                                 "validation_nats": loss})
                # Another budget of the same arm: not read.
                writer.writerow({"arm": "S4", "episode": episode, "budget": 4.0,
                                 "validation_nats": 99.0})
                for arm, shift in shifts.items():
                    writer.writerow({"arm": arm, "episode": episode, "budget": 2.0,
                                     "validation_nats": loss + shift[episode]})
        monkeypatch.setattr(sys, "argv", ["tau_pairs.py", "--rows", str(rows)])
        module.main()
        reference_arm = module.REFERENCE
    out = capsys.readouterr().out
    assert "| 1 | 2.0000 | 2.3000 | 2.5000 | 2.0000 |" in out
    # t(0.975, 2) = 4.3027, s / sqrt(3) = 0.0577: half-width 0.2484.
    assert (f"G1w32-4w64@0.1:identity − {reference_arm}: +0.2000 nats [-0.0484, +0.4484]"
            in out)
    assert f"G1w32-4w64@0.15:identity − {reference_arm}: +0.5000 nats [+0.5000, +0.5000]" in out
    assert f"S4 − {reference_arm}: +0.0000 nats [+0.0000, +0.0000]" in out
