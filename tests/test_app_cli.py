"""The CLI as a user runs it: subprocesses, exit status 2 and one-line errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cifar_ppo.py"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def assert_one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and text in lines[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, request):
    from esper_lightning.data import write_cifar10_fixture

    root = tmp_path_factory.mktemp("cli")
    data = write_cifar10_fixture(root / "data", n_train=64, n_test=32)
    save = root / "ckpt.pt"
    result = run("--preset", "smoke", "--data-dir", str(data), "--rounds", "1",
                 "--episode-length", "3", "--logdir", str(root / "logs"), "--save", str(save),
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    return data, save


def test_smoke_run_writes_checkpoint(checkpoint):
    _, save = checkpoint
    assert save.is_file() and (save.parent / "logs" / "ppo" / "version_0").is_dir()


def test_unknown_config_key(tmp_path, checkpoint):
    config = tmp_path / "bad.json"
    config.write_text('{"envs": 2, "learning_rat": 0.1}')
    assert_one_line_error(run("--config", str(config)), "unknown config key 'learning_rat'")


def test_bad_slot_id(checkpoint):
    data, _ = checkpoint
    assert_one_line_error(run("--preset", "smoke", "--data-dir", str(data), "--slots", "r7c7"),
                          "unknown slot 'r7c7'; accepted: r0c0")


def test_missing_data_folder(tmp_path):
    assert_one_line_error(run("--preset", "smoke", "--data-dir", str(tmp_path / "nope")),
                          "CIFAR-10 not found in")


def test_incompatible_checkpoint_left_untouched(checkpoint, tmp_path):
    data, save = checkpoint
    before = save.read_bytes()
    result = run("--preset", "smoke", "--data-dir", str(data), "--slots", "r0c0",
                 "--resume", str(save), "--save", str(save), "--logdir", str(tmp_path))
    assert_one_line_error(result, "incompatible config: slots=")
    assert save.read_bytes() == before


def test_bad_flag_value():
    assert_one_line_error(run("--envs", "many"), "Expected a <class 'int'>. Got value: many")


def test_lm_task_without_text_is_one_line_offline(tmp_path):
    # No --data-dir: the default data folder holds no text (and nothing is downloaded).
    # PYTHONPATH: this checkout's package, whichever one is installed.
    env = {**os.environ, "ESPER_DATA_DIR": str(tmp_path / "empty"), "PYTHONPATH": str(ROOT)}
    assert_one_line_error(run("--preset", "lm-smoke", env=env),
                          f"text file or folder '{tmp_path / 'empty'}' not found")
