"""``esper-lightning frontier`` (`app.frontier.command`): every subcommand takes the flags and
arguments it always took (each command line the docs and scripts show), in ``compare``'s style
(``--config``/``--print_config``, ``--no-progress``), and every bad command line is one line
and status 2. What each subcommand computes is tests/test_app_frontier.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from esper_lightning.app.frontier import command, study
from esper_lightning.app.frontier.command import main

F = "results/frontier"


@pytest.fixture
def calls(monkeypatch, tmp_path) -> list[tuple]:
    """What each subcommand's work was called with, recorded instead of done: ``run`` (its
    `run_study` arguments), ``select``, ``report`` and ``widths``."""
    seen: list[tuple] = []
    report = tmp_path / "report.md"
    report.write_text("the report\n")

    def run_study(*args):
        seen.append(("run", *args))
        return [{}, {}]

    monkeypatch.setattr(study, "run_study", run_study)
    monkeypatch.setattr(command, "_selected", lambda *args: seen.append(("select", *args)) or [])
    monkeypatch.setattr(command, "_report",
                        lambda *args: seen.append(("report", *args)) or report)
    monkeypatch.setattr(command, "_widths", lambda *args: seen.append(("widths", *args)) or [])
    return seen


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "S", "--text", "T"], ("S", "T", 1, True, "cpu")),
    (["run", "S", "--text", "T", "--workers", "2", "--device", "cuda:1", "--no-progress"],
     ("S", "T", 2, False, "cuda:1")),
    (["run", "--no-progress", "--text=T", "S", "--workers=15", "--device", "cuda"],
     ("S", "T", 15, False, "cuda")),
    (["run", "S", "--text", "T", "--progress", "false"], ("S", "T", 1, False, "cpu")),
    # benchmarks/gpu_checks.sh and docs/evidence.md, as written there
    (["run", "w128", "--text", "t.txt", "--device", "cuda", "--workers", "15", "--no-progress"],
     ("w128", "t.txt", 15, False, "cuda")),
])
def test_run_takes_study_text_workers_device_and_no_progress(calls, argv, expected):
    assert main(argv) == 0
    assert calls == [("run", *expected)]


def test_select_takes_the_study(calls, capsys):
    assert main(["select", f"{F}/w32-tuning"]) == 0
    assert calls == [("select", f"{F}/w32-tuning")]
    assert capsys.readouterr().out == "[]\n"


@pytest.mark.parametrize(("argv", "expected"), [
    (["report", f"{F}/w32-final", "--docs", "docs/evidence.md"],
     (f"{F}/w32-final", "docs/evidence.md", [])),
    (["report", f"{F}/w32-final-growth", "--with", f"{F}/w32-final-sizes", "--docs",
      "docs/results.md"], (f"{F}/w32-final-growth", "docs/results.md", [f"{F}/w32-final-sizes"])),
    (["report", "A", "--with", "B", "--with", "C"], ("A", None, ["B", "C"])),
])
def test_report_takes_the_study_docs_and_repeated_with(calls, argv, expected, capsys):
    assert main(argv) == 0
    assert calls == [("report", *expected)]
    assert capsys.readouterr().out == "the report\n\n"


def test_widths_takes_joined_studies_docs_and_repeated_tuning(calls):
    # scripts/frontier_docs.sh, as written there
    argv = ["widths", f"{F}/w32-final-growth+{F}/w32-final-sizes", f"{F}/w64-final",
            "--tuning", f"{F}/w32-tuning", "--tuning", f"{F}/w64-tuning", "--docs",
            "docs/results.md"]
    assert main(argv) == 0
    assert calls == [("widths", [f"{F}/w32-final-growth+{F}/w32-final-sizes", f"{F}/w64-final"],
                      "docs/results.md", [f"{F}/w32-tuning", f"{F}/w64-tuning"])]
    assert main(["widths", "A"]) == 0
    assert calls[-1] == ("widths", ["A"], None, [])


@pytest.mark.parametrize("argv", [
    ["run", "S", "--text", "T", "--workers", "2", "--no-progress", "--device", "cuda"],
    ["report", "A", "--with", "B", "--with", "C", "--docs", "d.md"],
    ["widths", "A+B", "C", "--tuning", "D"],
    ["select", "S"],
])
def test_print_config_writes_what_config_reads_back(calls, argv, tmp_path, capsys):
    assert main(argv) == 0
    direct = calls.pop()
    capsys.readouterr()  # what the subcommand printed
    assert main([*argv, "--print_config"]) == 0
    assert calls == []  # printing the configuration runs nothing
    file = tmp_path / "args.yaml"
    file.write_text(capsys.readouterr().out)
    assert main([argv[0], "--config", str(file)]) == 0
    assert calls == [direct]


def test_a_flag_after_config_overrides_the_file(calls, tmp_path):
    file = tmp_path / "run.yaml"
    file.write_text("study: S\ntext: T\nworkers: 4\n")
    assert main(["run", "--config", str(file), "--workers", "2", "OTHER"]) == 0
    assert calls == [("run", "OTHER", "T", 2, True, "cpu")]


#: Every subcommand's options and arguments as its help listed them before it moved to
#: jsonargparse, and the two every command now has.
HELP = {"run": ["study", "--text TEXT", "--workers WORKERS", "--device DEVICE", "--no-progress"],
        "select": ["study"],
        "report": ["study", "--docs DOCS", "--with STUDY"],
        "widths": ["STUDY[+JOINED...]", "--docs DOCS", "--tuning STUDY"]}


@pytest.mark.parametrize(("subcommand", "listed"), list(HELP.items()))
def test_help_lists_the_options_it_listed_and_config(subcommand, listed, capsys):
    assert main([subcommand, "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: esper-lightning frontier {subcommand} ")
    for option in [*listed, "--config CONFIG", "--print_config"]:
        assert option in text, option
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in HELP), text


@pytest.mark.parametrize(("argv", "message"), [
    ([], "no subcommand; accepted: run, select, report, widths"),
    (["walk"], "unknown subcommand 'walk'; accepted: run, select, report, widths"),
    (["run", "S"], "the following arguments are required: --text"),
    (["run"], "the following arguments are required: study, --text"),
    (["widths"], "the following arguments are required: STUDY[+JOINED...]"),
    (["run", "S", "--text", "T", "--workers", "two"], "workers must be an int, got 'two'"),
    (["run", "S", "--text", "T", "--progress", "maybe"],
     "progress must be true or false, got 'maybe'"),
    (["run", "S", "--text", "T", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["select", "S", "T"], "unrecognized arguments: T"),
    (["report", "--config", "CONFIG"],
     "unknown config key 'dcos'; accepted: study, docs, with"),
    (["report", "--config", "MISSING"], "File does not exist"),
])
def test_a_bad_command_line_is_one_line_and_status_2(calls, argv, message, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("study: S\ndcos: d.md\n")
    argv = [a.replace("CONFIG", str(tmp_path / "bad.yaml"))
            .replace("MISSING", str(tmp_path / "none.yaml")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("esper-lightning frontier: error: ") and message in err, err
    assert calls == []


def test_what_the_work_refuses_is_one_line_and_status_2(tmp_path, capsys):
    # No stand-ins: the real select reading a folder that holds no study.
    assert main(["select", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("esper-lightning frontier: error: ")
    assert str(Path(tmp_path)) in err


def _study(folder: Path, rows: list[tuple[float, str | None]]) -> Path:
    """A final study in ``folder`` of S2 at lr 2e-3: one row per ``(budget, schedule)``."""
    import json

    from esper_lightning.app.frontier.train import ROW_FIELDS

    folder.mkdir()
    (folder / study.PLAN_FILE).write_text(json.dumps({
        "name": folder.name, "purpose": "final", "base_flops": 1e12, "budgets": [1, 2],
        "warmup_flops": 1e10, "episodes": 1, "rng_seed": 5, "arms": [{"arm": "S2", "lr": 2e-3}],
        "shape": {"width": 8, "n_head": 2, "block_size": 8, "batch_size": 4}}))
    study._append(folder / study.ROWS_FILE, [{
        **dict.fromkeys(ROW_FIELDS), "arm": "S2", "episode": 0, "rng_seed": 0, "lr": 2e-3,
        "budget": budget, "budget_flops": budget * 1e12, "spent_flops": budget * 1e12,
        "steps": 1, "params": 1, "final_depth": 2, "tokens": 1, "data_passes": 1.0,
        "wall_s": 1.0, "validation_nats": 2.0, "test_nats": 2.0, "text_sha256": "x",
        "schedule": schedule} for budget, schedule in rows])
    return folder


def test_a_long_run_joins_another_studys_wsd_row_of_its_arm_rate_and_budget(tmp_path):
    """``--with`` (`join_rows`): one arm's rate at one budget comes from one study on each
    schedule, so a long cosine run joins the WSD row of the same arm, rate and budget, and the
    same long run in two studies is refused in one line."""
    from esper_lightning.errors import ConfigError

    wsd = _study(tmp_path / "wsd", [(1.0, None), (2.0, None)])
    long = _study(tmp_path / "long", [(2.0, "cosine")])
    plan, rows = command._loaded(str(wsd))
    joined = command.join_rows(plan, rows, str(long))
    assert [(r["budget"], r["schedule"]) for r in rows + joined] == [
        (1.0, None), (2.0, None), (2.0, "cosine")]
    again = _study(tmp_path / "again", [(1.0, None), (2.0, "cosine")])
    with pytest.raises(ConfigError) as refused:
        command.join_rows(*command._loaded(str(long)), str(again))
    assert str(refused.value) == (
        f"--with {again}: arm 'S2' at lr 0.002 and budget 2 on its long cosine schedule is in "
        "both studies; each arm's rate at a budget on a schedule comes from one")
    with pytest.raises(ConfigError) as refused:  # a WSD row in both, as before
        command.join_rows(plan, rows, str(again))
    assert str(refused.value).startswith(
        f"--with {again}: arm 'S2' at lr 0.002 and budget 1 is in both studies;")
