"""scripts/controller_study.sh: the pre-registered command lines and the choices it makes.

The script runs in a copy of the study's layout under ``tmp_path`` with an ``esper-lightning``
on ``PATH`` that writes its arguments down instead of training or playing anything, so what is
checked is the command each stage would run: that it still carries the arms, budgets, episodes
and roots results/controller/final-plan.md fixed before the first episode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, script_module

TIMING = [f"policy:policies/grow124-timing-s{i}.pt" for i in (1, 2, 3)]
LOOKUP = "lookup:results/controller/lookup-grow124.json"
BEST_SINGLE = "stack:4@0.5,1:identity"
FINAL_SCALES = ["0.35", "0.7", "1.4", "2.8"]


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """The study's files as the final stages find them, and a recording esper-lightning."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "controller_study.sh", tmp_path / "scripts")
    (tmp_path / "results" / "controller").mkdir(parents=True)
    (tmp_path / "results" / "controller" / "lookup-grow124.json").write_text(
        json.dumps({"tuning": {"best_single": BEST_SINGLE}}))
    (tmp_path / "policies").mkdir()
    for arm in TIMING:
        (tmp_path / arm.removeprefix("policy:")).write_bytes(b"")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "esper-lightning"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$CALLS"\n')
    fake.chmod(0o755)
    return tmp_path


def _run(study: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PATH": f"{study / 'bin'}:{os.environ['PATH']}",
               "CALLS": str(study / "calls.txt"), **env}
    return subprocess.run(["bash", "scripts/controller_study.sh", *args], cwd=study, env=environ,
                          capture_output=True, text=True, timeout=60)


def _argv(study: Path) -> list[str]:
    return (study / "calls.txt").read_text().splitlines()


