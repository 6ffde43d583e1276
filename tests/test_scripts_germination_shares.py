"""scripts/germination_shares.py: germinations by blueprint per round from a PPO run's console
logs (a resumed round counted once), its TensorBoard tags and the CSV it writes."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import script_module
from torch.utils.tensorboard import SummaryWriter


@pytest.fixture(scope="module")
def gs():
    with script_module("germination_shares") as module:
        yield module


def _line(r: int, env: int, blueprint: str, kind: str = "germinated") -> str:
    return f"12:00:00 [round {r} env {env}] epoch 3: r1c0 {kind} {blueprint} (ppo)"


FIRST_SITTING = "\n".join([
    _line(1, 0, "block_identity"), _line(1, 1, "lora"), _line(1, 1, "lora", "fossilized"),
    "12:01:00 round 1/3: final accuracy 40.00%, return -270.000, ops wait=1, 60.0 s",
    # Round 2 is interrupted: these two germinations are played again after the resume.
    "rounds:  33%|###   | 1/3 [01:00<?, ?it/s]" + _line(2, 0, "mlp"), _line(2, 1, "mlp"),
])
SECOND_SITTING = "\n".join([
    _line(2, 0, "block_random"),
    "12:03:00 round 2/3: final accuracy 41.00%, return -269.000, ops wait=1, 60.0 s",
    _line(3, 0, "norm"),  # round 3 never finished: not counted
])


def test_a_round_played_again_after_a_resume_counts_once(gs, tmp_path, capsys):
    (tmp_path / "a.log").write_text(FIRST_SITTING)
    (tmp_path / "b.log").write_text(SECOND_SITTING)
    rounds = gs.from_logs([tmp_path / "a.log", tmp_path / "b.log"])
    assert rounds == {1: Counter(block_identity=1, lora=1), 2: Counter(block_random=1)}
    assert gs.main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--window", "2",
                    "--csv", str(tmp_path / "g.csv")]) == 0
    table = capsys.readouterr().out
    # Two growth germinations (block_identity, block_random) of three.
    assert "| 1–2 | 3 | 2 | 67% |" in table and "2 rounds (1–2)" in table
    assert gs.read([tmp_path / "g.csv"]) == rounds
    assert (tmp_path / "g.csv").read_text().splitlines()[0] == (
        "round,block_identity,block_random,lora")


def test_tensorboard_tags_give_the_same_rounds(gs, tmp_path):
    writer = SummaryWriter(str(tmp_path / "run"))
    for step, (r, counts) in enumerate([(1, {"lora": 2, "block_copy": 0}),
                                        (2, {"lora": 0, "block_copy": 3})]):
        writer.add_scalar("charts/round", float(r), 4 * (step + 1))
        for blueprint, n in counts.items():
            writer.add_scalar(f"germinated/{blueprint}", float(n), 4 * (step + 1))
    writer.close()
    rounds = gs.read([tmp_path / "run"])
    assert rounds == {1: Counter(lora=2, block_copy=0), 2: Counter(lora=0, block_copy=3)}
    assert gs.share_lines(rounds, 1)[2:] == ["| 1–1 | 2 | 0 | 0% | lora 2 |",
                                             "| 2–2 | 3 | 3 | 100% | block_copy 3 |"]


def test_bad_sources_are_one_line_and_exit_2(gs, tmp_path, capsys):
    assert gs.main([str(tmp_path / "missing.log")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"germination_shares: error: not a file: {tmp_path / 'missing.log'}; accepted: one "
        "TensorBoard run folder, one CSV, or console logs")
    SummaryWriter(str(tmp_path / "old")).close()
    (tmp_path / "old" / "x").write_text("")
    assert gs.main([str(tmp_path / "old")]) == 2
    assert "has no germinated/<blueprint> tags" in capsys.readouterr().err
    (tmp_path / "empty.log").write_text(_line(1, 0, "lora"))  # a round that never finished
    assert gs.main([str(tmp_path / "empty.log")]) == 2
    assert "no finished round in" in capsys.readouterr().err
