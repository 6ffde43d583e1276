"""A user's compare metric from outside the package (docs/how-to/extend.md, "Your own compare
metric"): one `register_metric` call in the user's module, then a comparison played through
``compare(...)`` records it per episode, writes its ``episodes.csv`` column, and reports its
summary and paired difference in ``summary.json`` and ``summary.md``; bad registrations are one
line, and a table with its column is refused, naming it, where it is not registered."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import pytest

from esper_lightning.app.compare.api import compare
from esper_lightning.app.compare.records import (
    METRICS,
    Episode,
    Metric,
    read_records_csv,
    register_metric,
)
from esper_lightning.blueprints import param_count
from esper_lightning.controllers import ControllerBase
from esper_lightning.core import Action, EpochReport, LifecycleOp
from esper_lightning.errors import ConfigError
from esper_lightning.hosts.presets import GPT_PRESETS

NAME = "seed_share"


# --- the user's module: the metric, its registration and a controller that grows ---------------
def seed_share(episode: Episode) -> float:
    """Seed parameters at the end as a percentage of the host's."""
    return 100.0 * episode.seed_params / episode.host_params


SEED_SHARE = Metric(NAME, seed_share, "seed share", unit="%", fmt=".3f", paired=True,
                    optional=True, description="seed parameters at the end over the host's")


class GrowOnce(ControllerBase):
    """Germinate ``norm`` in slot 0 at the first decision that allows it."""

    def decide(self, report: EpochReport) -> Action:
        action = Action(LifecycleOp.GERMINATE, slot=0, blueprint="norm")
        return action if report.masks.allows(action) else Action()


@pytest.fixture
def user_metric() -> Iterator[Metric]:
    """The user's one registration; `METRICS` put back after the test."""
    saved = dict(METRICS)
    try:
        yield register_metric(SEED_SHARE)
    finally:
        METRICS.clear()
        METRICS.update(saved)


def test_a_registered_metric_is_recorded_and_reported_by_a_comparison(user_metric, text_file,
                                                                      tmp_path):
    out = tmp_path / "cmp"
    result = compare(["static", "grow"], custom={"grow": lambda plan: GrowOnce()}, task="lm",
                     data_dir=str(text_file), host_preset="tiny", slots=["r0c0"],
                     episode_length=3, seeds=1, envs=1, batch_size=8, train_subset=8,
                     val_subset=4, block_size=16, progress=False, out=str(out))
    # The column, read from each played episode: 0 for static, the norm seed's share for grow.
    with (out / "episodes.csv").open(newline="") as f:
        rows = {row["controller"]: row for row in csv.DictReader(f)}
    assert list(rows["static"])[-1] == NAME
    seed = int(rows["grow"]["seed_params"])
    host = int(rows["grow"]["total_params"]) - seed
    assert seed == param_count("norm", GPT_PRESETS["tiny"].n_embd) and seed > 0
    assert float(rows["static"][NAME]) == 0.0
    assert float(rows["grow"][NAME]) == pytest.approx(100.0 * seed / host)
    assert {r.controller: r[NAME] for r in result.records} == {
        name: float(row[NAME]) for name, row in rows.items()}
    # The report: a per-controller summary and the paired difference against the reference.
    share = float(rows["grow"][NAME])
    means = {c["controller"]: c[f"{NAME}_mean"] for c in result.summary["controllers"]}
    assert means == {"static": 0.0, "grow": pytest.approx(share)}
    (paired,) = result.summary["comparisons"]
    assert paired["controller"] == "grow" and paired[f"{NAME}_diff_mean"] == pytest.approx(share)
    assert "seed share (%)" in result.report and f"{share:.3f}" in result.report
    # A process that has not registered it refuses the table, naming the column.
    del METRICS[NAME]
    with pytest.raises(ConfigError, match=f"unknown column '{NAME}'"):
        read_records_csv(out / "episodes.csv")


def test_a_table_written_before_the_metric_reads_it_as_missing(user_metric, tmp_path: Path):
    table = tmp_path / "episodes.csv"
    columns = ["schema", "controller", "episode_index", "episode_rng_seed", "host",
               *(name for name, m in METRICS.items() if not m.optional)]
    values = {"schema": "2", "controller": "static", "episode_index": "0",
              "episode_rng_seed": "7", "host": "tiny", "outcome": "50.0",
              "final_accuracy": "50.0", "total_params": "100", "seed_params": "0",
              "accuracy_curve": "50.0 50.0 50.0", "seeds_germinated": "0",
              "seeds_fossilized": "0", "seeds_pruned": "0", "wall_seconds": "1.0"}
    table.write_text(",".join(columns) + "\n" + ",".join(values[c] for c in columns) + "\n")
    (record,) = read_records_csv(table)
    assert record[NAME] is None and record["outcome"] == 50.0


@pytest.mark.parametrize(("metric", "message"), [
    (SEED_SHARE, "metric name 'seed_share' is taken; taken: schema, controller"),
    (Metric("outcome", seed_share, "x", optional=True), "metric name 'outcome' is taken"),
    (Metric("host", seed_share, "x", optional=True), "metric name 'host' is taken"),
    (Metric("Share", seed_share, "x", optional=True), "metric name 'Share': accepted: lower"),
    (Metric("share", seed_share, "x"), "metric 'share' must be optional=True"),
    ("share", "register_metric takes a Metric, got str"),
])
def test_a_bad_registration_is_one_line_and_registers_nothing(user_metric, metric, message):
    before = dict(METRICS)
    with pytest.raises(ValueError, match=message) as err:
        register_metric(metric)
    assert "\n" not in str(err.value) and before == METRICS
