"""scripts/short_run_study.py: rows are written and resumed without duplicates, bad input is one
line with exit 2, and the report's paired difference is right on known numbers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import script_module

from esper_lightning.data import write_cifar10_fixture


@pytest.fixture(scope="module")
def study():
    with script_module("short_run_study") as module:
        yield module


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_rows_are_written_and_resumed_without_duplicates(study, tmp_path, capsys):
    data = write_cifar10_fixture(tmp_path / "data", n_train=64, n_test=32)
    out = tmp_path / "rows.csv"
    argv = ["--data-dir", str(data), "--models", "mlp", "--episodes", "1", "--epochs", "2",
            "--subset", "48", "--batch-size", "16", "--root", "7", "--out", str(out)]
    assert study.main(argv) == 0
    rows = _rows(out)
    assert [(r["model"], r["episode"], r["arm"], r["seed"]) for r in rows] == [
        ("mlp", "0", "plain", "7"), ("mlp", "0", "heuristic", "7")]
    for row in rows:
        assert 0.0 <= float(row["val_acc"]) <= 1.0 and 0.0 <= float(row["test_acc"]) <= 1.0
        assert row["epochs_run"] == "2" and row["threads"] == "1"
    assert rows[0]["germinated"] == "0" and rows[0]["events"] == ""

    assert study.main(argv) == 0  # a restart skips what is there
    assert _rows(out) == rows
    assert "2 rows in" in capsys.readouterr().out

    other = list(argv)
    other[other.index("--epochs") + 1] = "3"  # rows of another length would not pair
    assert study.main(other) == 2
    assert "max_epochs=2, not 3" in capsys.readouterr().err
    assert _rows(out) == rows


@pytest.mark.parametrize("args, message", [
    (["--models", "vgg"], "unknown model 'vgg'"),
    (["--episodes", "0"], "--episodes must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--report", "--out", "/nonexistent/rows.csv"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(study, capsys, args, message):
    assert study.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_missing_data_is_one_line(study, tmp_path, capsys):
    assert study.main(["--data-dir", str(tmp_path / "nothing"), "--out",
                       str(tmp_path / "rows.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "rows.csv").exists()


def _row(study, model: str, episode: int, arm: str, test: float, val: float,
         fossilized: int = 0) -> dict[str, object]:
    row = dict.fromkeys(study.COLUMNS, "")
    row.update(model=model, episode=episode, arm=arm, seed=100 + episode, max_epochs=12,
               subset=2000, batch_size=64, val_acc=val, test_acc=test, epochs_run=12,
               germinated=int(arm == "heuristic"), fossilized=fossilized,
               pruned=int(arm == "heuristic") - fossilized, rollbacks=0, wall_s=1.0, threads=1,
               commit="x")
    if arm == "heuristic" and not fossilized:
        row["events"] = "3:net.2:germinated:mlp_small:plateau | 9:net.2:pruned:mlp_small:" \
                        "contribution -0.71 <= 0.5: prune"
    return row


def test_report_computes_the_paired_difference(study, tmp_path):
    # cnn: differences +1, +2, +3, +4, +5 points: mean +3, t interval 3 ± 2.776 · 1.581/√5.
    # mlp: differences 0, +1, −1: mean 0, no detectable difference.
    out = tmp_path / "rows.csv"
    plain = [0.50, 0.40, 0.60, 0.55, 0.45]
    for e, p in enumerate(plain):
        study.append_row(out, _row(study, "cnn", e, "plain", p, p))
        study.append_row(out, _row(study, "cnn", e, "heuristic", p + (e + 1) / 100, p,
                                   fossilized=int(e < 2)))
    for e, d in enumerate([0.0, 0.01, -0.01]):
        study.append_row(out, _row(study, "mlp", e, "plain", 0.3, 0.3))
        study.append_row(out, _row(study, "mlp", e, "heuristic", 0.3 + d, 0.3))
    study.append_row(out, _row(study, "mlp", 3, "plain", 0.3, 0.3))  # no pair: left out
    summary = tmp_path / "summary.md"
    assert study.main(["--report", "--out", str(out), "--summary", str(summary)]) == 0
    text = summary.read_text()
    cnn = next(line for line in text.splitlines() if line.startswith("| cnn |"))
    cells = [c.strip() for c in cnn.split("|")[1:-1]]
    assert cells[:4] == ["cnn", "5", "2/5 (40 %)", "5/5"]
    assert cells[8:11] == ["50.00", "53.00", "+3.00"]
    assert cells[11] == "[+1.04, +4.96]"  # 3 ± 2.7764 · 1.5811 / √5
    assert cells[12] == "0.062"  # Wilcoxon, five positive differences: 2 / 2**5
    assert cells[13].startswith("no detectable difference at 5 episodes")  # p ≥ 0.05
    assert cells[14:] == ["+0.00", "[+0.00, +0.00]"]  # val: the same in both arms
    mlp = next(line for line in text.splitlines() if line.startswith("| mlp |"))
    cells = [c.strip() for c in mlp.split("|")[1:-1]]
    assert cells[1] == "3" and cells[10] == "+0.00" and cells[11] == "[−2.48, +2.48]"
    assert "1 episode(s) with one arm only are left out" in text
    assert "contribution <= prune ×6" in text


def test_report_says_better_only_when_the_interval_excludes_zero(study):
    result = study.Paired(10, 50.0, 53.0, 3.0, (1.0, 5.0), 0.002)
    assert study._verdict(result, 0.004) == "better"
    assert study._verdict(study.Paired(10, 50.0, 47.0, -3.0, (-5.0, -1.0), 0.002),
                          0.004) == "worse"
    assert study._verdict(study.Paired(10, 50.0, 51.0, 1.0, (-1.0, 3.0), 0.002),
                          0.004).startswith("no detectable difference at 10")
