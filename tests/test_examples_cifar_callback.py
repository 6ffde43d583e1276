"""examples/cifar_callback.py (LightningCLI) on a tiny CIFAR-format fixture, in process."""

from __future__ import annotations

import pytest
from helpers import ROOT, as_a_process, bad_checkpoints, example_module, run_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.fixture
def example():
    with example_module("cifar_callback") as module:
        yield module


def test_the_readme_flags_train_log_and_draw_the_timeline(example, cifar_dir, tmp_path, capsys):
    timeline = tmp_path / "timeline.png"
    status = example.main([
        "--data-dir", str(cifar_dir), "--epochs", "2", "--logdir", str(tmp_path / "runs"),
        "--timeline", str(timeline), "--data.batch_size", "16",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--morpho.controller", "esper_lightning.controllers.RandomController",
        "--morpho.controller.rng_seed", "3",
    ])
    out = capsys.readouterr().out
    assert status == 0 and "validation accuracy" in out and "seeds germinated" in out
    assert timeline.read_bytes()[:4] == b"\x89PNG"
    run = tmp_path / "runs" / "version_0"  # --logdir is the run's folder, not nested deeper
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["version_0"]
    events = EventAccumulator(str(run), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    assert "morpho/timeline" in events.Tags()["images"]
    assert "hp_metric" not in events.Tags()["scalars"]
    assert (run / "config.yaml").read_text().count("RandomController") == 1


def test_a_missing_data_folder_is_one_line(example, tmp_path, capsys):
    status = example.main(["--data-dir", str(tmp_path / "nothing"), "--epochs", "1",
                           "--logdir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # a failed run leaves no empty version folder


@pytest.mark.parametrize(("epochs", "message"), [
    ("0", "--epochs must be an int >= 1, got 0"),
    ("abc", 'Parser key "epochs": Expected a <class \'int\'>. Got value: abc'),
])
def test_a_bad_epoch_count_is_one_line(example, cifar_dir, tmp_path, capsys, epochs, message):
    status = example.main(["--data-dir", str(cifar_dir), "--epochs", epochs,
                           "--logdir", str(tmp_path / "runs")])
    assert status == 2 and capsys.readouterr().err == f"error: {message}\n"


def test_a_policy_controller_on_a_bad_checkpoint_is_one_line(cifar_dir, tmp_path):
    # ``python examples/cifar_callback.py ...`` as a process of its own sees it (`as_a_process`,
    # `run_script`): a warning on the way (LightningCLI's, jsonargparse's) would be a second
    # line on stderr here, as it would be in a terminal.
    bad = bad_checkpoints(tmp_path / "files")["truncated"]
    before = bad.read_bytes()
    done = as_a_process(run_script(ROOT / "examples" / "cifar_callback.py"), [
        "--data-dir", str(cifar_dir), "--epochs", "1", "--logdir", str(tmp_path / "runs"),
        "--morpho.controller", "esper_lightning.controllers.PolicyController",
        "--morpho.controller.checkpoint", str(bad)])
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error: cannot read checkpoint '{bad}': the file is truncated or "
                           f"damaged (its zip archive does not read to the end); expected a PPO "
                           f"checkpoint written by esper-lightning ppo --save\n")
    assert bad.read_bytes() == before and not (tmp_path / "runs").exists()