def _after(argv: list[str], flag: str) -> list[str]:
    """The values of ``flag``: every argument up to the next flag."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def test_final_budgets_plays_the_plans_arms_budgets_episodes_and_root(study):
    assert _run(study, "final-budgets").returncode == 0
    argv = _argv(study)
    assert argv[0] == "compare" and _after(argv, "--budget_scales") == FINAL_SCALES
    assert _after(argv, "--seeds") == ["40"] and _after(argv, "--rng_seed") == ["32676"]
    assert _after(argv, "--reference") == [LOOKUP]
    assert _after(argv, "--controllers") == [LOOKUP, *TIMING, BEST_SINGLE, "heuristic",
                                             "stack:4@random:identity", "static"]
    assert _after(argv, "--arm_groups") == [f"timing={','.join(TIMING)}"]
    assert "--group_pairs" not in argv  # no nine-blueprint group before its three seeds


def test_the_oracle_is_the_first_16_episodes_on_a_02_grid_with_never(study):
    assert _run(study, "final-oracle").returncode == 0
    argv = _argv(study)
    assert _after(argv, "--seeds") == ["16"] and _after(argv, "--rng_seed") == ["32676"]
    schedules = _after(argv, "--controllers")[4:]
    assert schedules[-1] == "static" and len(schedules) == 15
    times = [s.split("@")[1].split(":")[0].split(",") for s in schedules[:-1]]
    assert all(float(a) <= float(b) for a, b in times) and len({tuple(t) for t in times}) == 14
    assert ["0.2", "1"] in times and ["0.8", "0.8"] in times


def test_the_host_and_text_stages_are_the_plans(study, tmp_path):
    assert _run(study, "final-host").returncode == 0
    argv = _argv(study)
    assert _after(argv, "--host_preset") == ["grow124-w64"]
    assert _after(argv, "--budget_flops") == ["2113929216000"]
    assert _after(argv, "--seeds") == ["16"] and _after(argv, "--rng_seed") == ["32004"]
    assert _after(argv, "--transfer_policies") == ["true"]
    other = tmp_path / "other.txt"  # a text that is not the pre-registered one is refused
    other.write_text("print('hello')\n")
    (study / "calls.txt").unlink()
    result = _run(study, "final-text", STDLIB=str(other))
    assert result.returncode == 2 and "is not the pre-registered text" in result.stderr
    assert not (study / "calls.txt").exists()


def test_a_final_stage_refuses_to_start_without_every_policy(study):
    (study / TIMING[2].removeprefix("policy:")).unlink()
    result = _run(study, "final-budgets")
    assert result.returncode == 2 and "missing policies/grow124-timing-s3.pt" in result.stderr
    assert not (study / "calls.txt").exists()


def test_the_chosen_curriculum_joins_final_budgets_as_a_group_paired_with_timing(study):
    for seed in (1, 2, 3):
        (study / "policies" / f"grow124-all-none-s{seed}.pt").write_bytes(b"")
    (study / "policies" / "grow124-all-s1.pt").write_bytes(b"")  # the other: seed 1 only
    assert _run(study, "final-budgets").returncode == 0
    argv = _argv(study)
    curriculum = [f"policy:policies/grow124-all-none-s{i}.pt" for i in (1, 2, 3)]
    assert _after(argv, "--controllers")[-3:] == curriculum
    assert _after(argv, "--arm_groups") == [f"timing={','.join(TIMING)}",
                                            f"all={','.join(curriculum)}"]
    assert _after(argv, "--group_pairs") == ["all=timing"]
    for seed in (2, 3):  # three seeds of both: ambiguous, refused
        (study / "policies" / f"grow124-all-s{seed}.pt").write_bytes(b"")
    result = _run(study, "final-budgets")
    assert result.returncode == 2 and "three seeds of both curricula" in result.stderr


@pytest.mark.parametrize(("prior_bits", "none_bits", "chosen"), [
    (2.7000, 2.7100, "0.1"), (2.7100, 2.7000, "none")])
def test_chosen_all_is_the_curriculum_with_the_lower_mean_validation_loss(
        study, prior_bits, none_bits, chosen):
    assert _run(study, "chosen-all").returncode == 2  # decide-all not played
    folder = study / "results" / "controller" / "decide-all"
    folder.mkdir()
    rows = [{"controller": TIMING[0], "n_episodes": 20, "final_bits_mean": 2.6},
            {"controller": "policy:policies/grow124-all-s1.pt", "n_episodes": 20,
             "final_bits_mean": prior_bits},
            {"controller": "policy:policies/grow124-all-none-s1.pt", "n_episodes": 12,
             "final_bits_mean": none_bits}]
    (folder / "summary.json").write_text(json.dumps({"controllers": rows}))
    result = _run(study, "chosen-all")
    assert result.returncode == 1 and "{'0.1': 20, 'none': 12}" in result.stderr
    rows[2]["n_episodes"] = 20
    (folder / "summary.json").write_text(json.dumps({"controllers": rows}))
    result = _run(study, "chosen-all")
    assert result.returncode == 0 and result.stdout == f"{chosen}\n"
    assert f"prior 0.1 {prior_bits:.4f}, none {none_bits:.4f}" in result.stderr


def _rows(csv: Path, test_bits: float) -> None:
    """Two episode rows of two arms, as `compare` writes them."""
    from esper_lightning.app.compare.records import EpisodeRecord, append_record_csv

    csv.parent.mkdir(parents=True, exist_ok=True)
    for arm in (LOOKUP, TIMING[0]):
        for episode in (0, 1):
            append_record_csv(csv, EpisodeRecord(arm, episode, 100 + episode, "grow124", {
                "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0, "total_params": 1,
                "seeds_germinated": 0, "seeds_fossilized": 0, "seeds_pruned": 0,
                "wall_seconds": 1.0, "final_bits": 2.5, "test_bits": test_bits,
                "budget_flops": 1e12, "accuracy_curve": (50.0,)}))


#: Stands in for ``python`` on the study's PATH where a case checks the replay in process: the
#: replay check's command line is written to ``$REPLAY`` (and run by the test, in process);
#: every other ``python`` the script runs is the real one.
REPLAY_RECORDER = """#!/usr/bin/env bash
if [[ "${1:-}" == */controller_targets.py ]]; then printf "%s\\n" "$@" > "$REPLAY"; exit 0; fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.parametrize(("rerun_bits", "code", "verdict", "launch"), [
    (2.5, 0, "Reproduced: ", False), (2.5 + 1e-12, 1, "NOT reproduced: ", True)],
    ids=["2.5-0-Reproduced: ", "2.500000000001-1-NOT reproduced: "])
