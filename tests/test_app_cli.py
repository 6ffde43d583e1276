"""The CLI as a user runs it: exit status 2 and one-line errors, seen from a fresh process where
the launch is what is tested, and from `main` run as a process would run it (`as_a_process`)
where only the command's answer is."""

import argparse
import hashlib
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import BAD_FILE_REASONS, as_a_process, bad_checkpoints
from jsonargparse import ArgumentParser

from esper_lightning import __version__
from esper_lightning.app.cli import (
    OWN_PARSER,
    READER_GONE,
    build_parser,
    main,
    own_actions,
    own_parser,
    own_subcommand,
    parse_config,
    run_own,
    run_ppo,
)
from esper_lightning.app.config import PRESETS, PPORunConfig
from esper_lightning.data import DataError, write_cifar10_fixture
from esper_lightning.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cifar_ppo.py"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``esper-lightning ARGS`` (as ``python -m``, so this checkout's package runs)."""
    return subprocess.run([sys.executable, "-m", "esper_lightning.app.cli", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def assert_one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and text in lines[0]


def cli_cases(cases: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    """``esper-lightning ARGS`` for each ``ARGS`` of ``cases``, each run by `main` in this
    process as a process of its own would run it (`as_a_process`: its status, stdout and
    stderr, warnings on stderr, the logger without handlers), without a launch that imports
    torch and Lightning again. That the console command exits with ``main``'s status, in one
    line, is `cli`'s to check (`test_help_lists_preset_and_version_answers`,
    `test_bad_flag_value`, and tests/test_app_startup.py)."""
    return [as_a_process(main, argv) for argv in cases]


def test_a_command_run_as_a_process_shows_what_a_process_of_its_own_would():
    """`as_a_process`, which the one-line checks below rest on: a warning reaches stderr once,
    as the interpreter prints it (pytest would record it instead), a library's deprecation
    does not (a fresh interpreter ignores it), ``sys.exit``'s status and message come back,
    and what the command changed is put back."""
    def command(argv: list[str]) -> int:
        for _ in range(2):
            warnings.warn("careful", UserWarning, stacklevel=1)
        warnings.warn("old", DeprecationWarning, stacklevel=1)
        logging.getLogger("esper_lightning").addHandler(logging.StreamHandler())
        os.environ["PL_GLOBAL_SEED"] = "7"
        torch.manual_seed(7)
        sys.exit(f"{sys.argv[1:]} stopped")

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    handlers, environ = list(logging.getLogger("esper_lightning").handlers), dict(os.environ)
    done = as_a_process(command, ["--flag", "1"])
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("UserWarning: careful") == 1 and "old" not in done.stderr
    assert done.stderr.endswith("['--flag', '1'] stopped\n")
    assert logging.getLogger("esper_lightning").handlers == handlers and os.environ == environ
    assert torch.equal(torch.rand(3), expected)
    assert as_a_process(lambda argv: 2, []).returncode == 2


def test_the_quickstart_writes_its_checkpoint_and_logs(smoke_policy):
    # The session's smoke policy is the README's quickstart, shortened to one round
    # (`helpers.train_smoke_policy`: examples/cifar_ppo.py run as a process of its own would
    # run it): its checkpoint and its TensorBoard run are where the flags put them.
    data, save = smoke_policy
    assert save.is_file() and save.stat().st_size > 0
    assert (save.parent / "logs" / "ppo" / "version_0").is_dir()
    assert (data / "cifar-10-batches-py").is_dir()


def test_an_ab_run_names_the_checkpoints_and_runs_it_wrote(monkeypatch, capsys, tmp_path):
    # It printed `checkpoint: ckpt.pt`, a file an A/B run never writes.
    from esper_lightning.app.ppo import trainer

    class Trained:
        def __init__(self, config, command):
            pass

        def train(self):
            return []

    monkeypatch.setattr(trainer, "PPOTrainer", Trained)
    save = tmp_path / "ckpt.pt"
    run_ppo(PPORunConfig(save=str(save), ab=("shaped", "sparse"), envs=4, logdir="runs"))
    assert capsys.readouterr().out.splitlines() == [
        f"checkpoint: {tmp_path / 'ckpt.shaped.pt'}", f"checkpoint: {tmp_path / 'ckpt.sparse.pt'}",
        "TensorBoard: tensorboard --logdir runs (one run per policy: ppo-shaped, ppo-sparse)"]


def test_unknown_config_key(tmp_path):
    config = tmp_path / "bad.json"
    config.write_text('{"envs": 2, "learning_rat": 0.1}')
    assert_one_line_error(run("--config", str(config)), "unknown config key 'learning_rat'")


def test_bad_slot_id(smoke_policy):
    data, _ = smoke_policy
    assert_one_line_error(run("--preset", "smoke", "--data-dir", str(data), "--slots", "r7c7"),
                          "unknown slot 'r7c7'; accepted: r0c0")


def test_missing_data_folder(tmp_path):
    assert_one_line_error(run("--preset", "smoke", "--data-dir", str(tmp_path / "nope")),
                          "CIFAR-10 not found in")


def test_incompatible_checkpoint_left_untouched(bad_checkpoint_runs, smoke_policy):
    _, save = smoke_policy
    before, result, after = bad_checkpoint_runs["incompatible"]
    assert_one_line_error(result, f"checkpoint '{save}' comes from an incompatible config: slots=")
    assert after == before


def test_bad_flag_value():
    assert_one_line_error(run("--envs", "many"), "envs must be an int, got 'many'")


def test_lm_task_without_text_is_one_line_offline(tmp_path):
    # No --data-dir: the default data folder holds no text (and nothing is downloaded).
    # PYTHONPATH: this checkout's package, whichever one is installed.
    env = {**os.environ, "ESPER_DATA_DIR": str(tmp_path / "empty"), "PYTHONPATH": str(ROOT)}
    assert_one_line_error(run("--preset", "lm-smoke", env=env),
                          f"text file or folder '{tmp_path / 'empty'}' not found")


# --- parsing: fast, and every form the usage shows ---------------------------------------------
#: Builds both parsers, parses, answers --help, --version and bad input, then lists what it
#: imported of torch and Lightning.
PARSE_ONLY = """
import contextlib, io, sys
from esper_lightning.app.cli import build_parser, main, parse_config
for command in ("ppo", "compare"):
    build_parser(command, "smoke")
    parse_config(command, ["--preset", "cpu", "--slots=r0c1", "--devices", "[cpu,cpu]"])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for argv in (["--help"], ["--version"]):
            try:
                main([command, *argv])
            except SystemExit as done:
                assert done.code == 0, done.code
        assert main([command, "--bogus", "1"]) == 2
        assert main([command, "--slots", "r9c9"]) == 2
        assert main([command, "--task", "lm", "--block_size", "999"]) == 2
        assert main(["compare", "--controllers", "static", "bogus"]) == 2
heavy = ("torch", "lightning", "pytorch_lightning", "torchmetrics")
print(sorted({m.split(".")[0] for m in sys.modules} & set(heavy)))
"""


def test_parsing_and_its_errors_import_neither_torch_nor_lightning():
    done = subprocess.run([sys.executable, "-c", PARSE_ONLY], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_help_lists_preset_and_version_answers():
    for command in ("ppo", "compare"):
        done = cli(command, "--help")
        assert done.returncode == 0, done.stderr
        assert f"[--preset {{{','.join(PRESETS)}}}]" in " ".join(done.stdout.split())
        assert "--preset {" in done.stdout and "--version" in done.stdout
        assert cli(command, "--version").stdout == f"esper-lightning {command} {__version__}\n"
    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"esper-lightning {__version__}\n")
    assert "--version" in cli("--help").stdout


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(monkeypatch, capsys):
    from esper_lightning.app.frontier import command

    # select's table (every arm's chosen rates), longer than a stream's buffer: the pipe
    # breaks while it prints; --version's one line breaks it at main's flush.
    table = [{"arm": f"S{k}", "lr": {"1": 1e-3, "2": 2e-3}} for k in range(500)]
    monkeypatch.setattr(command, "_selected", lambda study: table)
    captured = sys.stdout
    for argv in (["frontier", "select", "STUDY"], ["--version"]):
        read, write = os.pipe()
        os.close(read)  # the reader has gone (``| head -1`` after its line)
        with open(write, "w") as stream:  # buffered, as stdout into a pipe is
            monkeypatch.setattr(sys, "stdout", stream)
            assert main(argv) == READER_GONE == 141, argv
            # stdout now writes to devnull: Python's last flush at exit cannot raise again.
            stream.write("x" * 100_000)
            stream.flush()
            monkeypatch.setattr(sys, "stdout", captured)
        assert capsys.readouterr().err == ""  # no traceback, no line


@pytest.mark.parametrize(
    ("command", "flag", "forms", "expected"),
    [
        ("ppo", "slots", [["--slots=r0c1"], ["--slots", "r0c1"], ["--slots", "[r0c1]"]],
         ("r0c1",)),
        ("ppo", "slots", [["--slots", "r0c1", "r0c2"], ["--slots", "[r0c1,r0c2]"],
                          ["--slots=[r0c1,r0c2]"], ["--slots", "[r0c1,", "r0c2]"]],
         ("r0c1", "r0c2")),
        ("compare", "controllers", [["--controllers", "[static,heuristic]"],
                                    ["--controllers", "static", "heuristic"]],
         ("static", "heuristic")),
        ("ppo", "ab", [["--ab", "shaped", "sparse"], ["--ab=[shaped,sparse]"]],
         ("shaped", "sparse")),
        ("ppo", "ab", [["--ab"], ["--ab=[]"], ["--ab", "[]"]], ()),
        ("ppo", "devices", [["--devices", "cpu", "cpu"], ["--devices", "[cpu,cpu]"]],
         ("cpu", "cpu")),
    ],
)
def test_list_flags_take_every_form(command, flag, forms, expected):
    for argv in forms:
        assert getattr(parse_config(command, [*argv, "--rng_seed", "1"]), flag) == expected, argv
    # The usage line shows the space-separated form.
    usage = " ".join(build_parser(command).format_usage().split())
    item = {"ab": "MODE"}.get(flag, flag.upper().rstrip("S"))
    assert f"[--{flag} {item} [{item} ...]]" in usage


def test_slots_null_is_the_tasks_default():
    assert parse_config("ppo", ["--slots", "null", "--task", "lm"]).slots == ("r0c0", "r0c1")


# --- every bad input: one line, status 2, output folders as they were ---------------------------
def checksums(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "folder" for p in sorted(folder.rglob("*"))}


def outputs(tmp_path: Path) -> Path:
    """Output folders of earlier runs in ``tmp_path/out``: a PPO log and checkpoint, a
    comparison's episodes; and beside them a short text, a preset file and a small CIFAR."""
    out = tmp_path / "out"
    (out / "logs" / "ppo" / "version_0").mkdir(parents=True)
    (out / "logs" / "ppo" / "version_0" / "hparams.yaml").write_text("envs: 2\n")
    (out / "ckpt.pt").write_bytes(b"an earlier checkpoint")
    (out / "cmp").mkdir()
    (out / "cmp" / "episodes.csv").write_text("keep me\n")
    (tmp_path / "short.txt").write_text("A text shorter than one block.\n")
    (tmp_path / "preset.yaml").write_text("preset: smoke\nrounds: 3\n")
    write_cifar10_fixture(tmp_path / "cifar", n_train=16, n_test=8)
    return out


#: Bad command lines and the one line each fails with.
BAD_INPUTS = [
    (["ppo", "--bogus", "1"], "ppo: error: unrecognized arguments: --bogus 1"),
    (["ppo", "--slots", "r9c9"], "unknown slot 'r9c9'; accepted: r0c0, r0c1, r0c2, r1c0"),
    (["ppo", "--slots=r0c1,r0c2"], "unknown slot 'r0c1,r0c2'; accepted: r0c0"),
    (["ppo", "--envs", "many"], "envs must be an int, got 'many'"),
    (["ppo", "--preset", "smoke", "--minibatch_envs", "3"],
     "minibatch_envs=3 does not divide envs=2; accepted: 1, 2"),
    (["ppo", "--train_subset", "all"], "train_subset must be an int or null, got 'all'"),
    (["ppo", "--task", "nlp"], "unknown task 'nlp'; accepted: cifar, lm"),
    (["ppo", "--host_preset", "big"], "unknown host_preset 'big'; accepted: baseline"),
    (["ppo", "--download", "maybe"], "download must be true or false, got 'maybe'"),
    (["ppo", "--preset", "big"], "unknown preset 'big'; accepted: smoke, cpu, gpu"),
    (["ppo", "--preset"], "--preset needs a name; accepted: smoke"),
    (["ppo", "--config", "TMP/preset.yaml"],
     "a --config file cannot set preset ('smoke'); pass --preset smoke on the command line"),
    (["ppo", "--preset", "lm-smoke", "--data_dir", "TMP/short.txt"],
     "short.txt' is too short for block_size=32: its training head holds 28 of its 31 bytes"),
    (["ppo", "--preset", "smoke", "--data_dir", "TMP/cifar", "--train_subset", "10"],
     "the training split holds 10 images, fewer than batch_size=64"),
    (["compare", "--preset", "lm-smoke", "--data_dir", "TMP/short.txt", "--block_size", "8"],
     "short.txt' is too short for block_size=8: its validation split holds 1 of its 31 "
     "bytes"),
    (["compare", "--controllers", "[static,bogus]"], "unknown controller 'bogus'; accepted:"),
    (["compare", "--budget_flops", "-1e9"],  # a negative number reaches the value check
     "budget_flops must be a number > 0 (FLOPs) or null, got -1000000000.0"),
    (["compare", "--budget-flops", "-2.5e3"],
     "budget_flops must be a number > 0 (FLOPs) or null, got -2500.0"),
    (["compare", "--controllers", "static", "--reference", "random"],
     "reference 'random' is not among the controllers; accepted: static"),
    (["train"], "unknown command 'train'; accepted: ppo, compare, frontier"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory) -> list[tuple[subprocess.CompletedProcess[str], dict, dict]]:
    """Each of `BAD_INPUTS` run once (`cli_cases`), each with output folders of its own
    (`outputs`): its result, and its folders' checksums before and after."""
    runs = []
    for args, _ in BAD_INPUTS:
        out = outputs(tmp_path_factory.mktemp("bad_input"))
        tmp = str(out.parent)
        args = [a.replace("TMP", tmp) for a in args]
        # --overwrite: even a run allowed to replace the checkpoint fails before touching it.
        folders = {"ppo": ["--logdir", f"{out}/logs", "--save", f"{out}/ckpt.pt",
                           "--overwrite"],
                   "compare": ["--out", f"{out}/new_cmp"]}.get(args[0], [])
        runs.append((out, checksums(out), [*args, *folders, "--no-progress"]))
    results = cli_cases([argv for _, _, argv in runs])
    return [(result, before, checksums(out))
            for (out, before, _), result in zip(runs, results, strict=True)]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_and_leaves_the_outputs(bad_input_runs, args, message):
    result, before, after = bad_input_runs[BAD_INPUTS.index((args, message))]
    assert_one_line_error(result, message)
    assert result.stderr.startswith("esper-lightning")
    assert after == before


# --- a checkpoint that is no checkpoint: one complete line, whoever reads it -------------------
#: Commands that read a bad checkpoint ``BAD``, by the kind of file it is (`bad_checkpoints`).
BAD_CHECKPOINT_COMMANDS = {
    "truncated": ["ppo", "--preset", "smoke", "--resume", "BAD", "--save", "BAD"],
    "empty": ["ppo", "--preset", "smoke", "--resume", "BAD"],
    "garbage": ["compare", "--preset", "smoke", "--controllers", "static", "policy:BAD"],
    "other": ["compare", "--preset", "smoke", "--controllers", "static", "policy:BAD"],
}


@pytest.fixture(scope="module")
def bad_checkpoint_runs(tmp_path_factory, smoke_policy) -> dict[str, tuple]:
    """Each of `BAD_CHECKPOINT_COMMANDS` run once (`cli_cases`), each in a folder of its own: by
    kind, the bad file, the result, and the folder's checksums before and after; and
    ``"incompatible"``: the smoke run's good checkpoint resumed with other slots, and its
    folder's checksums before and after."""
    data, save = smoke_policy
    incompatible = ["ppo", "--preset", "smoke", "--data-dir", str(data), "--slots", "r0c0",
                    "--resume", str(save), "--save", str(save), "--logdir",
                    str(tmp_path_factory.mktemp("incompatible_logs")), "--no-progress"]
    saved = checksums(save.parent)
    runs = {}
    for kind, args in BAD_CHECKPOINT_COMMANDS.items():
        tmp_path = tmp_path_factory.mktemp(f"bad_checkpoint_{kind}")
        bad = bad_checkpoints(tmp_path / "files")[kind]
        # compare checks its data folder before torch loads, so it must hold data for the
        # policy file to be read.
        output = ["--logdir", str(tmp_path / "logs")] if args[0] == "ppo" else [
            "--out", str(tmp_path / "cmp"),
            "--data_dir", str(write_cifar10_fixture(tmp_path / "data", n_train=64, n_test=32))]
        argv = [*[a.replace("BAD", str(bad)) for a in args], *output, "--no-progress"]
        runs[kind] = (tmp_path, bad, checksums(tmp_path), argv)
    *results, resumed = cli_cases([*(argv for *_, argv in runs.values()), incompatible])
    return {**{kind: (bad, result, before, checksums(tmp_path))
               for (kind, (tmp_path, bad, before, _)), result in zip(runs.items(), results,
                                                                     strict=True)},
            "incompatible": (saved, resumed, checksums(save.parent))}


@pytest.mark.parametrize(("kind", "args"), list(BAD_CHECKPOINT_COMMANDS.items()))
def test_a_bad_checkpoint_is_one_complete_line_and_stays_as_it_was(bad_checkpoint_runs, kind,
                                                                   args):
    bad, result, before, after = bad_checkpoint_runs[kind]
    assert_one_line_error(result, f"'{bad}'")
    assert BAD_FILE_REASONS[kind] in result.stderr
    assert "expected a PPO checkpoint written by esper-lightning ppo --save\n" in result.stderr
    assert after == before


# --- nothing a user made is lost ---------------------------------------------------------------
def test_running_the_quickstart_again_refuses_to_replace_its_checkpoint(smoke_policy, tmp_path):
    data, save = smoke_policy
    before = checksums(save.parent)
    result = run("--preset", "smoke", "--data-dir", str(data), "--rounds", "1",
                 "--episode-length", "3", "--logdir", str(save.parent / "logs"), "--save",
                 str(save), "--no-progress")
    assert_one_line_error(result, f"save '{save}' already exists; pass --resume {save} to "
                                  f"continue that run, --overwrite to replace it, or another "
                                  f"--save path")
    assert checksums(save.parent) == before


def test_resume_alone_continues_with_the_checkpoints_configuration(smoke_policy, tmp_path):
    data, save = smoke_policy
    config = parse_config("ppo", ["--resume", str(save), "--rounds", "3", "--logdir",
                                  str(tmp_path)])
    assert (config.episode_length, config.envs, config.slots) == (3, 2, ("r0c1", "r0c2"))
    assert (config.data_dir, config.save, config.resume) == (str(data), str(save), str(save))
    assert (config.rounds, config.logdir) == (3, str(tmp_path))  # the flags given override
    # A preset given with it overrides the checkpoint too, and flags override the preset.
    config = parse_config("ppo", ["--resume", str(save), "--preset", "cpu", "--rounds", "5"])
    assert (config.envs, config.rounds, config.data_dir) == (16, 5, str(data))


def test_flags_and_files_layer_on_the_preset_by_the_configurations_own_rules(tmp_path):
    """One place for the layering rules (`config.from_mapping`): a flag of an exclusive group
    clears the preset's other key, a task set by a flag moves the task's defaults, and a
    --config file is a layer like the flags."""
    config = parse_config("compare", ["--preset", "lm-grow", "--budget_steps", "40"])
    assert (config.budget_flops, config.budget_steps) == (None, 40)
    kept = parse_config("compare", ["--preset", "lm-grow", "--seeds", "2"])
    assert kept.budget_flops == 2415919104000.0 and kept.budget_steps is None
    moved = parse_config("ppo", ["--task", "lm"])
    assert (moved.host_preset, moved.slots, moved.host_lr) == ("tiny", ("r0c0", "r0c1"), 1e-3)
    file = tmp_path / "run.yaml"
    file.write_text("budget_steps: 50\n")
    from_file = parse_config("compare", ["--preset", "lm-grow", "--config", str(file)])
    assert (from_file.budget_flops, from_file.budget_steps) == (None, 50)


@pytest.mark.parametrize(("command", "argv"), [
    *((command, ["--preset", "lm-grow-cpu", "--budget_steps", "100"])  # its budget_flops
      for command in ("ppo", "compare")),
    *((command, ["--preset", "lm-grow124-cpu", "--budget_scales", "0.5", "1"])  # budget_range
      for command in ("ppo", "compare")),
    # compare refuses any budget_range: the other way round is ppo's only.
    ("ppo", ["--preset", "lm-grow-cpu", "--budget_range", "0.5", "2"]),  # its budget_scales
])
def test_print_config_writes_the_configuration_that_config_reads_back(command, argv, tmp_path,
                                                                       capsys):
    """--print_config writes the configuration the command runs, the layer rules applied (a
    flag's budget_steps clears the preset's budget_flops), so --config reads it back as it is."""
    with pytest.raises(SystemExit) as done:
        parse_config(command, [*argv, "--print_config"])
    assert done.value.code == 0
    printed = tmp_path / "run.yaml"
    printed.write_text(capsys.readouterr().out)
    assert parse_config(command, ["--config", str(printed)]) == parse_config(command, argv)


def test_print_config_refuses_what_the_command_refuses(capsys):
    """Both keys of a pair on one command line: the run is refused, so is printing it (a file
    --config would refuse)."""
    with pytest.raises(ConfigError, match=r"budget_steps=40 are both set"):
        parse_config("ppo", ["--budget_flops", "1e12", "--budget_steps", "40", "--print_config"])
    assert capsys.readouterr().out == ""


def test_a_flag_equal_to_the_presets_value_is_still_the_command_lines():
    """What the command line sets is its layer even where a preset holds the same value, so the
    layer rules never override it: both budget keys given are refused as without the preset."""
    with pytest.raises(ConfigError, match=r"budget_steps=40 are both set"):
        parse_config("compare", ["--preset", "lm-grow", "--budget_flops", "2415919104000",
                                 "--budget_steps", "40"])
    kept = parse_config("compare", ["--preset", "lm-grow", "--budget_flops", "2415919104000"])
    assert (kept.budget_flops, kept.budget_steps) == (2415919104000.0, None)


# --- the commands with a parser of their own: one style (frontier, lookup, ship) ---------------
def toy_parser() -> ArgumentParser:
    """A command of two subcommands, built as frontier's is: ``play`` takes a positional
    argument, a two-word value and a bool; ``rest`` takes nothing."""
    parser = own_parser("toy", "a toy command", config=False)
    sub = own_subcommand(parser, "play", "play the toy")
    sub.add_argument("folder", type=str, help="a folder")
    sub.add_argument("--max_count", type=int, default=3, help="how many")
    sub.add_argument("--progress", type=bool, default=True, help="a progress bar")
    own_subcommand(parser, "rest", "rest")  # a second subcommand joins the first's
    return parser


@pytest.mark.parametrize(("argv", "expected"), [
    (["play", "F"], {"folder": "F", "max_count": 3, "progress": True}),
    (["play", "F", "--max-count", "-1", "--no-progress"],
     {"folder": "F", "max_count": -1, "progress": False}),
    (["play", "--no_progress", "--max_count=5", "F"],
     {"folder": "F", "max_count": 5, "progress": False}),
    (["play", "F", "--progress"], {"folder": "F", "max_count": 3, "progress": True}),
    (["play", "F", "--progress", "false"], {"folder": "F", "max_count": 3, "progress": False}),
])
def test_an_own_parser_takes_compares_spellings(argv, expected):
    seen = []
    assert run_own("toy", toy_parser(), argv, lambda args: seen.append(args.play) or 0) == 0
    assert [{k: v for k, v in s.as_dict().items() if k != "config"} for s in seen] == [expected]


def test_an_own_parser_refuses_in_one_line_and_lets_a_bug_through(capsys):
    def refuse(error):
        def act(args):
            raise error
        return act

    for argv, message in ((["play"], "the following arguments are required: folder"),
                          (["play", "F", "--max_count", "x"], "max_count must be an int, got 'x'"),
                          (["stop"], "unknown subcommand 'stop'; accepted: play, rest"),
                          ([], "no subcommand; accepted: play, rest")):
        assert run_own("toy", toy_parser(), argv, refuse(AssertionError)) == 2
        assert capsys.readouterr().err == f"esper-lightning toy: error: {message}\n"
    for error in (ConfigError("bad\n  folder"), DataError("no data"), KeyError("k")):
        status = run_own("toy", toy_parser(), ["play", "F"], refuse(error), refused=(KeyError,))
        assert status == 2 and capsys.readouterr().err.count("\n") == 1
    with pytest.raises(ZeroDivisionError):  # not a user's mistake: never one quiet line
        run_own("toy", toy_parser(), ["play", "F"], refuse(ZeroDivisionError()))
    assert run_own("toy", toy_parser(), ["--version"], refuse(AssertionError)) == 0
    assert capsys.readouterr().out == f"esper-lightning toy {__version__}\n"


def test_own_actions_are_each_subcommands_keys():
    actions = own_actions(toy_parser())
    assert {name: list(keys) for name, keys in actions.items()} == {
        "": [], "play": ["folder", "max_count", "progress"], "rest": []}


def test_every_own_parser_command_is_built_alike():
    import importlib

    for name, (_, module) in OWN_PARSER.items():
        parser = importlib.import_module(module).build_parser()
        assert isinstance(parser, ArgumentParser) and parser.prog == f"esper-lightning {name}"
        has_config = [bool({"config", "print_config"} <= {a.dest for a in sub._actions})
                      for sub in [parser, *own_subparsers(parser)]]
        assert any(has_config), name  # the command, or each of its subcommands
        assert all(has_config[1:]), name


def own_subparsers(parser: ArgumentParser) -> list[ArgumentParser]:
    """The parsers of ``parser``'s subcommands (none for a command without)."""
    return [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()]
