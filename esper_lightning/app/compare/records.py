"""What a comparison measures: the metric definitions, the per-episode record and its CSV table.

`METRICS` is the one list of what an episode is judged by. Each `Metric` says how its value is
read from a played `Episode`, whether it is one number per episode or one per epoch, which way
is better, and how it is shown; the record, the CSV columns, the summaries and paired
differences (`app.compare.report`), the JSON and Markdown reports and the plots
(`app.compare.plots`) all iterate it. A built-in metric is one entry here (and, if the env does
not measure the value yet, the place where it does); a metric of your own is one
`register_metric` call in your code, nothing here changed:

    register_metric(Metric("final_train_loss", lambda e: e.reports[-1].train_loss,
                           "final train loss", fmt=".4f", better="lower", paired=True,
                           optional=True))

The CSV (``episodes.csv``) has one row per `EpisodeRecord`: a ``schema`` column
(`SCHEMA_VERSION`, in every row, so a spreadsheet round trip keeps it), the episode's identity,
then one column per metric. Tables of earlier layouts still read: `LAYOUTS` holds their headers
and `UPGRADES` turns their rows into current ones. A new metric is a new column and needs no new
version: a table without the column reads the metric as missing when it is ``optional`` and is
refused, naming the column, when it is not; appending to it adds the column (empty in its
earlier rows) only where the metric is ``mixed``. Bump `SCHEMA_VERSION` (and add an upgrade)
only when the meaning of an existing column changes.

Example::

    record = EpisodeRecord.of_episode("static", 0, 1234, "baseline", episode)
    append_record_csv("compare/episodes.csv", record)
    records = read_records_csv("compare/episodes.csv")
    records[0]["outcome"]  # 61.4
"""

from __future__ import annotations

import csv
import itertools
import math
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from esper_lightning.core.outcome import OUTCOME_EPOCHS, parameter_cost, report_outcome
from esper_lightning.core.report import EpochReport
from esper_lightning.errors import ConfigError

#: Seeds present in a host: ``(slot id, blueprint)`` pairs in slot order.
Seeds = tuple[tuple[str, str], ...]
#: A metric's value in one episode: a number, a per-epoch curve, seeds, or None when not
#: measured.
Value = float | int | tuple[float, ...] | Seeds | None


@dataclass(frozen=True)
class Episode:
    """What playing one episode produced; every metric reads its value from this.

    Attributes:
        reports: the controller's view after each epoch, first epoch first.
        episode_return: the RL return the episode earned, None when unknown.
        seed_params, host_params: parameters of the seeds present at the end, and of the host.
        events: lifecycle events over the episode by kind (``germinated``, ``fossilized``, ...).
        param_cost: the task's price of seed parameters in outcome points (`core.outcome`).
        wall_seconds: wall-clock time of the episode.
        seeds: ``(slot id, blueprint)`` of every seed present at the end, in slot order.
        data_passes: training data seen over the training data's size (None: not counted).
        test_loss, test_accuracy: the host's mean loss (per token for a language model) and
            accuracy (percent) on the test split at the end (None: not measured); what the
            final tables judge.
    """

    reports: tuple[EpochReport, ...]
    episode_return: float | None
    seed_params: int
    host_params: int
    events: Mapping[str, int]
    param_cost: float
    wall_seconds: float
    seeds: Seeds = ()
    data_passes: float | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None

    @property
    def accuracies(self) -> tuple[float, ...]:
        """Validation accuracy (percent) per epoch."""
        missing = [r.epoch for r in self.reports if r.val_accuracy is None]
        if missing:
            raise RuntimeError(f"epoch {missing[0]}: the env reported no validation accuracy")
        return tuple(r.val_accuracy for r in self.reports)  # type: ignore[misc]

    @property
    def losses(self) -> tuple[float, ...]:
        """Validation loss per epoch; empty when the env measured none."""
        losses = [r.val_loss for r in self.reports]
        return () if None in losses else tuple(losses)  # type: ignore[arg-type]


def final_bits(losses: Sequence[float]) -> float | None:
    """The last validation loss (nats per token) in bits per token, None for an empty curve:
    bits per byte for the byte-level language model.

    Example::

        final_bits([2.0, math.log(4)])  # 2.0
    """
    return losses[-1] / math.log(2.0) if losses else None


