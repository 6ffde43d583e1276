"""`frontier(...)`: a study played, resumed and reported from Python as the command does."""

from __future__ import annotations

import json

import pytest

from esper_lightning.app.frontier.api import frontier
from esper_lightning.app.frontier.command import main
from esper_lightning.app.frontier.study import PLAN_FILE, ROWS_FILE, read_rows
from esper_lightning.errors import ConfigError

PLAN = {"name": "tiny", "purpose": "tuning",
        "shape": {"width": 8, "n_head": 2, "block_size": 8, "batch_size": 4},
        "base_flops": 2e7, "budgets": [1, 2], "warmup_flops": 2e6,
        "arms": [{"arm": "S1", "lr": 1e-2}, {"arm": "G1-2@0.5:identity", "lr": 1e-2}],
        "episodes": 1, "rng_seed": 5}


def test_the_function_plays_reports_and_resumes_as_the_command(tmp_path, text_file):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for folder in (ours, theirs):
        folder.mkdir()
        (folder / PLAN_FILE).write_text(json.dumps(PLAN))
    result = frontier(ours, text_file)
    assert main(["run", str(theirs), "--text", str(text_file), "--no-progress"]) == 0
    def without_clock(rows):
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]

    assert without_clock(read_rows(ours)) == without_clock(read_rows(theirs))
    assert len(result.rows) == 4 and result.report.name == "report.md"
    assert "Frontier study `tiny`" in result.report.read_text()
    assert sorted(result.table["arm"].unique()) == ["G1-2@0.5:identity", "S1"]
    again = frontier(ours, text_file)  # nothing pending: the same rows, nothing trained
    assert again.rows == result.rows


def test_a_bad_study_is_refused_before_anything_trains(tmp_path, text_file):
    (tmp_path / PLAN_FILE).write_text(json.dumps({**PLAN, "arms": [{"arm": "X1", "lr": 1e-2}]}))
    with pytest.raises(ConfigError, match="unknown arm 'X1'"):
        frontier(tmp_path, text_file)
    assert not (tmp_path / ROWS_FILE).exists()


def test_growing_arms_alone_are_read_against_the_sizes_of_a_study_joined(tmp_path, text_file):
    """A study of growing arms alone has no frontier of its own (it raised min() of an empty
    sequence deep in the report): refused in one line naming ``also``, which joins a study of
    the same episodes holding the fixed sizes."""
    sizes, growth = tmp_path / "sizes", tmp_path / "growth"
    for folder, arm in ((sizes, "S1"), (growth, "G1-2@0.5:identity")):
        folder.mkdir()
        (folder / PLAN_FILE).write_text(json.dumps({**PLAN, "name": folder.name,
                                                    "arms": [{"arm": arm, "lr": 1e-2}]}))
    frontier(sizes, text_file)
    with pytest.raises(ConfigError) as err:
        frontier(growth, text_file)
    assert str(err.value) == ("study 'growth' has growing arms and no fixed size to read them "
                              "against; join a study of the same episodes that has them "
                              "(frontier report --with STUDY, or frontier(..., also=[STUDY]))")
    joined = frontier(growth, text_file, also=[sizes])
    assert "Study `growth` with `sizes`" in joined.report.read_text()
    assert sorted(joined.table["arm"].unique()) == ["G1-2@0.5:identity"]  # its own rows
    with pytest.raises(ConfigError, match="workers must be an int >= 1, got '2'"):
        frontier(growth, text_file, workers="2")
    with pytest.raises(ConfigError, match=r"--docs '.*nodoc.md' is not a file"):
        frontier(growth, text_file, docs=tmp_path / "nodoc.md", also=[sizes])