def test_reproduce_reruns_a_stages_first_episodes_and_compares_them(
        study, rerun_bits, code, verdict, launch, monkeypatch, capsys):
    """``launch``: the replay check runs as the script runs it, a fresh interpreter whose exit
    status and verdict are the script's (seconds of imports); otherwise the script's command
    line for it is recorded and run in process (`controller_targets.main`), the same check."""
    shutil.copy(ROOT / "scripts" / "controller_targets.py", study / "scripts")
    _rows(study / "results" / "controller" / "final-budgets" / "episodes.csv", 2.5)
    _rows(study / "rerun.csv", rerun_bits)
    fake = study / "bin" / "esper-lightning"  # the rerun: its rows into the last --out
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$CALLS"\n'
                    'out=${*: -1}; mkdir -p "$out"; cp "$ROWS" "$out/episodes.csv"\n')
    if not launch:
        (study / "bin" / "python").write_text(REPLAY_RECORDER)
        (study / "bin" / "python").chmod(0o755)
    stale = study / "runs" / "reproduce" / "final-budgets" / "old.txt"  # an earlier rerun's
    stale.parent.mkdir(parents=True)  # folder: replaced, never resumed
    stale.write_text("")
    result = _run(study, "reproduce", "final-budgets", "2", ROWS=str(study / "rerun.csv"),
                  REPLAY=str(study / "replay.txt"), REAL_PYTHON=sys.executable)
    if launch:
        assert not (study / "replay.txt").exists()
        status, out = result.returncode, result.stdout
    else:
        assert result.returncode == 0, result.stderr
        script, *args = (study / "replay.txt").read_text().splitlines()
        assert script == "scripts/controller_targets.py"
        monkeypatch.chdir(study)
        with script_module("controller_targets") as targets:
            status = targets.main(args)
        out = capsys.readouterr().out
    assert status == code and out.startswith(verdict)
    assert not stale.exists()
    argv = _argv(study)  # the stage's own command, on its first 2 episodes, out of results/
    assert _after(argv, "--controllers")[:4] == [LOOKUP, *TIMING]
    assert _after(argv, "--rng_seed") == ["32676"] and _after(argv, "--seeds") == ["2"]
    assert _after(argv, "--out") == ["runs/reproduce/final-budgets"]


def test_reproduce_says_so_when_the_rerun_itself_fails(study):
    _rows(study / "results" / "controller" / "final-budgets" / "episodes.csv", 2.5)
    (study / "bin" / "esper-lightning").write_text("#!/usr/bin/env bash\nexit 1\n")
    result = _run(study, "reproduce", "final-budgets", "2")
    assert result.returncode == 2
    assert "reproduce: the rerun of final-budgets failed (above); nothing compared" in \
        result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("final-sizes", "2"), "reproduce: unknown stage 'final-sizes'; accepted: final-budgets"),
    (("final-text", "0"), "reproduce: N must be a number of final-text's episodes, 1 to 24, "
                          "got '0'"),
    (("final-text",), "reproduce: N must be a number of final-text's episodes, 1 to 24, got ''"),
    (("final-oracle", "17"), "reproduce: N must be a number of final-oracle's episodes, 1 to 16"),
    (("final-host", "4"), "no results/controller/final-host/episodes.csv: nothing committed"),
])
def test_reproduce_refuses_what_it_cannot_rerun_before_playing(study, args, message):
    result = _run(study, "reproduce", *args)
    assert result.returncode == 2 and result.stderr.startswith(message)
    assert not (study / "calls.txt").exists()


def test_no_stage_is_usage_and_exit_2(study):
    result = _run(study)
    assert result.returncode == 2 and "chosen-all" in result.stdout
    assert result.stdout.splitlines()[-1].endswith("what each stage has done so far")


def test_dev_sampled_plays_each_timing_policy_by_argmax_and_sampled_on_tuning_episodes(study):
    assert _run(study, "dev-sampled").returncode == 0
    argv = _argv(study)
    sampled = [arm.replace("policy:", "sampled:", 1) for arm in TIMING]
    assert argv[:1] == ["compare"]
    assert _after(argv, "--controllers") == [LOOKUP, *TIMING, *sampled]
    assert _after(argv, "--reference") == [LOOKUP]
    assert _after(argv, "--budget_scales") == ["0.25", "0.5", "1", "2", "4"]  # training's
    assert _after(argv, "--seeds") == ["20"] and _after(argv, "--rng_seed") == ["35034"]
    assert _after(argv, "--arm_groups") == [f"timing={','.join(TIMING)}",
                                            f"sampled={','.join(sampled)}"]
    assert _after(argv, "--group_pairs") == ["sampled=timing"]
    assert _after(argv, "--out") == ["results/controller/dev-sampled"]
