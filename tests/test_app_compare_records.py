"""`app.compare.records`: the metrics read from an episode, the record, and the CSV table with its
schema versions."""

import dataclasses
import math
from types import SimpleNamespace

import pytest

from esper_lightning.app.compare import records as records_module
from esper_lightning.app.compare.records import (
    IDENTITY,
    LAYOUTS,
    METRICS,
    SCHEMA_VERSION,
    Episode,
    EpisodeRecord,
    Metric,
    append_record_csv,
    fieldnames,
    loss_outcome,
    read_records_csv,
)
from esper_lightning.errors import ConfigError

#: ``episodes.csv`` as the writer before the ``schema`` column wrote it (layout 1), verbatim.
LAYOUT_1 = """\
controller,episode_index,episode_rng_seed,host,outcome,final_accuracy,seed_params,total_params,episode_return,accuracy_curve,seeds_germinated,seeds_fossilized,seeds_pruned,wall_seconds,loss_curve
static,0,2843,baseline,61.0,62.5,0,6418,58.25,40.0 60.5 60.0 62.5,0,0,0,12.5,2.0 1.5 1.25 1.0
grower:norm,0,2843,baseline,63.333333333333336,64.0,32,6450,,40.0 61.0 63.0 64.0,1,1,0,13.0,2.0 1.5 1.0 0.5
"""  # noqa: E501
#: The same table as it was written before validation losses were recorded (layout 0).
LAYOUT_0 = """\
controller,episode_index,episode_rng_seed,host,outcome,final_accuracy,seed_params,total_params,episode_return,accuracy_curve,seeds_germinated,seeds_fossilized,seeds_pruned,wall_seconds
static,0,2843,baseline,61.0,62.5,0,6418,58.25,40.0 60.5 60.0 62.5,0,0,0,12.5
grower:norm,0,2843,baseline,63.333333333333336,64.0,32,6450,,40.0 61.0 63.0 64.0,1,1,0,13.0
"""


def record(controller="static", index=0, outcome=61.0, **values):
    curve = values.pop("accuracy_curve", (40.0, outcome - 1.0, outcome, outcome + 1.0))
    return EpisodeRecord(controller, index, 1000 + index, "baseline", {
        "outcome": outcome, "final_accuracy": outcome + 1.0, "total_params": 6418,
        "seed_params": 0, "accuracy_curve": curve, "seeds_germinated": 0,
        "seeds_fossilized": 0, "seeds_pruned": 0, "wall_seconds": 1.5, **values})


def test_metrics_read_their_values_from_a_played_episode():
    epochs = [(40.0, 2.0, 2.5), (50.0, 1.8, 2.0), (56.0, 1.6, 1.7), (58.0, 1.5, 1.5)]
    seeds = (0, 600, 600, 300)  # present at each epoch; a seed shrank before the last one
    # What the slots hold: seed 0 germinated after epoch 0, pruned and seed 1 there by epoch 3.
    held = ((None, None), ("r1c0:seed0", None), ("r1c0:seed0", None), (None, "r1c1:seed0"))
    slots = [tuple(SimpleNamespace(slot_id=f"r1c{k}", seed_id=i, blueprint=i and "lora")
                   for k, i in enumerate(ids)) for ids in held]
    reports = tuple(SimpleNamespace(
        epoch=t, val_accuracy=a, val_loss=v, train_loss=tr, host_params=1000,
        accuracy_history=tuple(e[0] for e in epochs[:t + 1]), seed_params_history=seeds[:t + 1],
        train_flops=1e6 * (t + 1), budget_flops=4e6, slots=slots[t],
    ) for t, (a, v, tr) in enumerate(epochs))
    episode = Episode(reports, 3.5, seed_params=300, host_params=1000,  # type: ignore[arg-type]
                      events={"germinated": 2, "pruned": 1}, param_cost=1.0, wall_seconds=9.0,
                      data_passes=0.25)
    r = EpisodeRecord.of_episode("heuristic", 3, 77, "baseline", episode)
    # The cost is charged on the mean seed parameters of the same 3 epochs: 500 / 1000 points.
    assert r["outcome"] == pytest.approx((50.0 + 56.0 + 58.0) / 3 - 0.5)
    assert (r["final_accuracy"], r["seed_params"], r["total_params"]) == (58.0, 300, 1300)
    assert r["val_loss"] == pytest.approx((1.8 + 1.6 + 1.5) / 3)
    assert r["accuracy_curve"] == (40.0, 50.0, 56.0, 58.0)
    assert r["loss_curve"] == (2.0, 1.8, 1.6, 1.5)
    assert (r["seeds_germinated"], r["seeds_fossilized"], r["seeds_pruned"]) == (2, 0, 1)
    assert (r["episode_return"], r["wall_seconds"]) == (3.5, 9.0)
    assert r["final_bits"] == pytest.approx(1.5 / math.log(2.0))  # nats -> bits
    assert r["train_flops_curve"] == (1e6, 2e6, 3e6, 4e6) and r["train_flops"] == 4e6
    assert r["data_passes"] == 0.25 and r["budget_flops"] == 4e6
    assert r["germinated_curve"] == (0.0, 1.0, 1.0, 2.0)  # distinct seed ids seen so far
    assert r["germinated_seeds"] == (("r1c0", "lora"), ("r1c1", "lora"))
    one_missing = tuple(SimpleNamespace(**{**vars(x), "val_loss": None if x.epoch == 2 else
                                            x.val_loss}) for x in reports)
    no_loss = dataclasses.replace(episode, reports=one_missing)
    lossless = EpisodeRecord.of_episode("heuristic", 3, 77, "baseline", no_loss)
    assert lossless["loss_curve"] == () and lossless["val_loss"] is None
    assert loss_outcome([]) is None and loss_outcome([2.5, 2.0, 1.75, 1.5]) == 1.75


