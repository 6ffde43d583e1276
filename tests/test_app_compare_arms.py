"""`app.compare.arms`: the registry of what ``--controllers`` names, one entry per kind."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from esper_lightning.app import cli
from esper_lightning.app.compare import runner as compare_runner
from esper_lightning.app.compare.arms import (
    ARM_KINDS,
    ArmKind,
    ControllerSpec,
    EpisodePlan,
    arm_usages,
    fingerprint,
    parse_controller,
    register_arm,
)
from esper_lightning.app.compare.runner import Comparison
from esper_lightning.app.config import CompareConfig
from esper_lightning.controllers import RandomController, StaticController
from esper_lightning.errors import ConfigError

BUILT_IN = ("static", "heuristic", "random", "grower:BLUEPRINT[:all][:hold]", "policy:PATH",
            "sampled:PATH", "matched:NAME", "stack:K@TAU[:OPERATOR]", "lookup:PATH", "born:K")


@pytest.fixture
def scratch_arms():
    """The registry as it was after the test, whatever the test registered."""
    saved = dict(ARM_KINDS)
    yield
    ARM_KINDS.clear()
    ARM_KINDS.update(saved)


def test_the_built_in_kinds_are_registered_in_order():
    assert arm_usages() == BUILT_IN
    assert all(kind.about for kind in ARM_KINDS.values())


@pytest.mark.parametrize("text, kind, argument", [
    ("static", "static", None), ("random", "random", None),
    ("grower:norm:all", "grower", "norm:all"), ("policy:runs/a:b.pt", "policy", "runs/a:b.pt"),
    ("sampled:runs/a.pt", "sampled", "runs/a.pt"),
    ("stack:4@0.25:identity", "stack", "4@0.25:identity"), ("born:4", "born", "4"),
    ("lookup:lookups/grow2.json", "lookup", "lookups/grow2.json"),
])
def test_a_kind_parses_as_written(text, kind, argument):
    assert parse_controller(text) == ControllerSpec(text, kind, argument)


@pytest.mark.parametrize("text", ["static:x", "static:", "policy", "policy:", "stack", "walk"])
def test_a_kind_written_wrong_is_refused_with_every_accepted_form(text):
    with pytest.raises(ConfigError) as err:
        parse_controller(text, custom=("mine",))
    assert str(err.value) == (f"unknown controller {text!r}; accepted: "
                              f"{', '.join(BUILT_IN)}, mine")


@pytest.mark.parametrize("controllers", [["statik"], ["static", "statik"], ["heuristik"]])
def test_a_misspelt_controller_is_named_before_the_reference(controllers, capsys):
    # statik leaves the default reference (static) out, or not: the misspelt name is the error.
    assert cli.main(["compare", "--controllers", *controllers, "--out", "unused"]) == 2
    bad = next(c for c in controllers if c not in BUILT_IN)
    assert capsys.readouterr().err == (f"esper-lightning compare: error: unknown controller "
                                       f"{bad!r}; accepted: {', '.join(BUILT_IN)}\n")
    if "static" not in controllers:  # the config (also built in Python) checks it first
        with pytest.raises(ConfigError, match=f"^unknown controller {bad!r}; accepted: static, "):
            CompareConfig(controllers=tuple(controllers))


def test_a_reference_left_out_of_valid_controllers_is_still_named():
    with pytest.raises(ConfigError) as err:
        CompareConfig(controllers=("heuristic", "random"))
    assert str(err.value) == ("reference 'static' is not among the controllers; accepted: "
                              "heuristic, random")
    with pytest.raises(ConfigError) as err:
        CompareConfig(controllers=("static", "heuristic"), speedup_reference="random")
    assert str(err.value).startswith("speedup_reference 'random' is not among the controllers")


def test_a_registered_kind_is_named_on_the_command_line_and_played(scratch_arms, tmp_path):
    register_arm(ArmKind("idle", "idle", "the host as it is",
                         lambda arena, spec, plan, prepared: StaticController()))
    register_arm(ArmKind("dice", "dice:SALT", "random actions from a salted rng seed",
                         lambda arena, spec, plan, salt: RandomController(
                             rng_seed=plan.rng_seed + salt),
                         prepare=lambda arena, spec: int(str(spec.argument))))
    config = CompareConfig(controllers=("static", "idle", "dice:7"), out=str(tmp_path / "out"),
                           progress=False)
    comparison = Comparison(config)
    assert comparison.prepared == {"dice:7": 7}
    plan = EpisodePlan("dice:7", 0, rng_seed=11)
    assert comparison._make_controller(plan).state_dict() == RandomController(
        rng_seed=18).state_dict()
    assert isinstance(comparison._make_controller(EpisodePlan("idle", 0, 11)), StaticController)
    with pytest.raises(ConfigError, match=r"accepted: static, .*, born:K, idle, dice:SALT$"):
        parse_controller("dice")


def test_a_kind_is_registered_once_and_its_usage_starts_with_its_name(scratch_arms):
    static = ARM_KINDS["static"]
    with pytest.raises(ValueError, match="arm kind 'static' is registered already"):
        register_arm(static)
    with pytest.raises(ValueError, match=r"usage 'other:X' must start with 'odd'"):
        register_arm(ArmKind("odd", "other:X", "x", static.controller))


def test_a_policy_is_identified_by_its_file_and_content(tmp_path):
    path = tmp_path / "policy.pt"
    path.write_bytes(b"weights")
    found = fingerprint(ControllerSpec(f"policy:{path}", "policy", str(path)), lr=1e-3)
    assert found == {"kind": "policy", "path": str(path.resolve()), "lr": 1e-3,
                     "sha256": hashlib.sha256(b"weights").hexdigest()}
    path.write_bytes(b"retrained")
    assert fingerprint(ControllerSpec(f"policy:{path}", "policy", str(path)))["sha256"] != (
        found["sha256"])
    assert fingerprint(ControllerSpec("static", "static")) == {"kind": "static"}


def test_compare_help_lists_every_registered_kind(scratch_arms, capsys):
    register_arm(ArmKind("idle", "idle", "the host as it is, never grown",
                         lambda arena, spec, plan, prepared: StaticController()))
    with pytest.raises(SystemExit) as done:  # argparse's --help exits
        cli.main(["compare", "--help"])
    assert done.value.code == 0
    # Without whitespace: argparse wraps the help, also inside a hyphenated word.
    text = "".join(capsys.readouterr().out.split())
    for kind in ARM_KINDS.values():
        assert "".join(f"{kind.usage}: {kind.about}".split()) in text


def test_a_sampled_policy_draws_from_a_generator_seeded_by_the_episode(smoke_policy, tmp_path,
                                                                      monkeypatch):
    """``sampled:PATH`` plays the policy of ``policy:PATH`` with its actions sampled, as in
    training, from a generator seeded by the episode (a rerun draws the same); it is its own
    arm, identified by kind, file and content."""
    # No figures: the episodes are compared, not drawn (drawing was half of each rerun).
    monkeypatch.setattr(compare_runner.plots, "save_figures", lambda *args, **kwargs: [])
    data, save = smoke_policy
    config = CompareConfig(controllers=("static", f"policy:{save}", f"sampled:{save}"),
                           data_dir=str(data), slots=("r0c1", "r0c2"),
                           out=str(tmp_path / "out"), progress=False)
    comparison = Comparison(config)
    argmax = comparison._make_controller(EpisodePlan(f"policy:{save}", 0, rng_seed=11))
    sampled = comparison._make_controller(EpisodePlan(f"sampled:{save}", 0, rng_seed=11))
    assert argmax.deterministic and argmax.generator is None
    assert not sampled.deterministic
    assert torch.equal(sampled.generator.get_state(),
                       torch.Generator().manual_seed(11).get_state())
    assert sampled.bundle is comparison.prepared[f"sampled:{save}"]  # loaded once, checked
    assert comparison.fingerprints[f"sampled:{save}"] == {
        **comparison.fingerprints[f"policy:{save}"], "kind": "sampled"}
    # Played twice, from different global generator states: the same episodes, bit for bit.
    played = []
    for k in range(2):
        torch.manual_seed(k)
        rerun = Comparison(replace(config, controllers=("static", f"sampled:{save}"), seeds=1,
                                   episode_length=3, batch_size=16,
                                   out=str(tmp_path / f"run{k}")))
        played.append([r.values | {"wall_seconds": None} for r in rerun.run()])
    assert played[0] == played[1]


def _installed_package(folder, entry: str, module: str) -> None:
    """A package installed in ``folder`` (a dist-info with an ``esper_lightning.arms`` entry
    point, as pip writes it) and its module."""
    dist = folder / "idle_arms-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: idle-arms\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[esper_lightning.arms]\n{entry}\n")
    (folder / "idle_arms.py").write_text(module)


IDLE_MODULE = '''
from esper_lightning.app.compare.arms import ArmKind


def _static(arena, spec, plan, prepared):
    from esper_lightning.controllers import StaticController

    return StaticController()


IDLE = ArmKind("idle", "idle", "an installed package's arm: the host as it is", _static)
'''


def _command(folder, *argv: str) -> subprocess.CompletedProcess[str]:
    """The installed command line, run with ``folder`` on the path (the package installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}
    return subprocess.run([sys.executable, "-m", "esper_lightning.app.cli", *argv],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def test_an_installed_package_arm_reaches_the_installed_command(tmp_path):
    _installed_package(tmp_path, "idle = idle_arms:IDLE", IDLE_MODULE)
    helped = _command(tmp_path, "compare", "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "idle: an installed package's arm: the host as it is" in " ".join(
        helped.stdout.split())
    # Its name parses on the command line: the run stops at the (missing) data, not the arm.
    missing = tmp_path / "no-data"
    ran = _command(tmp_path, "compare", "--controllers", "static", "idle", "--data_dir",
                   str(missing))
    assert ran.returncode == 2
    assert "unknown controller" not in ran.stderr and str(missing) in ran.stderr
    # Without the package the same line names the arm as unknown.
    alone = _command(tmp_path / "elsewhere", "compare", "--controllers", "static", "idle",
                     "--data_dir", str(missing))
    assert alone.returncode == 2 and "unknown controller 'idle'" in alone.stderr


@pytest.mark.parametrize(("entry", "message"), [
    ("idle = idle_arms:NOTHING", "arm entry point 'idle = idle_arms:NOTHING' "
     "(esper_lightning.arms) failed to load: AttributeError: module 'idle_arms' has no "
     "attribute 'NOTHING'"),
    # Loaded under its kind's name, then unknown under the entry point's: refused at once.
    ("renamed = idle_arms:IDLE", "arm entry point 'renamed = idle_arms:IDLE' "
     "(esper_lightning.arms) is the arm kind 'idle'; name the entry point after it: "
     "idle = idle_arms:IDLE"),
])
def test_a_broken_entry_point_is_one_line(tmp_path, entry, message):
    _installed_package(tmp_path, entry, IDLE_MODULE)
    done = _command(tmp_path, "compare", "--controllers", "static")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"esper-lightning compare: error: {message}"]


def test_a_matched_arm_of_no_other_controller_lists_the_others():
    # It listed itself as accepted ("accepted: static, matched:nosuch").
    from types import SimpleNamespace

    from esper_lightning.app.compare.arms import _check_matched

    spec = parse_controller("matched:nosuch")
    arena = SimpleNamespace(specs={"static": None, "matched:nosuch": spec})
    with pytest.raises(ConfigError) as err:
        _check_matched(arena, spec)
    assert str(err.value) == ("matched:nosuch: 'nosuch' is not among the other controllers; "
                              "accepted: static")
