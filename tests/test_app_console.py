"""The command line's one error printer and the plugin apart from the lab (`app.console`): a lab
command without the ``lab`` extra is one line and status 2, and the plugin's import path imports
none of the lab's dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from esper_lightning.app import console

#: A finder that refuses ``NAMES`` to the package's own modules only (PyTorch and torchmetrics
#: probe and import scipy and matplotlib themselves when installed: not the plugin's doing), or
#: to everyone with ``EVERYONE`` (the extra not installed at all). Refusals are recorded.
BLOCKER = textwrap.dedent("""
    import importlib.abc, os, sys
    NAMES, EVERYONE = {names!r}, {everyone!r}
    ROOT = os.path.join(os.path.dirname(os.path.abspath({root!r})), "")
    REFUSED = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] not in NAMES:
                return None
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            where = frame.f_code.co_filename if frame is not None else ""
            if EVERYONE or where.startswith(ROOT):
                REFUSED.append(f"{{where}}:{{frame.f_lineno}} imports {{name}}")
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
""")


def _run(body: str, everyone: bool = False) -> subprocess.CompletedProcess[str]:
    """``body`` in a fresh interpreter with the lab's modules refused (module docstring)."""
    import esper_lightning

    code = BLOCKER.format(names=console.LAB_MODULES, everyone=everyone,
                          root=esper_lightning.__file__) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)


def test_fail_prints_one_line_and_returns_the_usage_status(capsys):
    assert console.fail("esper-lightning lookup", "bad   value\n  on two lines") == 2
    assert capsys.readouterr().err == "esper-lightning lookup: error: bad value on two lines\n"


def test_missing_lab_names_what_is_missing_and_the_install_line(monkeypatch):
    assert console.missing_lab("esper-lightning compare") is None  # the tests run with the lab
    monkeypatch.setitem(sys.modules, "pandas", None)  # a None entry: cannot be imported
    assert console.missing_lab("esper-lightning compare") == (
        "esper-lightning compare is part of the lab, which needs pandas (not installed); "
        "accepted: pip install 'esper-lightning[lab]'")


def test_the_plugin_import_path_imports_none_of_the_lab():
    done = _run("""
        import esper_lightning
        from esper_lightning import HeuristicController, MorphogenesisCallback
        import esper_lightning.callbacks
        import esper_lightning.app.ppo.trainer
        import esper_lightning.app.cli
        assert MorphogenesisCallback and HeuristicController
        print("refused:", REFUSED)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "refused: []"


def test_the_blocker_sees_the_lab_importing_its_dependencies():
    # The check above can fail: the lab's own modules are refused what they import.
    done = _run("import esper_lightning.app.compare.table")
    assert done.returncode == 1
    assert "No module named 'pandas'" in done.stderr


#: Each command line `without_the_extra` runs; a lab command's, then the plugin's own.
LAB_COMMANDS = [["compare", "--seeds", "2"], ["frontier", "report", "x"],
                ["lookup", "x", "--out", "y"]]
PLUGIN_COMMAND = ["ppo", "--episode_length", "0"]


@pytest.fixture(scope="module")
def without_the_extra() -> dict[str, dict[str, object]]:
    """``main``'s status and stderr for each command line of `LAB_COMMANDS` and
    `PLUGIN_COMMAND`, by its first word, all in one fresh interpreter where the lab's
    dependencies are not installed at all (one launch, not four; that the console command exits
    with ``main``'s status is tests/test_app_startup.py's to check)."""
    done = _run(f"""
        import contextlib, io, json, traceback
        from esper_lightning.app.cli import main
        for argv in {[*LAB_COMMANDS, PLUGIN_COMMAND]!r}:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    status = main(argv)
                except BaseException:  # this case's failure, not the next one's
                    status = "raised"
                    traceback.print_exc()
            print(json.dumps({{"command": argv[0], "status": status, "stderr": err.getvalue()}}))
    """, everyone=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return {case["command"]: case for case in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("command", LAB_COMMANDS)
def test_a_lab_command_without_the_extra_is_one_line_and_status_2(command, without_the_extra):
    done = without_the_extra[command[0]]
    assert done["status"] == 2, done["stderr"][-2000:]
    lines = done["stderr"].splitlines()
    assert lines == [f"esper-lightning {command[0]}: error: esper-lightning {command[0]} is part "
                     "of the lab, which needs pandas, scipy, matplotlib (not installed); "
                     "accepted: pip install 'esper-lightning[lab]'"]


def test_the_plugin_command_runs_without_the_extra(without_the_extra):
    done = without_the_extra[PLUGIN_COMMAND[0]]
    assert done["status"] == 2  # the configuration's own refusal, not the lab's
    assert "lab" not in done["stderr"] and "episode_length" in done["stderr"]
