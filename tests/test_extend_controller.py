"""A user's controller on the installed command line, from outside the package
(docs/how-to/extend.md, "Your own controller on the command line"): a package of one module (the
controller and its `ArmKind`) and one entry point in the ``esper_lightning.arms`` group, installed
in a temporary folder as pip installs it (a ``*.dist-info`` with ``METADATA`` and
``entry_points.txt``); a fresh ``python -m esper_lightning.app.cli compare`` accepts the arm by
name, plays it beside ``static`` and reports it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

#: The user's module: a controller of their own and the arm kind that names it.
USER_MODULE = '''
from esper_lightning.app.compare.arms import ArmKind
from esper_lightning.controllers import ControllerBase
from esper_lightning.core import Action, LifecycleOp


class GrowOnce(ControllerBase):
    """Germinate ``norm`` in slot 0 as soon as the masks allow it."""

    def decide(self, report):
        action = Action(LifecycleOp.GERMINATE, slot=0, blueprint="norm")
        if report.masks.allows(action):
            self.last_reason = "slot 0 is free"
            return action
        return Action()


GROW_ONCE = ArmKind("grow_once", "grow_once", "a user's arm: germinate norm in slot 0 at once",
                    lambda arena, spec, plan, prepared: GrowOnce())
'''


def _install(site: Path) -> None:
    """The user's package ``grow-arms`` installed in ``site``, as pip writes it: its module, and
    its ``[project.entry-points."esper_lightning.arms"]`` table as ``entry_points.txt``."""
    dist = site / "grow_arms-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: grow-arms\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[esper_lightning.arms]\n"
                                           "grow_once = grow_arms:GROW_ONCE\n")
    (site / "grow_arms.py").write_text(USER_MODULE)


def test_an_installed_users_arm_is_played_and_reported_by_the_installed_command(
        text_file, tmp_path):
    site, out = tmp_path / "site", tmp_path / "cmp"
    _install(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
           "OMP_NUM_THREADS": "1"}
    argv = ["compare", "--controllers", "static", "grow_once", "--task", "lm", "--data_dir",
            str(text_file), "--host_preset", "tiny", "--slots", "r0c0", "--episode_length", "3",
            "--seeds", "1", "--envs", "1", "--batch_size", "8", "--train_subset", "8",
            "--val_subset", "4", "--block_size", "16", "--progress", "false", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "esper_lightning.app.cli", *argv],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # Played: the user's controller germinated its seed; static, on the same episode, did not.
    with (out / "episodes.csv").open(newline="") as f:
        rows = {row["controller"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["grow_once", "static"]
    assert rows["grow_once"]["episode_rng_seed"] == rows["static"]["episode_rng_seed"]
    assert (rows["grow_once"]["seeds_germinated"], rows["grow_once"]["germinated_seeds"]) == (
        "1", "r0c0:norm")
    assert int(rows["grow_once"]["seed_params"]) > 0
    assert (rows["static"]["seeds_germinated"], rows["static"]["seed_params"]) == ("0", "0")
    # Recorded by kind, and reported against the reference.
    assert json.loads((out / "controllers.json").read_text())["grow_once"]["kind"] == "grow_once"
    summary = json.loads((out / "summary.json").read_text())
    (paired,) = summary["comparisons"]
    assert (paired["controller"], paired["reference"]) == ("grow_once", "static")
    assert paired["total_params_diff_mean"] == int(rows["grow_once"]["seed_params"])
    assert "| grow_once | static | 1 |" in done.stdout