def loss_outcome(losses: Sequence[float], last: int = OUTCOME_EPOCHS) -> float | None:
    """Mean of the last ``last`` validation losses (the loss twin of the outcome); None for
    an empty curve.

    Example::

        loss_outcome([2.5, 2.0, 1.75, 1.5])  # 1.75
    """
    tail = list(losses)[-last:]
    return math.fsum(tail) / len(tail) if tail else None


@dataclass(frozen=True)
class Metric:
    """One measured quantity of an episode.

    Attributes:
        name: the key of its value in a record, its CSV column and the stem of its JSON keys
            (``<name>_mean``, ``<name>_ci``, ``<name>_diff_mean``, ...). A curve's name ends in
            ``_curve``.
        read: its value from a played `Episode`.
        label: short name in table headers and plot titles.
        kind: ``"scalar"`` (one value per episode), ``"curve"`` (one value per epoch) or
            ``"seeds"`` (``(slot id, blueprint)`` pairs; neither summarised, paired nor drawn).
        dtype: ``float``, or ``int`` for counts (never negative).
        unit: shown after the label (``"%"``; a difference of percentages is in ``"pp"``).
        fmt: format spec of its values in tables (a difference adds ``+``).
        better: ``"higher"`` or ``"lower"`` when one way is better, None when neither is.
        summary: per controller: ``"ci"`` (mean and interval), ``"mean"``, or None (not
            summarised; curves never are).
        paired: whether paired differences against the reference are reported.
        optional: whether an episode may lack it (None; an empty curve), e.g. a return where
            the controller's reward is unknown.
        section: Markdown section of its own (a title); ``""`` puts it in the main tables.
        description: what it is, in a sentence fragment (section text, plot axes).
        plot: whether the comparison draws it (a curve per epoch, a scalar against size and,
            when paired, its paired differences).
        priced: whether its value subtracts the parameter cost (`core.outcome`); plots of it
            name the ``param_cost`` the comparison used.
        shown: when a report shows it (`Scope.shows`): ``"always"``; ``"budget"``, under a
            compute budget; ``"compute"``, under a budget or when the controllers' training
            FLOPs differ; ``"bits"``, on a task whose loss is read in bits (text).
        mixed: whether a table may hold it in some rows and not in others, so a table written
            before it gains its column when resumed (an optional metric that nothing pairs or
            groups by: each row is read on its own). Other new columns are left out of an
            older table: a budget known for some episodes and not others would pair nothing.
    """

    name: str
    read: Callable[[Episode], Value]
    label: str
    kind: Literal["scalar", "curve", "seeds"] = "scalar"
    dtype: type = float
    unit: str = ""
    fmt: str = ".2f"
    better: Literal["higher", "lower"] | None = None
    summary: Literal["ci", "mean"] | None = "ci"
    paired: bool = False
    optional: bool = False
    section: str = ""
    description: str = ""
    plot: bool = False
    priced: bool = False
    shown: Literal["always", "budget", "compute", "bits"] = "always"
    mixed: bool = False

    def __post_init__(self) -> None:
        if self.mixed and not self.optional:
            raise ValueError(f"metric {self.name!r}: only an optional metric can be mixed")
        if self.kind not in ("scalar", "curve", "seeds") or self.dtype not in (int, float):
            raise ValueError(f"metric {self.name!r}: bad kind {self.kind!r} or dtype {self.dtype}")
        if self.kind == "seeds" and (self.summary or self.paired or self.plot):
            raise ValueError(f"metric {self.name!r}: seeds are neither summarised, paired nor "
                             "drawn")
        if self.kind == "curve" and (not self.name.endswith("_curve") or self.summary
                                     or self.paired or self.dtype is not float):
            raise ValueError(f"metric {self.name!r}: a curve is named '*_curve', holds floats "
                             "and is neither summarised nor paired")
        if (self.paired or (self.plot and self.kind == "scalar")) and self.summary is None:
            raise ValueError(f"metric {self.name!r}: a paired or plotted scalar must be "
                             "summarised")
        if self.better not in ("higher", "lower", None):
            raise ValueError(f"metric {self.name!r}: better must be 'higher', 'lower' or None")
        if self.shown not in ("always", "budget", "compute", "bits"):
            raise ValueError(f"metric {self.name!r}: bad shown {self.shown!r}")

    def describe(self, example: str = "example") -> str:
        """The description with ``{example}`` naming what the task's loss is per (``"byte"``
        of text, ``"image"``)."""
        return self.description.format(example=example)

    def axis_label(self) -> str:
        """``label: description (unit)``, for plot axes."""
        text = f"{self.label}: {self.describe()}" if self.description else self.label
        return f"{text} ({self.unit})" if self.unit else text

    def encode(self, value: Value) -> str:
        """The CSV cell: floats in round-trip precision, a curve space-separated, a missing
        value as the empty string."""
        if value is None:
            return ""
        if self.kind == "seeds":  # "none" for no seeds: "" is "not recorded"
            return " ".join(f"{s}:{b}" for s, b in value) or "none"  # type: ignore[union-attr]
        if self.kind == "curve":
            return " ".join(repr(v) for v in value)  # type: ignore[union-attr]
        return str(value) if self.dtype is int else repr(float(value))  # type: ignore[arg-type]

    def decode(self, text: str) -> Value:
        """The value of a CSV cell written by `encode`."""
        try:
            if self.kind == "seeds":
                return None if text == "" else self.check(
                    () if text == "none" else tuple(_seed(pair) for pair in text.split()))
            if self.kind == "curve":
                return tuple(float(v) for v in text.split())
            return None if text == "" else self.dtype(text)
        except ValueError:
            raise ValueError(f"bad {self.name} {text!r}") from None

    def check(self, value: Value) -> Value:
        """The value in canonical form (ints, floats, a tuple curve, seed pairs), or
        ValueError."""
        if self.kind == "seeds":
            return _check_seeds(self.name, value, self.optional)
        if self.kind == "curve":
            curve = tuple(float(v) for v in value or ())  # type: ignore[union-attr]
            if not curve and not self.optional:
                raise ValueError(f"{self.name} must have at least one epoch, got an empty curve")
            return curve
        if value is None:
            if not self.optional:
                raise ValueError(f"{self.name} is missing and not optional")
            return None
        if self.dtype is int:
            count = operator.index(value)  # type: ignore[arg-type]
            if count < 0:
                raise ValueError(f"{self.name} must be >= 0, got {count}")
            return count
        return float(value)  # type: ignore[arg-type]


