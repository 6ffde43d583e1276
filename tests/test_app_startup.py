"""Fast start: a bad path on the command line (every command's: data, checkpoints, policies,
comparison and study folders, texts and texts too short, documents) is refused in one line before
torch and Lightning load, and importing the package or its torch-free modules loads neither (nor
scipy, matplotlib).

Deterministic checks of what a fresh process has imported, never of how long it took:
``benchmarks/bench_startup.py`` measures the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from esper_lightning.app.cli import check_paths, parse_config
from esper_lightning.data.files import DataError
from esper_lightning.data.locate import FOLDER_NAME, TEST_FILES, TRAIN_FILES
from esper_lightning.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
#: What must not be loaded when a bad path is refused, or when a torch-free module is imported.
HEAVY = ("torch", "lightning", "pytorch_lightning", "torchmetrics", "scipy", "matplotlib")

#: Runs ``main`` on each argument list of ``sys.argv[1]`` (JSON) in this one process and prints,
#: per case, its status, its stderr and the heavy packages loaded so far.
RUN_CASES = """
import contextlib, io, json, sys
from esper_lightning.app.cli import main
heavy = json.loads(sys.argv[2])
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(heavy))
    print(json.dumps({"argv": argv, "status": status, "stderr": err.getvalue(),
                      "loaded": loaded}))