def test_record_validation():
    with pytest.raises(ValueError, match="non-finite"):
        record(outcome=float("nan"))
    with pytest.raises(ValueError, match="episode_index must be >= 0"):
        record(index=-1)
    with pytest.raises(ValueError, match="seed_params must be >= 0, got -1"):
        record(seed_params=-1)
    with pytest.raises(ValueError, match="accuracy_curve must have at least one epoch"):
        record(accuracy_curve=())
    with pytest.raises(ValueError, match="curves of one episode must be equally long"):
        record(loss_curve=(1.0, 2.0))
    with pytest.raises(ValueError, match="unknown metric 'accuracy'; known: outcome"):
        record(accuracy=50.0)
    with pytest.raises(ValueError, match="final_accuracy is missing and not optional"):
        EpisodeRecord("static", 0, 1, "baseline", {"outcome": 1.0})
    short = record(accuracy_curve=[59.0, 60.0])
    assert short["accuracy_curve"] == (59.0, 60.0)  # a tuple, as read back from a CSV
    assert short["episode_return"] is None and short["loss_curve"] == ()


def test_seeds_at_the_end_round_trip_and_tell_none_from_unknown(tmp_path):
    seeds = METRICS["final_seeds"]
    grown = record(final_seeds=[["r0c1", "norm"], ("r0c2", "conv_light")])
    assert grown["final_seeds"] == (("r0c1", "norm"), ("r0c2", "conv_light"))
    assert seeds.encode(grown["final_seeds"]) == "r0c1:norm r0c2:conv_light"
    assert seeds.encode(()) == "none" and seeds.decode("none") == ()
    assert seeds.encode(None) == "" and seeds.decode("") is None  # not recorded
    assert record()["final_seeds"] is None
    append_record_csv(tmp_path / "e.csv", grown)
    append_record_csv(tmp_path / "e.csv", record(index=1, final_seeds=()))
    assert [r["final_seeds"] for r in read_records_csv(tmp_path / "e.csv")] == [
        grown["final_seeds"], ()]
    for bad in ("r0c1", "r0c1:"):
        with pytest.raises(ValueError, match="bad final_seeds"):
            seeds.decode(bad)
    with pytest.raises(ValueError, match="bad seed"):
        record(final_seeds=[("r0c1", "two words")])
    with pytest.raises(ValueError, match="seeds are neither summarised"):
        Metric("seeds2", lambda e: (), "s", kind="seeds")


def test_a_metric_definition_is_checked():
    with pytest.raises(ValueError, match="a curve is named"):
        Metric("accuracy", lambda e: (), "acc", kind="curve", summary=None)
    with pytest.raises(ValueError, match="a paired or plotted scalar must be summarised"):
        Metric("x", lambda e: 0.0, "x", summary=None, paired=True)