def _seed(pair: str) -> tuple[str, str]:
    slot_id, sep, blueprint = pair.partition(":")
    if not sep:
        raise ValueError(f"{pair!r} is not slot:blueprint")
    return slot_id, blueprint


def _check_seeds(name: str, value: Value, optional: bool) -> Seeds | None:
    if value is None:
        if not optional:
            raise ValueError(f"{name} is missing and not optional")
        return None
    pairs = tuple(tuple(pair) for pair in value)  # type: ignore[union-attr]
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(x, str) and x and ":" not in x
                                     and not any(c.isspace() for c in x) for x in pair):
            raise ValueError(f"{name}: bad seed {pair!r}; a seed is (slot id, blueprint)")
    return pairs  # type: ignore[return-value]


def _events(kind: str) -> Callable[[Episode], int]:
    return lambda e: e.events.get(kind, 0)


def _new_seeds(episode: Episode) -> list[list[Any]]:
    """Per report, the slots whose seed it shows first (slot order): the one walk that
    `germinated_curve` counts and `germinated_seeds` names, so the two line up."""
    seen: set[str] = set()
    new = []
    for report in episode.reports:
        first = [s for s in report.slots if s.seed_id is not None and s.seed_id not in seen]
        seen.update(s.seed_id for s in first)
        new.append(first)
    return new


def germinated_curve(episode: Episode) -> tuple[float, ...]:
    """Distinct seeds seen in the reports up to each epoch: every germination is a new seed id
    (``slot:seedN``), so the count rises at the epoch after each germinating decision, and a
    change of blend style or a prune in another slot cannot move it (seed parameters can)."""
    return tuple(float(n) for n in itertools.accumulate(len(f) for f in _new_seeds(episode)))


