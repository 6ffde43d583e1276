"""scripts/phase_rates.py: the three per-phase checks side by side, per budget and episode."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "phase_rates.py"
FIELDS = ["arm", "episode", "lr", "budget", "validation_nats", "lr_phases"]


def _load():
    spec = importlib.util.spec_from_file_location("phase_rates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    with (folder / "rows.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def test_each_study_at_its_rates_per_episode_and_their_mean(tmp_path, monkeypatch, capsys):
    arm = "G1-4@0.1:identity"
    _write(tmp_path / "w32-tuning", [
        {"arm": arm, "episode": e, "lr": lr, "budget": 1.0, "validation_nats": v,
         "lr_phases": ""} for e, lr, v in ((0, 0.004, 1.8), (1, 0.004, 1.9), (0, 0.008, 1.0))]
        + [{"arm": arm + "+rewarm", "episode": 0, "lr": 0.004, "budget": 1.0,
            "validation_nats": 9.9, "lr_phases": ""},
           {"arm": arm, "episode": 0, "lr": 0.004, "budget": 0.25, "validation_nats": 9.8,
            "lr_phases": ""}])
    _write(tmp_path / "w32-phase-lr", [
        {"arm": arm, "episode": 0, "lr": 0.016, "budget": 1.0, "validation_nats": 1.7,
         "lr_phases": "0.016;0.004"}])
    _write(tmp_path / "w32-phase-steady", [
        {"arm": arm + "+steady", "episode": e, "lr": 0.016, "budget": 1.0,
         "validation_nats": v, "lr_phases": "0.016;0.004"} for e, v in ((0, 1.6), (1, 1.5))])
    module = _load()
    monkeypatch.setattr(module, "ROOT", tmp_path)
    module.main()
    out = capsys.readouterr().out
    # w32-tuning at its tuned single rate only (8e-3 is not 1x's best): mean of 1.8 and 1.9.
    assert "| 1x | one rate | 0.004 throughout | 1.8000 | 1.9000 | 1.8500 |" in out
    assert "| 1x | per phase, re-warmed | 0.016 → 0.004 | 1.7000 |  | 1.7000 |" in out
    assert "| 1x | per phase, steady | 0.016 → 0.004 | 1.6000 | 1.5000 | 1.5500 |" in out
    assert "0.008 throughout" not in out and "9.9" not in out and "9.8" not in out