def test_csv_round_trip_carries_the_schema_in_every_row(tmp_path):
    rows = [
        record("static", 0, 0.1 + 0.2, accuracy_curve=(12.5, 33.33333333333333, 0.3)),
        record("ppo", 0, 61.0, episode_return=-1.0 / 3.0, seed_params=10,
               loss_curve=(2.0, 1.0 / 3.0, 1.0, 0.5), val_loss=1.0 / 3.0),
        record('a, "quoted" name', 1, 62.0, accuracy_curve=(62.0,)),
    ]
    path = tmp_path / "episodes.csv"
    for r in rows:
        append_record_csv(path, r)
    assert read_records_csv(path) == rows
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(fieldnames()) and lines[0].startswith("schema,controller,")
    assert all(line.startswith(f"{SCHEMA_VERSION},") for line in lines[1:])
    assert fieldnames() == ("schema", "controller", "episode_index", "episode_rng_seed", "host",
                            *METRICS)


def test_the_landed_layout_still_reads_and_grows_in_its_own_columns(tmp_path):
    path = tmp_path / "episodes.csv"
    path.write_text(LAYOUT_1)
    static, grower = read_records_csv(path)
    assert (static.controller, static.episode_rng_seed, static["outcome"]) == ("static", 2843, 61.0)
    assert static["val_loss"] == (1.5 + 1.25 + 1.0) / 3 and grower["val_loss"] == 1.0
    assert static["episode_return"] == 58.25 and grower["episode_return"] is None
    assert static["budget_flops"] is None  # no budget column then: not recorded
    assert grower["loss_curve"] == (2.0, 1.5, 1.0, 0.5) and grower["seeds_fossilized"] == 1
    later = record("static", 1, loss_curve=(2.0, 1.0, 1.0, 1.0), val_loss=1.0)
    append_record_csv(path, later)
    assert path.read_text().splitlines()[0] == ",".join(LAYOUTS[1])  # still layout 1
    assert path.read_text().startswith(LAYOUT_1)  # nothing written is lost
    assert read_records_csv(path) == [static, grower, later]


def test_the_layout_without_losses_still_reads_and_grows(tmp_path):
    path = tmp_path / "episodes.csv"
    path.write_text(LAYOUT_0)
    static, grower = read_records_csv(path)
    assert static["loss_curve"] == () and static["val_loss"] is None
    assert grower["outcome"] == 63.333333333333336 and grower["total_params"] == 6450
    append_record_csv(path, record("static", 1, loss_curve=(1.0,) * 4, val_loss=1.0))
    assert path.read_text().splitlines()[0] == ",".join(LAYOUTS[0])
    assert [r["loss_curve"] for r in read_records_csv(path)] == [(), (), ()]


def test_a_new_optional_metric_reads_as_missing_in_older_tables(tmp_path, monkeypatch):
    path = tmp_path / "episodes.csv"
    append_record_csv(path, record("static", 0))
    extra = Metric("train_loss", lambda e: e.reports[-1].train_loss, "train loss",
                   optional=True)
    monkeypatch.setitem(METRICS, extra.name, extra)
    (old,) = read_records_csv(path)
    assert old["train_loss"] is None
    append_record_csv(path, record("static", 1, train_loss=0.5))  # in the table's own columns
    assert [r["train_loss"] for r in read_records_csv(path)] == [None, None]
    required = dataclasses.replace(extra, optional=False)
    monkeypatch.setitem(METRICS, extra.name, required)
    with pytest.raises(ConfigError, match=r"header .* \(no column 'train_loss'\)"):
        read_records_csv(path)


def test_a_mixed_metric_joins_an_older_table_when_it_resumes(tmp_path, monkeypatch):
    path = tmp_path / "episodes.csv"
    append_record_csv(path, record("static", 0))
    header = path.read_text().splitlines()[0]
    extra = Metric("train_loss", lambda e: None, "train loss", optional=True, mixed=True)
    monkeypatch.setitem(METRICS, extra.name, extra)
    before = read_records_csv(path)
    append_record_csv(path, record("static", 1, train_loss=0.5))  # the table gains the column
    assert path.read_text().splitlines()[0] == header + ",train_loss"
    assert read_records_csv(path)[:1] == before  # nothing written is lost
    assert [r["train_loss"] for r in read_records_csv(path)] == [None, 0.5]
    assert [p.name for p in tmp_path.iterdir()] == ["episodes.csv"]  # no partial file left
    with pytest.raises(ValueError, match="only an optional metric can be mixed"):
        Metric("x", lambda e: 0.0, "x", mixed=True)


