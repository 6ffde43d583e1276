"""Running a frontier study: a plan's units on worker processes, resumably.

A study is a folder holding its plan (``plan.json``, see `plan`) and its rows (``rows.csv``, one
per arm, rate, episode and budget, and one per long run; `train.ROW_FIELDS`). Rows written
before phase rates existed lack the last four columns, rows written before curves the last three
(``schedule``, ``curve``, ``curve_flops``; `ROW_FORMATS`); they are read with those columns
empty (one rate, the frontier's schedule, no curve), and a study keeps its columns until a row
that fills a newer one joins it (the file is then rewritten whole in the first format that holds
it). A curve is written as JSON, ``[[FLOPs, tokens, nats], ...]``. `run_study` trains the units
whose rows
are missing, a whole unit at a time on each of ``workers`` processes (one thread each; on the
CPU, or all on one CUDA device, which several processes keep busy where one run of these small
models waits on kernel launches), and appends a unit's rows as soon as it is done: an
interrupted study loses at most the units in flight and resumes where it stopped. A unit's rows
depend only on the unit (its arm, rate, episode rng seed and budgets), never on the worker, the
order or what ran before, so a study played in pieces equals one played at once. A progress bar
counts units and their FLOPs."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from tqdm import tqdm

from esper_lightning.app.frontier.plan import Plan, Unit, rate_text, read_plan, row_rate
from esper_lightning.data.locate import check_text_size, find_text_file
from esper_lightning.errors import ConfigError

__all__ = ["PLAN_FILE", "ROWS_FILE", "ROW_FORMATS", "check_device", "pending_units", "read_rows",
           "read_study", "run_study"]

PLAN_FILE = "plan.json"
ROWS_FILE = "rows.csv"
#: The columns a rows file may have, oldest first: before phase rates, before curves, today's
#: (`train.ROW_FIELDS`; each format the first columns of the next).
ROW_FORMATS = (16, 17, 20)


def _formats() -> list[tuple[str, ...]]:
    from esper_lightning.app.frontier.train import ROW_FIELDS

    return [ROW_FIELDS[:n] for n in ROW_FORMATS]


def read_rows(folder: str | Path) -> list[dict[str, Any]]:
    """The study's rows, numbers as numbers, a curve as a tuple of ``(FLOPs, tokens, nats)``,
    a column the file lacks as None (an empty list before the first unit is done)."""
    from esper_lightning.app.frontier.train import ROW_FIELDS

    path = Path(folder) / ROWS_FILE
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or tuple(reader.fieldnames) not in _formats():
            raise ConfigError(f"'{path}' has columns {reader.fieldnames}; expected "
                              f"{', '.join(ROW_FIELDS)} (or its first "
                              f"{' or '.join(map(str, ROW_FORMATS[:-1]))})")
        return [{**dict.fromkeys(ROW_FIELDS), **{k: _number(k, v) for k, v in row.items()}}
                for row in reader]


def read_study(folder: str | Path) -> tuple[Plan, list[dict[str, Any]]]:
    """The study's plan and rows (`read_rows`), for what reads a study that has run.

    Raises:
        ConfigError: A bad or missing plan, or no rows yet.
    """
    plan, rows = read_plan(Path(folder) / PLAN_FILE), read_rows(folder)
    if not rows:
        raise ConfigError(f"'{folder}' has no rows yet; run it first")
    return plan, rows


def _number(key: str, value: str) -> Any:
    from esper_lightning.app.frontier.train import PHASE_SEPARATOR

    if key in ("arm", "text_sha256"):
        return value
    if value == "":
        return None
    if key == "schedule":
        return value
    if key == "curve":
        return tuple((float(f), int(t), float(n)) for f, t, n in json.loads(value))
    if key == "lr_phases":
        return tuple(float(v) for v in value.split(PHASE_SEPARATOR))
    return int(value) if key in ("episode", "rng_seed", "steps", "params", "final_depth",
                                 "tokens") else float(value)


def pending_units(plan: Plan, rows: list[dict[str, Any]]) -> list[Unit]:
    """The units of ``plan`` whose rows are not all in ``rows`` (a long run's row is its
    unit's alone: its budget is also a budget of the frontier's runs)."""
    done: dict[tuple[Any, ...], set[float]] = {}
    for row in rows:
        done.setdefault((row["arm"], row_rate(row), row["episode"], row.get("schedule")),
                        set()).add(row["budget_flops"])
    return [u for u in plan.units()
            if not set(u.budgets) <= done.get((*u.key, u.schedule), set())]


def run_study(folder: str | Path, text: str | Path, workers: int = 1,
              progress: bool = True, device: str = "cpu") -> list[dict[str, Any]]:
    """Train every pending unit of the study in ``folder`` on ``device`` and return all its
    rows. A row does not depend on the worker or the order; on a GPU it differs from the CPU's
    in the last bits (other kernels), so a study's episodes are best played on one device.

    Raises:
        ConfigError: A bad plan, rows from another text (their SHA-256 differs), ``workers``
            below 1, or a device this machine does not have.
        DataError: no text file or folder holding one at ``text`` (`find_text_file`), or one
            too short for a block of the plan's ``block_size`` in each split.
    """
    folder = Path(folder)
    plan = read_plan(folder / PLAN_FILE)
    # Before the training's imports load torch: a wrong path or a text too short at once.
    check_text_size(find_text_file(text, downloadable=False), plan.shape.block_size)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    check_device(device)
    rows = read_rows(folder)
    todo = pending_units(plan, rows)
    if not todo:
        return rows
    from esper_lightning.app.frontier.train import load_corpus
    from esper_lightning.blueprints.growth import operators

    unknown = [a.spec for a in plan.arms if a.spec.operator not in (None, *operators())]
    if unknown:
        raise ConfigError(f"arm {unknown[0].name!r}: unknown growth operator "
                          f"{unknown[0].operator!r}; accepted: {', '.join(operators())}")
    sha = load_corpus(text, plan.shape, ()).sha256
    other = {r["text_sha256"] for r in rows} - {sha}
    if other:
        raise ConfigError(f"'{folder / ROWS_FILE}' was trained on another text (SHA-256 "
                          f"{sorted(other)[0][:12]}...); pass the text it was trained on")
    flops = sum(unit_flops(u, plan) for u in todo)
    bar = tqdm(total=flops / 1e12, unit="TFLOP", desc=plan.name, disable=not progress,
               bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} [{elapsed}<{remaining}]")
    for unit, new in _play(todo, plan, text, workers, device):
        _append(folder / ROWS_FILE, new)
        rows.extend(new)
        bar.update(unit_flops(unit, plan) / 1e12)
        bar.set_postfix_str(f"{unit.arm.name} lr {rate_text(unit.rate)} episode "
                            f"{unit.episode}")
    bar.close()
    return rows


def unit_flops(unit: Unit, plan: Plan) -> float:
    """The training FLOPs a unit spends (what the progress bar counts): a branching unit trains
    its largest budget and the decay of each smaller one, any other every budget in full."""
    if not unit.arm.branches:
        return sum(unit.budgets)
    return max(unit.budgets) + plan.decay_fraction * (sum(unit.budgets) - max(unit.budgets))


def check_device(device: str) -> None:
    """Refuse, in one line, a device name that is not ``cpu``, ``cuda`` or ``cuda:N``, or a
    CUDA device this machine does not have."""
    from esper_lightning.app.config.task import check_devices

    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise ConfigError(f"device {device!r} is not accepted; accepted: cpu, cuda, cuda:N")
    check_devices((device,))


def _play(todo: list[Unit], plan: Plan, text: str | Path, workers: int,
          device: str) -> Iterator[tuple[Unit, list[dict[str, Any]]]]:
    """Each unit with its rows, as units finish (in order with one worker)."""
    if workers == 1:
        _init_worker(plan, text, device)
        for unit in todo:
            yield unit, _train(unit)
        return
    context = multiprocessing.get_context("spawn")  # no forked torch state
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(plan, text, device)) as pool:
        queue = list(todo)
        running: dict[Future[list[dict[str, Any]]], Unit] = {}
        while queue or running:
            while queue and len(running) < workers:
                unit = queue.pop(0)
                running[pool.submit(_train, unit)] = unit
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                yield running.pop(future), future.result()


_WORKER: dict[str, Any] = {}


def _init_worker(plan: Plan, text: str | Path, device: str) -> None:
    """One thread per worker (a second intra-op thread buys nothing at these sizes and slows a
    shared machine), the corpus read once onto ``device``."""
    import torch

    from esper_lightning.app.frontier.train import load_corpus
    from esper_lightning.core.flops import FlopMeter

    torch.set_num_threads(1)
    _WORKER.update(plan=plan, corpus=load_corpus(text, plan.shape, plan.splits, device),
                   meter=FlopMeter())


def _train(unit: Unit) -> list[dict[str, Any]]:
    from esper_lightning.app.frontier.train import train_unit

    return train_unit(unit, _WORKER["plan"], _WORKER["corpus"], _WORKER["meter"])


def _written(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as its cells are written: phase rates joined, a curve as JSON."""
    from esper_lightning.app.frontier.train import PHASE_SEPARATOR

    return {**row, "lr_phases": PHASE_SEPARATOR.join(map(str, row["lr_phases"]))
            if row.get("lr_phases") else None,
            "curve": json.dumps([list(p) for p in row["curve"]]) if row.get("curve") else None}


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` (with the header for a new file) and flush them to disk. A file of older
    columns (`ROW_FORMATS`) keeps them while the new rows leave the newer columns empty, and is
    rewritten whole (atomically) in the first format that holds every filled column when one
    does not."""
    from esper_lightning.app.frontier.train import ROW_FIELDS

    rows = [_written(row) for row in rows]
    new = not path.is_file()
    fields = ROW_FIELDS
    if not new:
        with path.open(newline="") as handle:
            header = tuple(next(csv.reader(handle), ()))
        filled = {k for row in rows for k, v in row.items() if v not in (None, "")}
        fields = next((f for f in _formats() if len(f) >= len(header) and filled <= set(f)),
                      ROW_FIELDS)
        if fields != header:
            _upgrade(path, fields)
    with path.open("a", newline="") as handle:
        # Older columns drop only the newer ones, empty in every row written under them.
        writer = csv.DictWriter(handle, fieldnames=fields,
                                extrasaction="raise" if fields == ROW_FIELDS else "ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
        handle.flush()
        os.fsync(handle.fileno())


def _upgrade(path: Path, fields: tuple[str, ...]) -> None:
    """Rewrite a rows file of older columns with ``fields`` (the new columns empty: every old
    row trained at one rate on the frontier's schedule, without a curve), through a temporary
    file so an interruption loses nothing."""
    with path.open(newline="") as handle:
        old = list(csv.DictReader(handle))
    temporary = path.with_suffix(".csv.tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(old)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