"""


def run_cases(cases: list[list[str]]) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", RUN_CASES, json.dumps(cases), json.dumps(HEAVY)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


#: A study's plan (`app.frontier.plan`): a study folder the path checks accept.
PLAN = {"name": "tiny", "purpose": "tuning", "base_flops": 2e7, "budgets": [1, 2],
        "warmup_flops": 2e6, "arms": [{"arm": "S2", "lr": 1e-2}], "episodes": 1, "rng_seed": 5,
        "shape": {"width": 8, "n_head": 2, "block_size": 8, "batch_size": 4}}


def played_comparison(root: Path) -> Path:
    """A folder the lookup's path checks accept: a budgeted comparison's settings and an
    (empty: only its content needs torch to read) episodes table."""
    root.mkdir()
    (root / "compare_config.json").write_text(json.dumps(
        {"task": "lm", "host_preset": "grow2", "slots": ["r1c0"], "budget_steps": 40,
         "budget_scales": [1.0, 4.0]}))
    (root / "episodes.csv").touch()
    return root


def test_bad_paths_are_one_line_before_torch_loads(tmp_path):
    missing = tmp_path / "absent"
    study, compared = tmp_path / "study", played_comparison(tmp_path / "compared")
    study.mkdir()
    (study / "plan.json").write_text(json.dumps(PLAN))
    (tmp_path / "ckpt.pt").write_bytes(b"an earlier run's checkpoint")
    short = tmp_path / "texts" / "short.txt"  # a folder apart: tmp_path holds no text
    short.parent.mkdir()
    short.write_text("A text shorter than one block.\n")  # 31 bytes: 28, 1 and 2 in its parts
    cases = {  # argv -> what the one line must name
        ("ppo", "--data-dir", f"{missing}/cifar"): f"CIFAR-10 not found in '{missing}/cifar'",
        ("ppo", "--preset", "lm-smoke", "--data-dir", f"{missing}/missing.txt"):
            f"text file or folder '{missing}/missing.txt' not found; pass a text file",
        ("ppo", "--resume", f"{missing}/ckpt.pt"):
            f"checkpoint '{missing}/ckpt.pt' does not exist",
        ("ppo", "--task", "lm", "--data-dir", str(tmp_path)): "holds no *.txt file",
        ("ppo", "--preset", "lm-smoke", "--data-dir", str(short)):
            f"text file '{short}' is too short for block_size=32: its training head holds 28",
        ("compare", "--preset", "lm-smoke", "--data_dir", str(short), "--block_size", "8"):
            "too short for block_size=8: its validation split holds 1 of its 31 bytes",
        ("ppo", "--data-dir", str(cifar_folder(tmp_path)), "--save", f"{tmp_path}/ckpt.pt"):
            f"save '{tmp_path}/ckpt.pt' already exists; pass --resume",
        ("ppo", "--init_policy", f"{missing}/p.pt", "--data-dir", str(cifar_folder(tmp_path))):
            f"init_policy '{missing}/p.pt' does not exist; accepted: a PPO checkpoint",
        ("compare", "--controllers", "static", "heuristic", "--data_dir", f"{missing}/nope"):
            f"CIFAR-10 not found in '{missing}/nope'",
        ("ship", f"{missing}/ckpt.pt", "--out", f"{tmp_path}/policy.pt"):
            f"checkpoint '{missing}/ckpt.pt' does not exist; accepted: a PPO checkpoint",
        ("ship", str(tmp_path), "--out", f"{tmp_path}/policy.pt"):
            f"checkpoint '{tmp_path}' is a folder",
        ("compare", "--controllers", "static", f"policy:{missing}/p.pt", "--data_dir",
         str(cifar_folder(tmp_path))): f"'{missing}/p.pt' does not exist; accepted: policy:PATH",
        ("lookup", f"{missing}/cmp", "--out", "o.json"):
            f"comparison folder '{missing}/cmp' does not exist",
        ("lookup", str(compared), str(tmp_path), "--out", "o.json"):
            f"'{tmp_path}' holds no comparison (no compare_config.json)",
        ("lookup", str(compared), "--out", str(tmp_path)): f"--out '{tmp_path}' is a folder",
        ("frontier", "run", f"{missing}/study", "--text", f"{missing}/t.txt"):
            f"plan '{missing}/study/plan.json' not found",
        ("frontier", "run", str(study), "--text", f"{missing}/t.txt"):
            f"text file or folder '{missing}/t.txt' not found",
        ("frontier", "run", str(study), "--text", str(short)):
            "too short for block_size=8: its validation split holds 1 of its 31 bytes",
        ("frontier", "select", f"{missing}/study"): f"plan '{missing}/study/plan.json' not found",
        ("frontier", "report", str(study), "--with", f"{missing}/other"):
            f"plan '{missing}/other/plan.json' not found",
        ("frontier", "report", str(study), "--docs", f"{missing}/results.md"):
            f"--docs '{missing}/results.md' is not a file",
        ("frontier", "widths", f"{study}+{missing}/joined", str(study)):
            f"plan '{missing}/joined/plan.json' not found",
        ("frontier", "widths", str(study), "--tuning", f"{missing}/tuning"):
            f"plan '{missing}/tuning/plan.json' not found",
    }
    results = run_cases([list(argv) for argv in cases])
    assert len(results) == len(cases)
    for result, text in zip(results, cases.values(), strict=True):
        lines = [line for line in result["stderr"].splitlines() if line.strip()]
        assert result["status"] == 2, result
        assert len(lines) == 1 and "Traceback" not in result["stderr"], result
        assert text in lines[0], result
        assert lines[0].startswith(f"esper-lightning {result['argv'][0]}: error: "), result
        assert result["loaded"] == [], result


def test_the_command_itself_exits_2_with_one_line(tmp_path):
    # The console entry point as a user runs it: the exit status is the process's.
    done = subprocess.run([sys.executable, "-m", "esper_lightning.app.cli", "ppo", "--resume",
                           str(tmp_path / "no.pt")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "does not exist" in done.stderr


IMPORT_ONLY = """
import json, sys
import esper_lightning, esper_lightning.data, esper_lightning.data.files
import esper_lightning.data.locate, esper_lightning.app.cli, esper_lightning.envs.task_specs
from esper_lightning.data import DataError, find_text_file
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[1])))))
"""


def test_package_and_cli_import_nothing_heavy():
    done = subprocess.run([sys.executable, "-c", IMPORT_ONLY, json.dumps(HEAVY)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def cifar_folder(root: Path) -> Path:
    """A folder the presence check accepts: every batch file there (empty: only their
    contents need torch to read)."""
    folder = root / "cifar" / FOLDER_NAME
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*TRAIN_FILES, *TEST_FILES):
        (folder / name).touch()
    return folder.parent


def test_present_data_and_downloads_pass(tmp_path):
    check_paths(parse_config("ppo", ["--data_dir", str(cifar_folder(tmp_path))]))
    text = tmp_path / "plays.txt"
    text.write_text("To be, or not to be\n" * 40)  # 720, 40 and 40 bytes: a block of 32 each
    check_paths(parse_config("ppo", ["--preset", "lm-smoke", "--data_dir", str(text)]))
    # Nothing there yet, but the run downloads it: nothing to refuse.
    check_paths(parse_config("ppo", ["--data_dir", str(tmp_path / "new"), "--download"]))


def test_default_data_folder_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("ESPER_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="CIFAR-10 not found in"):
        check_paths(parse_config("ppo", []))


def test_partial_cifar_copy_names_its_missing_files(tmp_path):
    folder = cifar_folder(tmp_path)
    (folder / FOLDER_NAME / "data_batch_3").unlink()
    with pytest.raises(DataError, match=r"\(missing data_batch_3\)"):
        check_paths(parse_config("ppo", ["--data_dir", str(folder)]))


def test_resumed_run_does_not_check_init_policy(tmp_path):
    # A resumed run takes its weights from the checkpoint: its old init_policy may be gone.
    config = parse_config("ppo", ["--data_dir", str(cifar_folder(tmp_path))])
    object.__setattr__(config, "init_policy", str(tmp_path / "gone.pt"))
    with pytest.raises(ConfigError, match="init_policy"):
        check_paths(config)
    object.__setattr__(config, "resume", str(tmp_path / "ckpt.pt"))
    check_paths(config)


def test_data_package_is_lazy_and_complete():
    import esper_lightning.data as data

    assert set(data._LAZY) == set(data.__all__)
    assert data.DataError is DataError
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = data.nope