def germinated_seeds(episode: Episode) -> Seeds:
    """Every seed the reports showed, ``(slot id, blueprint)`` in the order they appeared
    (epoch, then slot): the seeds `germinated_curve` counts, in its order, so each of its rises
    is known by blueprint (a growth operator's or another: `app.compare.growth`)."""
    return tuple((s.slot_id, s.blueprint) for first in _new_seeds(episode) for s in first)


def test_outcome(episode: Episode) -> float | None:
    """Test accuracy at the end minus the parameter price of the seeds present then (None:
    no test accuracy recorded)."""
    if episode.test_accuracy is None:
        return None
    charge = parameter_cost([episode.seed_params], episode.host_params, episode.param_cost,
                            last=1)
    return episode.test_accuracy - charge


#: Every metric of a comparison, in table order. The outcome comes first: it is what a
#: controller is judged by.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("outcome", lambda e: report_outcome(e.reports[-1], e.param_cost),
           "outcome", unit="%", better="higher", paired=True, plot=True, priced=True,
           description=f"mean validation accuracy of the last {OUTCOME_EPOCHS} epochs minus "
                       "param_cost × their mean seed parameters / host parameters"),
    Metric("final_accuracy", lambda e: e.accuracies[-1], "final acc.", unit="%",
           better="higher", summary="mean", description="validation accuracy of the last epoch"),
    Metric("total_params", lambda e: e.seed_params + e.host_params, "total params", dtype=int,
           fmt=",.0f", paired=True, description="host and seed parameters at the end"),
    Metric("seed_params", lambda e: e.seed_params, "seed params", dtype=int, fmt=",.0f",
           description="parameters of the seeds present at the end"),
    Metric("episode_return", lambda e: e.episode_return, "return", better="higher",
           optional=True, description="the RL return, where the controller's reward is known"),
    Metric("train_flops", lambda e: e.reports[-1].train_flops, "train FLOPs", fmt=".3g",
           summary="mean", optional=True, section="Compute", shown="compute",
           description="training FLOPs of the episode (host and every seed, forward and "
                       "backward)"),
    Metric("budget_flops", lambda e: e.reports[-1].budget_flops, "budget", fmt=".3g",
           summary=None, optional=True, shown="budget",
           description="the episode's compute budget in training FLOPs (its drawn multiple of "
                       "the base budget when budgets vary by episode; empty without a budget)"),
    Metric("data_passes", lambda e: e.data_passes, "data passes", fmt=".3f", summary="mean",
           optional=True, section="Compute", shown="compute",
           description="training {example}s seen over the training data's size"),
    Metric("val_loss", lambda e: loss_outcome(e.losses), "val loss", fmt=".4f", better="lower",
           paired=True, optional=True, section="Validation loss",
           description=f"mean validation loss of the last {OUTCOME_EPOCHS} epochs, in nats "
                       "per {example}"),
    Metric("final_bits", lambda e: final_bits(e.losses), "final loss", unit="bits",
           fmt=".4f", better="lower", paired=True, optional=True, plot=True,
           section="Validation loss", shown="budget",
           description="validation cross-entropy of the last epoch, at the budget, in bits per "
                       "{example}: what tuning under a compute budget decides on"),
    Metric("test_outcome", test_outcome, "test outcome", unit="%", better="higher",
           paired=True, optional=True, plot=True, priced=True, section="Test split",
           description="test accuracy at the end minus param_cost × the seed parameters "
                       "present then / host parameters: what a comparison without a budget "
                       "judges (the test split is read by nothing that decides anything)"),
    Metric("test_bits", lambda e: None if e.test_loss is None else e.test_loss / math.log(2.0),
           "test loss", unit="bits", fmt=".4f", better="lower", paired=True, optional=True,
           plot=True, section="Test split", shown="bits",
           description="test cross-entropy at the end in bits per {example}: what a "
                       "comparison under a compute budget judges"),
    Metric("accuracy_curve", lambda e: e.accuracies, "validation accuracy", kind="curve",
           unit="%", better="higher", summary=None, plot=True),
    Metric("loss_curve", lambda e: e.losses, "validation loss", kind="curve", better="lower",
           summary=None, optional=True),
    Metric("train_flops_curve", lambda e: tuple(r.train_flops for r in e.reports),
           "training FLOPs", kind="curve", summary=None, optional=True, shown="compute",
           description="cumulative training FLOPs at the end of each epoch"),
    Metric("germinated_curve", germinated_curve, "seeds germinated", kind="curve",
           summary=None, optional=True,
           description="seeds seen so far at the end of each epoch (distinct seed ids): when "
                       "an arm grew (`app.compare.growth`)"),
    Metric("germinated_seeds", germinated_seeds, "seeds in order", kind="seeds", summary=None,
           optional=True, mixed=True, description="slot:blueprint of every seed seen, in the order "
                                      "germinated_curve counts them: which rises grew the host"),
    Metric("seeds_germinated", _events("germinated"), "germinated", dtype=int, summary=None),
    Metric("seeds_fossilized", _events("fossilized"), "fossilized", dtype=int, summary=None),
    Metric("seeds_pruned", _events("pruned"), "pruned", dtype=int, summary=None),
    Metric("wall_seconds", lambda e: e.wall_seconds, "wall time", unit="s", summary=None),
    Metric("final_seeds", lambda e: e.seeds, "seeds at the end", kind="seeds", summary=None,
           optional=True, description="slot:blueprint of every seed present at the end (what "
                                      "matched:NAME implants)"),
)}
#: What a comparison decides on (tuning): the validation outcome, or the validation loss at the
#: budget (`compare.BUDGET_OUTCOME`).
OUTCOME = "outcome"
#: What a comparison's final tables judge, on the test split: without a budget, and under one.
TEST_OUTCOME, TEST_BITS = "test_outcome", "test_bits"
#: The columns that say which episode a row is; the same index pairs controllers.
IDENTITY = ("controller", "episode_index", "episode_rng_seed", "host")
#: The current CSV layout's version, written in every row's ``schema`` column.
SCHEMA_VERSION = 2
#: Headers of the layouts written before the ``schema`` column, by version: 0 has no losses.
LAYOUTS: dict[int, tuple[str, ...]] = {
    0: (*IDENTITY, "outcome", "final_accuracy", "seed_params", "total_params", "episode_return",
        "accuracy_curve", "seeds_germinated", "seeds_fossilized", "seeds_pruned", "wall_seconds"),
}
LAYOUTS[1] = (*LAYOUTS[0], "loss_curve")


