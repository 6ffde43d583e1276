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