def test_a_cut_table_is_refused_before_it_gains_a_column(tmp_path, monkeypatch):
    path = tmp_path / "episodes.csv"
    for i in range(2):
        append_record_csv(path, record("static", i))
    header, first, second = path.read_text().splitlines()
    path.write_text("\n".join([header, first, second[:25]]) + "\n")
    extra = Metric("train_loss", lambda e: None, "train loss", optional=True, mixed=True)
    monkeypatch.setitem(METRICS, extra.name, extra)
    before = path.read_text()
    with pytest.raises(ConfigError, match=r"episodes\.csv: line 3: row has the wrong number"):
        append_record_csv(path, record("static", 2))
    assert path.read_text() == before


def test_germinated_seeds_list_every_seed_in_the_order_the_curve_counts_them():
    def slot(slot_id, seed_id=None, blueprint=None):
        return SimpleNamespace(slot_id=slot_id, seed_id=seed_id, blueprint=blueprint)

    reports = (SimpleNamespace(slots=(slot("r1c0"), slot("r1c1", "r1c1:seed0", "lora"))),
               SimpleNamespace(slots=(slot("r1c0", "r1c0:seed0", "block_identity"),
                                      slot("r1c1", "r1c1:seed0", "lora"))),
               SimpleNamespace(slots=(slot("r1c0", "r1c0:seed0", "block_identity"),
                                      slot("r1c1"))),  # r1c1's lora pruned
               SimpleNamespace(slots=(slot("r1c0", "r1c0:seed0", "block_identity"),
                                      slot("r1c1", "r1c1:seed1", "lora"))))
    episode = SimpleNamespace(reports=reports)
    assert records_module.germinated_curve(episode) == (1.0, 2.0, 2.0, 3.0)
    assert records_module.germinated_seeds(episode) == (
        ("r1c1", "lora"), ("r1c0", "block_identity"), ("r1c1", "lora"))
    assert record(germinated_seeds=records_module.germinated_seeds(episode))[
        "germinated_seeds"][1] == ("r1c0", "block_identity")


def write_lines(path, lines):
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    return path


def test_foreign_cut_or_newer_tables_are_refused_in_one_line(tmp_path):
    good = tmp_path / "good.csv"
    for i in range(2):
        append_record_csv(good, record("static", i))
    header, first, second = good.read_text().splitlines()
    cases = {
        "bad_int.csv": ([header, first, second.replace(",1,1001,", ",one,1001,", 1)],
                        "line 3: bad episode_index 'one'"),
        "cut.csv": ([header, first, second[:25]], "line 3: row has the wrong number of fields"),
        "foreign.csv": (["a,b", "1,2"], r"header \['a', 'b'\] .*unknown column 'a'"),
        "empty.csv": ([], r"header \[\] .*no column 'schema'"),
        "newer.csv": ([header, "3" + first[1:]], "line 2: schema 3 was written by a newer"),
        "schema.csv": ([header, "x" + first[1:]], "line 2: bad schema 'x'; accepted: 2 to 2"),
        "bad_curve.csv": ([",".join(LAYOUTS[1]), LAYOUT_1.splitlines()[1][:-3] + "one"],
                          "line 2: bad loss_curve"),
    }
    for name, (lines, message) in cases.items():
        with pytest.raises(ConfigError, match=f"malformed records file .*{name}: .*{message}"
                           ) as info:
            read_records_csv(write_lines(tmp_path / name, lines))
        assert "\n" not in str(info.value)
    (tmp_path / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match=r"malformed records file .*binary\.csv: .*utf-8"):
        read_records_csv(tmp_path / "binary.csv")
    foreign = tmp_path / "foreign.csv"
    with pytest.raises(ConfigError, match=r"malformed records file .*foreign\.csv: header"):
        append_record_csv(foreign, record())
    assert foreign.read_text() == "a,b\n1,2\n"


def test_upgrades_cover_every_earlier_layout():
    assert set(records_module.UPGRADES) == set(range(SCHEMA_VERSION))
    assert set(LAYOUTS) <= set(range(SCHEMA_VERSION))
    for version, columns in LAYOUTS.items():
        assert set(columns) <= set(fieldnames())  # so an earlier table grows in its columns
        row = dict.fromkeys(columns, "")
        for step in range(version, SCHEMA_VERSION):
            row = records_module.UPGRADES[step](row)
        required = {*IDENTITY, *(m.name for m in METRICS.values() if not m.optional)}
        assert required <= set(row) <= set(fieldnames())
