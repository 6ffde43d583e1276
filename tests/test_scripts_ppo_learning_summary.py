"""scripts/ppo_learning_summary.py: first rounds against last, from real TensorBoard files and
from the CSV of rounds it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import script_module
from torch.utils.tensorboard import SummaryWriter


@pytest.fixture(scope="module")
def pls():
    with script_module("ppo_learning_summary") as module:
        yield module


def _run(folder: Path, rounds: int = 10, resumed_at: int | None = None) -> dict[str, list]:
    """A PPO-like TensorBoard run: the return rises by 1 a round (noise 0.1), entropy is
    flat; ``resumed_at`` logs that round twice, the first time with a value to be replaced."""
    rng = np.random.default_rng(3)
    values = {"charts/episodic_return": [-280.0 + r + rng.normal(0.0, 0.1)
                                         for r in range(rounds)],
              "losses/entropy": [1.5 + rng.normal(0.0, 0.1) for _ in range(rounds)]}
    writer = SummaryWriter(str(folder))
    for r in range(rounds):
        for tag, v in values.items():
            if r == resumed_at:
                writer.add_scalar(tag, 999.0, r)  # the interrupted round, replayed below
            writer.add_scalar(tag, v[r], r)
    writer.close()
    return values


def test_the_return_rose_and_the_csv_reproduces_the_table(pls, tmp_path, capsys):
    values = _run(tmp_path / "run", resumed_at=4)
    rounds = pls.read_rounds(tmp_path / "run")
    assert list(rounds) == ["charts/episodic_return", "losses/entropy"]
    np.testing.assert_allclose(rounds["charts/episodic_return"],
                               values["charts/episodic_return"], rtol=1e-6)  # float32 in TB
    assert pls.main([str(tmp_path / "run"), "--rounds", "3", "--csv",
                     str(tmp_path / "rounds.csv")]) == 0
    table = capsys.readouterr().out
    (ret,) = [line for line in table.splitlines() if line.startswith("| charts/episodic")]
    assert ret.endswith(" rose |") and "+7.0" in ret  # rounds 7-9 against 0-2: 7 apart
    (ent,) = [line for line in table.splitlines() if line.startswith("| losses/entropy")]
    assert ent.endswith("no detectable change |")
    assert pls.main([str(tmp_path / "rounds.csv"), "--rounds", "3"]) == 0
    again = capsys.readouterr().out
    assert again.splitlines()[:4] == table.splitlines()[:4]


def test_bad_input_is_one_line_and_exit_2(pls, tmp_path, capsys):
    _run(tmp_path / "run", rounds=5)
    assert pls.main([str(tmp_path / "run"), "--rounds", "3"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ppo_learning_summary: error: {tmp_path / 'run'} holds 5 rounds; --rounds 3 needs at "
        "least 6")
    (tmp_path / "other.csv").write_text("x,y\n1,2\n")
    assert pls.main([str(tmp_path / "other.csv")]) == 2
    assert "has no 'round' column" in capsys.readouterr().err
    assert pls.main([str(tmp_path / "missing.txt")]) == 2
    assert "neither a TensorBoard run folder nor a .csv" in capsys.readouterr().err


def test_tags_of_different_lengths_are_refused(pls, tmp_path):
    writer = SummaryWriter(str(tmp_path / "run"))
    for r in range(4):
        writer.add_scalar("charts/episodic_return", float(r), r)
    writer.add_scalar("losses/entropy", 1.0, 0)
    writer.close()
    with pytest.raises(ValueError, match="the tags hold different numbers of rounds"):
        pls.read_rounds(tmp_path / "run")


def _paired_run(folder: Path, returns: list[float], flops: list[float]) -> None:
    writer = SummaryWriter(str(folder))
    for r, (ret, spent) in enumerate(zip(returns, flops, strict=True)):
        writer.add_scalar("charts/episodic_return", ret, r)
        writer.add_scalar("morpho/train_flops", spent, r)
    writer.close()


def test_two_runs_of_one_rng_seed_are_compared_round_by_round(pls, tmp_path, capsys):
    # The budgets swing the return by 20 a round; the second run is 0.5 better in every
    # round: paired by round the difference is exact, where the runs' spreads would hide it.
    flops = [1e11, 8e11, 3e11, 6e11, 2e11, 7e11]
    base = [-280.0 + 20.0 * (i % 2) for i in range(6)]
    _paired_run(tmp_path / "a", base, flops)
    # A grown host overshoots its budget by part of a larger last step: 1e-4 of the FLOPs.
    _paired_run(tmp_path / "b", [b + 0.5 for b in base], [f * 1.0001 for f in flops])
    assert pls.main([str(tmp_path / "a"), "--against", str(tmp_path / "b"), "--csv",
                     str(tmp_path / "a.csv")]) == 0
    table = capsys.readouterr().out
    (ret,) = [line for line in table.splitlines() if line.startswith("| charts/episodic")]
    assert ret == ("| charts/episodic_return | -270.000 | -269.500 | "
                   "+0.500 [+0.500, +0.500] higher |")
    assert "train_flops" not in table  # the pairing's check, not a result
    assert "paired over 6 rounds" in table
    # The CSV it wrote pairs as its run folder did.
    assert pls.main([str(tmp_path / "a.csv"), "--against", str(tmp_path / "b")]) == 0
    assert ret in capsys.readouterr().out


def test_runs_that_drew_different_budgets_are_not_paired(pls, tmp_path, capsys):
    _paired_run(tmp_path / "a", [-1.0, -2.0, -3.0], [1e11, 2e11, 3e11])
    _paired_run(tmp_path / "b", [-1.0, -2.0, -3.0], [1e11, 2.5e11, 3e11])
    _paired_run(tmp_path / "short", [-1.0, -2.0], [1e11, 2e11])
    _run(tmp_path / "no-flops", rounds=3)
    assert pls.main([str(tmp_path / "a"), "--against", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == (
        "ppo_learning_summary: error: round 2 drew different budgets (2e+11 and 2.5e+11 "
        "training FLOPs): not trainings of one --rng_seed")
    assert pls.main([str(tmp_path / "a"), "--against", str(tmp_path / "short")]) == 2
    assert "the runs hold 3 and 2 rounds" in capsys.readouterr().err
    assert pls.main([str(tmp_path / "no-flops"), "--against", str(tmp_path / "a")]) == 2
    assert "lacks morpho/train_flops" in capsys.readouterr().err