def _upgrade_0(row: dict[str, str]) -> dict[str, str]:
    return {**row, "loss_curve": ""}  # no losses were recorded


def _upgrade_1(row: dict[str, str]) -> dict[str, str]:
    try:
        losses = tuple(float(v) for v in row["loss_curve"].split())
    except ValueError:
        raise ValueError(f"bad loss_curve {row['loss_curve']!r}") from None
    val_loss = loss_outcome(losses)
    return {**row, "val_loss": "" if val_loss is None else repr(val_loss)}


#: Version ``v`` to ``v + 1`` of a row. An upgrade only adds columns, so a table of an earlier
#: layout can be appended to in its own columns.
UPGRADES: dict[int, Callable[[dict[str, str]], dict[str, str]]] = {0: _upgrade_0, 1: _upgrade_1}


def fieldnames() -> tuple[str, ...]:
    """The current CSV header: ``schema``, the identity columns, then every metric."""
    return ("schema", *IDENTITY, *METRICS)


#: What a metric's name must look like: it is a CSV column and the stem of JSON keys.
_METRIC_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: Column names a metric cannot take: the schema, the identity, and `app.compare.table`'s
#: column of whole records.
_RESERVED = ("schema", *IDENTITY, "record")


def register_metric(metric: Metric) -> Metric:
    """Add a metric of your own to `METRICS` (after the built-ins) and return it.

    From then on, in this process, every episode a comparison plays records it, ``episodes.csv``
    has its column and the report summarises, pairs and draws it as its `Metric` says. It must
    be ``optional``: the tables written without its column (every comparison so far) still
    read, as missing. Register it wherever a table with its column is read: a process without
    it refuses that column in one line, as it refuses any column it does not know.

    Example::

        register_metric(Metric("seed_share", lambda e: 100 * e.seed_params / e.host_params,
                               "seed share", unit="%", optional=True, paired=True))

    Raises:
        ValueError: not a `Metric`, a name taken or not ``[a-z][a-z0-9_]*``, or not optional
            (one line naming it and what is accepted).
    """
    if not isinstance(metric, Metric):
        raise ValueError(f"register_metric takes a Metric, got {type(metric).__name__}")
    if not isinstance(metric.name, str) or not _METRIC_NAME.fullmatch(metric.name):
        raise ValueError(f"metric name {metric.name!r}: accepted: lower-case letters, digits "
                         "and underscores, starting with a letter")
    if metric.name in METRICS or metric.name in _RESERVED:
        raise ValueError(f"metric name {metric.name!r} is taken; taken: "
                         f"{', '.join((*_RESERVED, *METRICS))}")
    if not metric.optional:
        raise ValueError(f"metric {metric.name!r} must be optional=True, so that tables "
                         "written without its column still read")
    METRICS[metric.name] = metric
    return metric


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished evaluation episode of one controller.

    Attributes:
        controller: controller name (``static``, ``heuristic``, a policy checkpoint's label, ...).
        episode_index: the i-th evaluation episode. The same index means the same host
            initialisation, data order and augmentation for every controller: it pairs them.
        episode_rng_seed: the RNG seed the episode was played with (equal across controllers for
            one index).
        host: host preset name.
        values: every metric of `METRICS` by name (read it as ``record[name]``); a missing
            optional one is None (an empty curve).

    Example::

        record = EpisodeRecord("static", 0, 1234, "baseline", {"outcome": 61.0, ...})
        assert EpisodeRecord.from_row(record.to_row()) == record
    """

    controller: str
    episode_index: int
    episode_rng_seed: int
    host: str
    values: Mapping[str, Value]

    def __post_init__(self) -> None:
        for name in ("controller", "host"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.episode_index < 0:
            raise ValueError(f"episode_index must be >= 0, got {self.episode_index}")
        unknown = [name for name in self.values if name not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
        values = {m.name: m.check(self.values.get(m.name)) for m in METRICS.values()}
        curves = {name: len(v) for name, v in values.items()  # type: ignore[arg-type]
                  if METRICS[name].kind == "curve" and v}
        if len(set(curves.values())) > 1:
            raise ValueError(f"the curves of one episode must be equally long, got {curves}")
        numbers = [x for name, v in values.items()
                   if v is not None and METRICS[name].kind != "seeds"
                   for x in (v if isinstance(v, tuple) else (v,))]
        if not all(math.isfinite(x) for x in numbers):
            raise ValueError(f"non-finite value in the record of {self.controller!r}")
        object.__setattr__(self, "values", values)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @classmethod
    def of_episode(cls, controller: str, episode_index: int, episode_rng_seed: int, host: str,
                   episode: Episode) -> EpisodeRecord:
        """The record of a played episode: every metric read from it."""
        values = {m.name: m.read(episode) for m in METRICS.values()}
        return cls(controller, episode_index, episode_rng_seed, host, values)

    def to_row(self) -> dict[str, str]:
        """A flat CSV row of the current layout (`fieldnames`)."""
        row = {"schema": str(SCHEMA_VERSION), "controller": self.controller,
               "episode_index": str(self.episode_index),
               "episode_rng_seed": str(self.episode_rng_seed), "host": self.host}
        row.update({m.name: m.encode(self.values[m.name]) for m in METRICS.values()})
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> EpisodeRecord:
        """The record of a current-layout row; a metric without a column is missing.

        Raises:
            ValueError: a value that does not parse or a record that does not check.
        """
        identity: dict[str, Any] = {"controller": row["controller"], "host": row["host"]}
        for name in ("episode_index", "episode_rng_seed"):
            try:
                identity[name] = int(row[name])
            except ValueError:
                raise ValueError(f"bad {name} {row[name]!r}") from None
        values = {name: METRICS[name].decode(row[name]) for name in METRICS if name in row}
        return cls(**identity, values=values)


#: The column that says an episode's compute budget (`app.compare.table.by_budget` groups by it).
BUDGET = "budget_flops"


# --- the CSV table ----------------------------------------------------------------------------
def _layout(path: Path, header: Sequence[str] | None) -> int | None:
    """The version of an earlier layout (`LAYOUTS`), None for one with a ``schema`` column.

    Raises:
        ConfigError: a header that is neither, naming the first unknown or missing column.
    """
    names = tuple(header or ())
    for version, columns in LAYOUTS.items():
        if names == columns:
            return version
    required = ("schema", *IDENTITY, *(m.name for m in METRICS.values() if not m.optional))
    current = fieldnames()
    unknown = [name for name in names if name not in current]
    missing = [name for name in required if name not in names]
    if unknown or missing or len(set(names)) != len(names):
        problem = (f"unknown column {unknown[0]!r}" if unknown else
                   f"no column {missing[0]!r}" if missing else "a repeated column")
        raise ConfigError(f"malformed records file {path}: header {list(names)} is not an "
                          f"episode table's ({problem}); accepted: {', '.join(current)}")
    return None


def _row_version(text: str) -> int:
    first = max(LAYOUTS) + 1  # the first layout with a schema column
    version = int(text) if text.isascii() and text.isdigit() else None
    if version is not None and version > SCHEMA_VERSION:
        raise ValueError(f"schema {text} was written by a newer esper-lightning; this one "
                         f"reads up to {SCHEMA_VERSION}")
    if version is None or version < first:
        raise ValueError(f"bad schema {text!r}; accepted: {first} to {SCHEMA_VERSION}")
    return version


def _record_of_row(row: dict[Any, Any], version: int | None) -> EpisodeRecord:
    """The record of a row of any layout: checked, upgraded, parsed."""
    if None in row or None in row.values():
        raise ValueError("row has the wrong number of fields")
    version = _row_version(row["schema"]) if version is None else version
    for step in range(version, SCHEMA_VERSION):
        row = UPGRADES[step](row)
    return EpisodeRecord.from_row(row)


def read_records_csv(path: str | os.PathLike[str]) -> list[EpisodeRecord]:
    """Read a table written by `append_record_csv`, of the current or an earlier layout.

    Raises:
        ConfigError: one line naming the file (and the line) when it is not an episode table,
            is cut short, or a row does not parse.

    Example::

        records = read_records_csv("compare/episodes.csv")
    """
    path = Path(path)
    records = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            version = _layout(path, reader.fieldnames)
            for row in reader:
                try:
                    records.append(_record_of_row(row, version))
                except ValueError as err:
                    raise ConfigError(
                        f"malformed records file {path}: line {reader.line_num}: {err}"
                    ) from None
        except (csv.Error, UnicodeDecodeError) as err:
            raise ConfigError(f"malformed records file {path}: {err}") from None
    return records


def _add_columns(path: Path, columns: Sequence[str]) -> None:
    """Rewrite a current-layout table with ``columns`` (its own and new ones, empty in its
    rows), atomically: a crash leaves the old file or the new one, never half of either."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = []
        for row in reader:
            if None in row or None in row.values():
                raise ConfigError(f"malformed records file {path}: line {reader.line_num}: "
                                  "row has the wrong number of fields")
            rows.append(row)
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", restval="")
            writer.writeheader()
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself reaches the disk
        os.fsync(folder)
    finally:
        os.close(folder)


def append_record_csv(path: str | os.PathLike[str], record: EpisodeRecord) -> None:
    """Append one record (header first when the file is new or empty), flushed to disk so the
    episodes finished before a crash are kept. A table written before a ``mixed`` metric
    existed gains its column first (empty in its earlier rows: not recorded); otherwise a
    table of an earlier layout, or one written before an optional metric existed, keeps its
    columns (the record's others are left out), so it resumes where it stopped.

    Raises:
        ConfigError: the existing file is not an episode table.

    Example::

        append_record_csv("compare/episodes.csv", record)
    """
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    columns: Sequence[str] = fieldnames()
    if not new:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
        columns = tuple(header or ())
        if _layout(path, header) is None:
            added = [m.name for m in METRICS.values() if m.mixed and m.name not in columns]
            if added:
                columns = (*columns, *added)
                _add_columns(path, columns)
    row = record.to_row()
    if any(name not in row for name in columns):  # an upgrade that removed a column
        raise RuntimeError(f"cannot append to {path}: its columns {list(columns)} are not all "
                           "current ones")
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n",
                                extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())
