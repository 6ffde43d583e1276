"""`compare(...)` from Python (`app.compare.api`): the command's comparison, its folder's records
and summary returned; bad settings and a missing lab refused in one line."""

from __future__ import annotations

import json
import sys

import pytest

from esper_lightning.app.compare.api import compare
from esper_lightning.app.compare.records import read_records_csv
from esper_lightning.controllers import StaticController
from esper_lightning.errors import ConfigError

#: The smallest comparison the fixture data plays: 3 epochs, two paired episodes.
TINY = {"episode_length": 3, "batch_size": 16, "slots": ("r0c1", "r0c2"),
        "min_training_epochs": 1, "envs": 2, "seeds": 2, "progress": False}


def test_compare_plays_the_command_s_comparison_and_returns_its_folder(cifar_dir, tmp_path):
    out = tmp_path / "cmp"
    result = compare(["static", "mine"], custom={"mine": lambda plan: StaticController()},
                     data_dir=str(cifar_dir), out=str(out), **TINY)
    assert result.out == out and result.config.seeds == 2
    assert list(result.records) == read_records_csv(out / "episodes.csv")
    assert result.summary == json.loads((out / "summary.json").read_text())
    assert result.report.startswith("# Comparison of 2 controllers")
    table = result.table
    assert sorted(table["controller"]) == ["mine", "mine", "static", "static"]
    # Two static controllers on paired episodes: the same outcome, episode by episode.
    by = table.pivot(index="episode_index", columns="controller", values="test_outcome")
    assert by["mine"].tolist() == by["static"].tolist()
    (paired,) = result.summary["comparisons"]
    assert paired["controller"] == "mine" and paired["test_outcome_diff_mean"] == 0.0


def test_bad_settings_are_one_line_before_anything_is_played(tmp_path):
    with pytest.raises(ConfigError, match="unknown controller 'statik'"):
        compare(["statik"], out=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="seeds"):
        compare(["static"], seeds=0, out=str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_without_the_lab_compare_names_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "scipy", None)  # a None entry: cannot be imported
    with pytest.raises(ImportError, match=r"needs scipy .*pip install 'esper-lightning\[lab\]'"):
        compare(["static"], out=str(tmp_path / "c"))


def test_custom_controllers_are_played_as_given_or_refused_in_one_line(cifar_dir, tmp_path):
    """A name in ``custom`` that ``controllers`` leaves out was silently never played; a factory
    that makes no controller failed with a traceback after the first epoch had trained; a
    string for ``controllers`` was read as its letters."""
    common = {"data_dir": str(cifar_dir), **TINY}
    with pytest.raises(ConfigError) as err:
        compare(["static"], custom={"mine": lambda plan: StaticController()},
                out=str(tmp_path / "a"), **common)
    assert str(err.value) == ("custom controller 'mine' is not among the controllers to play; "
                              "add it to controllers (played: static)")
    with pytest.raises(ConfigError) as err:
        compare(["static", "mine"], custom={"mine": lambda plan: 42}, out=str(tmp_path / "b"),
                **common)
    assert str(err.value) == ("custom controller 'mine': its factory returned 42, not a "
                              "controller (it needs decide and reset)")
    result = compare("static", out=str(tmp_path / "c"), **{**common, "seeds": 1, "envs": 1})
    assert result.config.controllers == ("static",)
