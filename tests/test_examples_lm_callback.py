"""examples/lm_callback.py (a GPT grown in a plain Trainer, LightningCLI) on a tiny text fixture,
in process."""

from __future__ import annotations

import pytest
from helpers import example_module
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.fixture
def example():
    with example_module("lm_callback") as module:
        yield module


def test_trains_logs_loss_perplexity_and_morpho_tags(example, text_file, tmp_path, capsys):
    timeline = tmp_path / "timeline.png"
    status = example.main([
        "--text", str(text_file.parent), "--epochs", "2", "--data.block_size", "16",
        "--data.batch_size", "8", "--data.train_blocks", "32", "--data.val_blocks", "8",
        "--logdir", str(tmp_path / "runs"), "--timeline", str(timeline),
        "--trainer.enable_progress_bar", "false",
    ])
    out = capsys.readouterr().out
    assert status == 0 and "validation perplexity" in out and "seeds germinated" in out
    assert timeline.read_bytes()[:4] == b"\x89PNG"
    run = tmp_path / "runs" / "version_0"  # --logdir is the run's folder, not nested deeper
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["version_0"]
    assert (run / "config.yaml").read_text().count("block_size: 16") == 1
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"val_loss", "val_ppl", "val_acc", "morpho/seeds_germinated",
            "morpho/r0c0/stage"} <= tags
    assert "hp_metric" not in tags
    loss, ppl = events.Scalars("val_loss")[-1].value, events.Scalars("val_ppl")[-1].value
    assert ppl == pytest.approx(2.718281828 ** loss, rel=1e-4)
    assert f"validation loss        {loss:.4f} per token" in out


def test_missing_text_is_one_line(example, tmp_path, capsys):
    status = example.main(["--text", str(tmp_path / "nothing.txt"), "--epochs", "1",
                           "--logdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
    status = example.main(["--epochs", "1", "--logdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert status == 2 and err == ("error: no text to learn: pass --text FILE (a text file or a "
                                   "folder holding one) or --data.download true (TinyStories)\n")


def test_text_shorter_than_a_block_is_one_line(example, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("Far too short for a block of 64 bytes.\n")
    status = example.main(["--text", str(short), "--epochs", "1",
                           "--trainer.enable_progress_bar", "false",
                           "--logdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: text file '{short}' is too short for block_size=64")
    assert not (tmp_path / "runs").exists()
